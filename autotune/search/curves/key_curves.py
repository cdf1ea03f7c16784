"""A key's estimated memory curves, kept in its study.

Each estimate the fast search asks for (peak bytes at one batch size) is stored as a study
attribute as soon as it is computed, so a resumed run does not recompute it and the
dashboard's plot (``autotune.search.dashboard``) draws the curve the search saw.
``search_curves`` builds a key's curves from at most ``MAX_PASSES`` estimator passes: the
training curve from one trace (``autotune.probe.replay``), the sliding window from the passes
left (``autotune.search.curves.sparse``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["estimates_attr", "stored_estimates", "KeyCurves", "search_curves"]


def estimates_attr(phase: str, point: dict[str, Any] | None = None) -> str:
    """The study attribute holding raw estimates of ``phase`` (infer: per volume place; the training
    batch does not change validation's peak, so it is not part of the name)."""
    if phase == "train":
        return "estimates:train"
    point = point or {}
    return f"estimates:infer:vd={point.get('validation_device')}"


def stored_estimates(study: Any, name: str) -> dict[int, int]:
    """Raw estimates stored under ``name`` (n -> bytes)."""
    return {int(n): int(v) for n, v in (study.user_attrs.get(name) or {}).items()}


def _store(study: Any, name: str) -> Callable[[int, int], None]:
    def store(n: int, raw: int) -> None:
        _store_many(study, name, {n: raw})

    return store


def _store_many(study: Any, name: str, values: dict[int, int]) -> None:
    known = stored_estimates(study, name)
    known.update({int(n): int(v) for n, v in values.items()})
    study.set_user_attr(name, {str(k): v for k, v in sorted(known.items())})


@dataclass
class KeyCurves:
    """A key's estimated curves for ``run_fast``, from at most ``MAX_PASSES`` estimator passes in all.

    ``train``: the training curve (or None: bisection); ``infer_for(n, validation_device)``: the
    sliding-window curve, made when the training search is done, with the passes left.
    """

    train: Any
    infer_for: Callable[[int, str], Any]
    train_passes: int
    infer_curves: list[Any] = field(default_factory=list)

    def passes(self) -> dict[str, int]:
        """Estimator passes spent, by the phase they were spent for (stored estimates cost none)."""
        from autotune.search.curves.sparse import passes_of

        return {"train": self.train_passes, "infer": sum(passes_of(c) for c in self.infer_curves)}


def search_curves(study: Any, prober: Any, patches_range: tuple[int, int], sw_range: tuple[int, int],
                  validation_device: str) -> KeyCurves:
    """The curves of one key, backed by ``study``: the estimator traces training once (at a marker
    batch, ``autotune.probe.replay``) and, in the same pass, validation at the top of the sliding-window
    range on ``validation_device``; the exact training curve over ``patches_range`` is stored for the
    dashboard and a resumed search. Where the trace does not replay, training is estimated point by
    point (``autotune.search.curves.sparse``). Inference curves get the passes left of ``MAX_PASSES``."""
    from autotune.search.curves.sparse import MAX_PASSES, passes_of
    from autotune.step import num_windows

    lo, hi = (int(v) for v in patches_range)
    name = estimates_attr("train")
    known = stored_estimates(study, name)
    sw_top = max(int(sw_range[0]), min(int(sw_range[1]), num_windows(prober.config())))
    infer_attr = estimates_attr("infer", {"validation_device": validation_device})
    if all(n in known for n in range(lo, hi + 1)):  # a resumed search: the curve is in the study
        train = prober.memory_curve("train", {}, known, _store(study, name), max_passes=0)
        train_passes = 0
    else:
        fold = sw_top not in stored_estimates(study, infer_attr)
        train, infer_raw = prober.training_replay(
            {"num_sw_batch_size": sw_top, "validation_device": validation_device} if fold else None)
        train_passes = 1
        if infer_raw is not None:
            _store_many(study, infer_attr, {sw_top: infer_raw})
        if train is not None:
            from autotune.search.curves.edge import raw_of

            _store_many(study, name, raw_of(train).as_dict(lo, hi))
        else:
            train = prober.memory_curve("train", {}, known, _store(study, name), max_passes=MAX_PASSES - 1)
            train_passes += passes_of(train)
    curves = KeyCurves(train, lambda n, vd: None, train_passes)

    def infer_for(n: int, vd: str) -> Any:
        attr = estimates_attr("infer", {"validation_device": vd})
        left = MAX_PASSES - sum(curves.passes().values())
        curve = prober.memory_curve("infer", {"num_patches_per_iter": n, "validation_device": vd},
                                    stored_estimates(study, attr), _store(study, attr), max_passes=left)
        curves.infer_curves.append(curve)
        return curve

    curves.infer_for = infer_for
    return curves
