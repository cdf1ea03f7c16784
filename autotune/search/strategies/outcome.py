"""What a strategy found: ``SearchOutcome``, and the search space as Optuna distributions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune.search.strategies.record import Evaluation
from autotune.tunables import TUNABLES

__all__ = ["SearchOutcome", "distributions"]


@dataclass
class SearchOutcome:
    """What a strategy found: each tunable's answer by name (``values``, keyed by ``autotune.tunables``; a
    tunable left out or None was not decided), the largest batch that fits, the evaluations that chose them,
    and every evaluation. Today's tunables read as attributes (``outcome.num_patches_per_iter``);
    ``value(name)`` reads any."""

    values: Mapping[str, Any]
    max_num_patches_per_iter: int | None
    train: Evaluation | None
    infer: Evaluation | None
    evaluations: list[Evaluation] = field(default_factory=list)

    @classmethod
    def nothing(cls, evaluations: list[Evaluation]) -> SearchOutcome:
        """No answer: not even the smallest batch fits."""
        return cls({}, None, None, None, evaluations)

    @classmethod
    def of_points(cls, max_num_patches_per_iter: int | None, train: Evaluation | None, infer: Evaluation | None,
                  evaluations: list[Evaluation]) -> SearchOutcome:
        """The answer read from the chosen evaluations' points: each tunable from the point of the phase that
        measures it (``Tunable.phase``), the training point's where the inference one lacks it."""
        chosen = {"train": train, "infer": infer}
        values: dict[str, Any] = {}
        for t in TUNABLES:
            for evaluation in (chosen[t.phase], train, infer):
                if evaluation is not None and evaluation.point.get(t.name) is not None:
                    values[t.name] = evaluation.point[t.name]
                    break
        return cls(values, max_num_patches_per_iter, train, infer, evaluations)

    def value(self, name: str) -> Any:
        """The answer for the tunable ``name`` (None when undecided)."""
        return self.values.get(name)

    @property
    def num_patches_per_iter(self) -> int | None:
        """The chosen patches per forward pass (None: nothing fits)."""
        return self.value("num_patches_per_iter")

    @property
    def num_sw_batch_size(self) -> int | None:
        """The chosen sliding-window batch (None: none fits)."""
        return self.value("num_sw_batch_size")

    @property
    def validation_device(self) -> str | None:
        """Where the validation volume lives, ``device`` or ``cpu`` (None: undecided)."""
        return self.value("validation_device")


def distributions(spec: Any, validation_devices: tuple[str, ...]) -> Mapping[str, Any]:
    """Optuna distributions of the search space (for trials and the dashboard)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    return {t.name: CategoricalDistribution(list(validation_devices)) if t.kind == "choice"
            else IntDistribution(*spec.space_of(t)) for t in TUNABLES}
