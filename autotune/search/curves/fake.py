"""Test hook: probes answered by a synthetic model after a sleep, in place of the device.

For tests and benchmarks of many workers, where the storage and the coordination are measured, not
the device: ``AUTOTUNE_FAKE_PROBE="sleep=SECONDS,base=BYTES,patch=BYTES,window=BYTES"`` makes every
probe of a tuning run sleep ``sleep`` seconds and answer

- training at N patches per iteration: peak ``base + patch * N``, ``samples_per_s = N / (0.1 + 0.02 N)``;
- validation at sliding-window batch S: peak ``base + window * S``, ``sw_seconds_per_volume = 0.5 / S + 0.05``;
- status ``oom`` when the peak is above the memory limit, else ``ok`` (the search then compares the
  peak with its budget, as for a real probe).

No probe child is started and the estimator is not asked (the fast search bisects), so a point costs
the sleep and the storage's work. Byte sizes take the units of ``--memory-limit`` (``64MiB``).
Nothing but this variable turns it on; every trial it answers says ``kind: fake`` in its attributes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.checks.fake_probe import FAKE_PROBE_ENV, FakeModel, parse_fake_probe

if TYPE_CHECKING:
    from autotune.bundles.model import BundleConfig

__all__ = ["FAKE_PROBE_ENV", "FakeModel", "FakeProber", "parse_fake_probe"]


class FakeProber:
    """A prober that sleeps, then answers from a ``FakeModel`` (``Prober``'s interface; no estimator curves)."""

    measured = True
    kind = "fake"

    def __init__(self, model: FakeModel, memory_limit: int, config: BundleConfig) -> None:
        self.model = model
        self.memory_limit = int(memory_limit)
        self._config = config

    def probe(self, point: Mapping[str, Any], phases: tuple[str, ...]) -> dict[str, Any]:
        model = self.model
        time.sleep(model.sleep)
        result: dict[str, Any] = {"measured": True, "seconds": model.sleep}
        if "train" in phases:
            n = int(point.get("num_patches_per_iter") or 1)
            result["train_peak_bytes"] = model.base + model.patch * n
            result["samples_per_s"] = n / (0.1 + 0.02 * n)
            result["step_seconds_median"] = n / result["samples_per_s"]
        if "infer" in phases:
            sw = int(point.get("num_sw_batch_size") or 1)
            result["infer_peak_bytes"] = model.base + model.window * sw
            result["sw_seconds_per_volume"] = 0.5 / sw + 0.05
        result["peak_bytes"] = max(v for k, v in result.items() if k.endswith("_peak_bytes"))
        result["status"] = "oom" if result["peak_bytes"] > self.memory_limit else "ok"
        return result

    def training_replay(self, infer_point: Mapping[str, Any] | None = None) -> tuple[Any, int | None]:
        return None, None

    def memory_curve(self, phase: str, point: Mapping[str, Any], known: Mapping[int, float] | None = None,
                     on_estimate: Any = None, max_passes: int | None = None) -> Any:
        return None

    def config(self) -> BundleConfig:
        return self._config
