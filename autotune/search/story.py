"""The estimator's curves of a key's study, kept in the study itself.

Each estimate the fast search asks for (peak bytes at one batch size) is stored as a
study attribute as soon as it is computed, so a resumed run does not recompute it and
the dashboard's plot can draw the curve the search saw.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["estimates_attr", "stored_estimates", "search_curves"]


def estimates_attr(phase: str, point: dict[str, Any] | None = None) -> str:
    """The study attribute holding raw estimates of ``phase`` (infer: per training batch and volume place)."""
    if phase == "train":
        return "estimates:train"
    point = point or {}
    return f"estimates:infer:n={point.get('num_patches_per_iter')}:vd={point.get('validation_device')}"


def stored_estimates(study: Any, name: str) -> dict[int, int]:
    """Raw estimates stored under ``name`` (n -> bytes)."""
    return {int(n): int(v) for n, v in (study.user_attrs.get(name) or {}).items()}


def _store(study: Any, name: str) -> Callable[[int, int], None]:
    def store(n: int, raw: int) -> None:
        known = stored_estimates(study, name)
        known[int(n)] = int(raw)
        study.set_user_attr(name, {str(k): v for k, v in sorted(known.items())})

    return store


def search_curves(study: Any, prober: Any) -> tuple[Any, Callable[[int, str], Any]]:
    """The training curve and a factory of sliding-window curves for ``run_fast``, backed by ``study``."""
    name = estimates_attr("train")
    train = prober.memory_curve("train", {}, stored_estimates(study, name), _store(study, name))

    def infer_for(n: int, validation_device: str) -> Any:
        point = {"num_patches_per_iter": n, "validation_device": validation_device}
        attr = estimates_attr("infer", point)
        return prober.memory_curve("infer", point, stored_estimates(study, attr), _store(study, attr))

    return train, infer_for
