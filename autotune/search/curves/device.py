"""Curves in device bytes from the device model (``autotune.probe.device_model``): what the CUDA
allocator would reserve at each batch size, where a calibration gives the workspace factors.

``DeviceCurve`` simulates the allocator on the training trace replayed at each N
(``autotune.probe.replay.TrainingReplay.events_at``): exact to the model at every N, a few
hundredths of a second a point, cached. ``RatioCurve`` is for what is read from a few point
estimates (the sliding window): the estimator's raw curve times the model's ratio of device to raw
bytes at the nearest point the model simulated. Both are ``CorrectedCurve``s, so ``raw_of`` finds
the estimator's own curve under them and a real probe's correction (``correct``) wraps them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune.search.curves.edge import CorrectedCurve

__all__ = ["DeviceCurve", "RatioCurve"]


@dataclass
class DeviceCurve(CorrectedCurve):
    """Training's reserved peak at n by the device model (``base``: a ``TrainingReplay``)."""

    factors: Mapping[str, float] = field(default_factory=dict)
    release: bool = True
    expandable: bool = False
    _cache: dict[int, float] = field(default_factory=dict, repr=False)

    def predict(self, n: int) -> float:
        from autotune.probe import predict_reserved

        n = int(n)
        if n not in self._cache:
            figures = predict_reserved(self.base.events_at(n), None, self.factors, release=self.release,
                                       expandable=self.expandable)
            self._cache[n] = float(figures["train"]["reserved"])
        return self._cache[n]


@dataclass
class RatioCurve(CorrectedCurve):
    """``base`` (raw estimates) times the device model's device-to-raw ratio at the nearest n in ``ratios``;
    ``scale * raw + offset`` (the affine allowance) until a ratio is known."""

    ratios: dict[int, float] = field(default_factory=dict)

    def predict(self, n: int) -> float:
        raw = self.base.predict(n)
        if not self.ratios:
            return self.scale * raw + self.offset
        nearest = min(self.ratios, key=lambda x: (abs(x - int(n)), -x))
        return raw * self.ratios[nearest]


def ratio_of(result: Mapping[str, Any], phase: str) -> float | None:
    """Device over raw bytes of one phase of an ``estimate_on_device`` result (None when either is missing)."""
    raw, device = result.get(f"{phase}_peak_bytes"), result.get(f"{phase}_device_reserved_bytes")
    return float(device) / float(raw) if raw and device else None
