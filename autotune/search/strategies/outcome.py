"""What a strategy found: ``SearchOutcome``, and the search space as Optuna distributions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotune.search.strategies.evaluate import Evaluation
from autotune.tunables import TUNABLES

__all__ = ["SearchOutcome", "distributions"]


@dataclass
class SearchOutcome:
    """What a strategy found: the chosen batch (and the largest that fits), the sliding-window batch
    and where the validation volume lives, the evaluations that chose them, and every evaluation."""

    num_patches_per_iter: int | None
    max_num_patches_per_iter: int | None
    num_sw_batch_size: int | None
    validation_device: str | None
    train: Evaluation | None
    infer: Evaluation | None
    evaluations: list[Evaluation]


def distributions(spec: Any, validation_devices: tuple[str, ...]) -> Mapping[str, Any]:
    """Optuna distributions of the search space (for trials and the dashboard)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    return {t.name: CategoricalDistribution(list(validation_devices)) if t.kind == "choice"
            else IntDistribution(*spec.space_of(t)) for t in TUNABLES}
