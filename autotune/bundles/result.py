"""What tuning one key found, as one typed object: ``TuningResult``.

The search (``autotune.search.driver.strategy_run``) makes one from its strategy's outcome; the hand-off
(``autotune.search.handoff.apply_handoff``) returns it with the batch training gets; the key's study keeps it, the
summary shows it and the write-back (``autotune.bundles.config.write_result``) writes it into the bundle. It
holds the ``Point`` (each tunable's answer: the batch handed to training, the sliding-window batch, where
validation lives as ``autotune.tunables.ValidationDevice``), the largest batch that fits, the peaks and timings
of the chosen points, and the provenance (where, how and under what limit it was searched; the hand-off's and the
batch's reports for people).

It has one serialisation, ``as_record`` (plain data keyed as the ``tuning:`` block is: the study's stored result,
the summary's row), read back by ``from_record`` (a stored result written by an earlier autotune included); the
bundle's ``tuning:`` block is that record with the hand-off's recipe (``autotune.bundles.plan.TuningPlan
.from_result``). The bundle states each tuned value once, in its template's keys
(``autotune.tunables.written_values``); the block beside them is provenance, read only to report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from autotune.tunables import BATCH, SW_BATCH, TUNABLES, VALIDATION_DEVICE, Point, ValidationDevice

__all__ = ["TuningResult", "STATUSES"]

#: ``tuned``: a point fits; ``infeasible``: nothing fits (``reason``); ``unsupported``: the template is not tuned
STATUSES = ("tuned", "infeasible", "unsupported")
#: the typed fields besides the point, in the order a record holds them
_MEASURED = ("max_num_patches_per_iter", "peak_bytes", "train_peak_bytes", "infer_peak_bytes", "samples_per_s",
             "sw_seconds_per_volume")
#: a record's key that an earlier autotune wrote beside ``validation_device`` (the same value as a flag)
_LEGACY_FLAG = "sw_input_on_cpu"


@dataclass(frozen=True)
class TuningResult:
    """One key's tuning result (see the module docstring).

    Attributes:
        status: ``tuned``, ``infeasible`` or ``unsupported`` (``STATUSES``); ``reason`` says why not tuned.
        point: each tunable's answer by name (``autotune.tunables.Point``; empty when not tuned).
        max_num_patches_per_iter: the largest batch that fits (the hand-off may give training less).
        peak_bytes, train_peak_bytes, infer_peak_bytes: the peaks of the chosen points (measured, or estimated).
        samples_per_s: training's throughput at the handed batch; ``sw_seconds_per_volume`` validation's time.
        from_storage: answered from the key's study with no new trial.
        provenance: the rest, as the ``tuning:`` block names it (``algo``, ``method``, ``strategy``,
            ``objective``, ``memory_limit``, ``device``, the trials and studies, ``handoff``, ``batch``, ``key``,
            ...; docs/tuning.md): read-only.
    """

    status: str
    point: Point = field(default_factory=Point)
    max_num_patches_per_iter: int | None = None
    peak_bytes: int | None = None
    train_peak_bytes: int | None = None
    infer_peak_bytes: int | None = None
    samples_per_s: float | None = None
    sw_seconds_per_volume: float | None = None
    reason: str | None = None
    from_storage: bool = False
    provenance: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {self.status!r}")
        if not isinstance(self.provenance, MappingProxyType):
            object.__setattr__(self, "provenance", MappingProxyType(dict(self.provenance)))

    @property
    def tuned(self) -> bool:
        """A point fits: the result is written into the bundle."""
        return self.status == "tuned"

    @property
    def num_patches_per_iter(self) -> int | None:
        """Patches per forward pass handed to training (None: not tuned)."""
        held = self.point.get(BATCH.name)
        return None if held is None else int(held)

    @property
    def num_sw_batch_size(self) -> int | None:
        """The sliding-window batch (None: not tuned)."""
        held = self.point.get(SW_BATCH.name)
        return None if held is None else int(held)

    @property
    def validation_device(self) -> ValidationDevice | None:
        """Where the validation volume lives (None: not tuned)."""
        return self.point.validation_device

    @property
    def algo(self) -> str | None:
        return self.provenance.get("algo")

    @property
    def handoff(self) -> Mapping[str, Any]:
        """The hand-off's verdict (``autotune.search.handoff``; empty before it)."""
        return self.provenance.get("handoff") or {}

    @property
    def handoff_rule(self) -> str:
        """``goodput`` or ``largest``: how training's batch was chosen from the largest fit."""
        return str(self.handoff.get("rule") or "goodput")

    @property
    def train_trial(self) -> int | None:
        """The trial that measured training at the handed batch."""
        return self.provenance.get("train_trial")

    def replace(self, **changes: Any) -> TuningResult:
        """A copy with ``changes``: this class's fields by name, a tunable's answer by its name (into ``point``),
        any other name into ``provenance``."""
        names = {f.name for f in dataclasses.fields(self)}
        own = {k: v for k, v in changes.items() if k in names}
        answers = {k: v for k, v in changes.items() if k in {t.name for t in TUNABLES}}
        told = {k: v for k, v in changes.items() if k not in names and k not in answers}
        if answers:
            own["point"] = own.get("point", self.point).with_values(**answers)
        if told:
            own["provenance"] = {**self.provenance, **told}
        return dataclasses.replace(self, **own)

    def as_record(self) -> dict[str, Any]:
        """The result as plain data, keyed as the ``tuning:`` block is (``status``, each tunable, the
        measurements, ``reason``, the provenance, ``from_storage``): the one serialisation, for the key's study,
        the summary and the block. A tuned result holds every measured key (None where not measured)."""
        from autotune.utils import plain_data

        out: dict[str, Any] = {"status": self.status}
        if self.tuned:
            out.update({t.name: self.point.get(t.name) for t in TUNABLES if self.point.get(t.name) is not None})
            out.update({name: getattr(self, name) for name in _MEASURED})
        else:
            out.update(self.point.as_dict())
            out.update({name: getattr(self, name) for name in _MEASURED if getattr(self, name) is not None})
        if self.reason is not None:
            out["reason"] = self.reason
        out.update({k: v for k, v in self.provenance.items() if k not in out})
        out["from_storage"] = self.from_storage
        return plain_data(out)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> TuningResult:
        """The result a record holds (``as_record``'s, or one an earlier autotune stored: a record without
        ``validation_device`` reads it from the flag ``sw_input_on_cpu`` it held instead).

        Raises:
            ValueError: an unknown ``status`` or validation device.
        """
        rest = dict(record)
        flag = rest.pop(_LEGACY_FLAG, None)
        point = Point.taken_from(rest)
        if point.get(BATCH.name) is not None and point.validation_device is None and flag is not None:
            point = point.with_values(**{VALIDATION_DEVICE.name: ValidationDevice.of_flag(bool(flag))})
        for t in TUNABLES:
            rest.pop(t.name, None)
        typed = {name: rest.pop(name, None) for name in _MEASURED}
        return cls(status=str(rest.pop("status", "tuned")), point=point, reason=rest.pop("reason", None),
                   from_storage=bool(rest.pop("from_storage", False)), provenance=rest, **typed)
