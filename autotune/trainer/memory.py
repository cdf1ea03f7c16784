"""Training keeps the memory limit the tuner tuned for, and reports what it used.

``training_limit`` decides the limit (the one given, else the tuning block's on the tuned
device). ``PhaseMemory`` enforces it as the probe does (the CUDA allocator's per-process
fraction; on the CPU tracked tensor bytes with a ``MemoryTracker`` that stops at the limit)
and reads each phase's peak: ``max_memory_reserved``/``max_memory_allocated`` on CUDA, the
tracked peak on the CPU under a limit (None on the CPU without one).
"""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING, Any

from autotune.utils import format_bytes, parse_bytes

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

__all__ = ["PhaseMemory", "training_limit", "out_of_memory_error", "alloc_conf_warning"]


def training_limit(config: BundleConfig, device: str, memory_limit: int | str | None) -> int | None:
    """The limit training keeps: the one given, else the tuning block's when training on the tuned
    device. A limit or device other than the tuned ones gets one warning line naming both."""
    plan = config.plan
    limit = None if memory_limit is None else parse_bytes(memory_limit, "--memory-limit")
    if plan is None:
        return limit
    if plan.method == "measured" and plan.device != str(device):
        print(f"warning: {config.bundle_root} was tuned on {plan.device} ({plan.device_name}) "
              f"but trains on {device}: the tuned values may not fit; run 'autotune tune' on {device}",
              file=sys.stderr)
    elif limit is None and plan.device == str(device):
        limit = plan.memory_limit
    elif limit is not None and plan.memory_limit != limit:
        print(f"warning: training under --memory-limit {format_bytes(limit)}, but the bundle was tuned for "
              f"{format_bytes(plan.memory_limit)}", file=sys.stderr)
    alloc_conf_warning(plan, str(device))
    return limit


def alloc_conf_warning(plan: Any, device: str) -> str | None:
    """One warning line (printed, and returned) when a CUDA run's allocator setting differs from the one the
    bundle was tuned under (``autotune.cuda_alloc``: the memory contract is one setting everywhere)."""
    from autotune.cuda_alloc import ALLOC_CONF_ENV, alloc_conf, differs

    if plan is None or not device.startswith("cuda") or not str(plan.device or "").startswith("cuda"):
        return None
    now = alloc_conf()
    if not differs(plan.alloc_conf, now):
        return None
    line = (f"warning: tuned under {ALLOC_CONF_ENV}={plan.alloc_conf or '(unset)'} but running under "
            f"{ALLOC_CONF_ENV}={now or '(unset)'}: the peaks may differ from the tuned ones; set it as the tune had it")
    print(line, file=sys.stderr)
    return line


def out_of_memory_error(exc: BaseException, config: BundleConfig, limit: int | None, phase: str, epoch: int,
                        then: str) -> Exception | None:
    """``TrainingOutOfMemory`` (one line, what was tried, what to do, ending with ``then``: the checkpoint kept
    and the command that continues, ``autotune.trainer.faults.continue_from``) when ``exc`` is an out-of-memory
    error in ``phase`` of ``epoch``, else None. ``exc.tried`` (``autotune.trainer.fallback.StepDownsExhausted``)
    says which step-downs failed too."""
    from autotune.errors import TrainingOutOfMemory
    from autotune.probe.memory import is_oom_error

    if not is_oom_error(exc):
        return None
    under = format_bytes(limit) if limit else "the device's memory"
    tried = getattr(exc, "tried", "")
    tuned = config.tuned
    what = (f"tried {tried}" if tried else
            f"{tuned.num_patches_per_iter} patches per pass, sw batch {tuned.num_sw_batch_size}")
    return TrainingOutOfMemory(
        f"{config.bundle_root}: out of memory in {phase} of epoch {epoch} under {under} ({what}); "
        f"run 'autotune tune' again at this limit or lower num_patches_per_iter; {then}")


class PhaseMemory:
    """The limit and the peaks of one training run, phase by phase (``train``, ``val``); ``phase`` names
    the phase in progress (``setup``, ``training``, ``validation``) for an out-of-memory line."""

    def __init__(self, device: str, limit: int | None) -> None:
        self.device, self.limit = device, limit
        self.phase = "setup"
        self.cuda = device.startswith("cuda")
        self.peaks: dict[str, int] = {}
        self.tracker: Any = None

    def apply_limit(self) -> None:
        """Cap the CUDA caching allocator at the limit (the CPU's limit is kept per phase by the tracker)."""
        if self.limit is not None and self.cuda:
            from autotune.probe.memory import cuda_set_memory_limit

            cuda_set_memory_limit(self.device, int(self.limit))

    def start(self, model: Any, optimizer: Any, phase: str) -> Any:
        """Reset the peaks for ``phase``; on the CPU under a limit, returns the tracker (counting from the
        model's and optimizer's tensors) to enter around the phase's compute, else None."""
        self.tracker, self.phase = None, phase
        if self.cuda:
            from autotune.probe.memory import cuda_reset_peaks

            cuda_reset_peaks(self.device)
        elif self.limit is not None:
            from autotune.probe.tracker import MemoryTracker, tensors_of

            self.tracker = MemoryTracker("cpu", int(self.limit))
            self.tracker.track(tensors_of(model, optimizer))
        return self.tracker

    def tracking(self) -> Any:
        """``with phase_memory.tracking():`` around compute to count (a no-op without a tracker)."""
        return self.tracker if self.tracker is not None else contextlib.nullcontext()

    def failed_peak(self) -> int | None:
        """The peak of the attempt that just ran out of memory (None on the CPU without a limit); the next attempt's
        peak is counted from here on."""
        if self.cuda:
            import torch

            peak = int(torch.cuda.max_memory_reserved(self.device))
            torch.cuda.reset_peak_memory_stats(self.device)
            return peak
        if self.tracker is None:
            return None
        peak = int(self.tracker.peak_bytes)
        self.tracker.reset_peak()
        return peak

    def read(self, row: dict[str, Any], phase: str) -> None:
        """Put the phase's peaks into ``row`` (``{phase}_peak_bytes``, ``{phase}_peak_allocated_bytes``)."""
        reserved = allocated = None
        if self.cuda:
            from autotune.probe.memory import cuda_peaks

            peaks = cuda_peaks(self.device)
            reserved, allocated = peaks["cuda_max_memory_reserved"], peaks["cuda_max_memory_allocated"]
        elif self.tracker is not None:
            reserved = allocated = int(self.tracker.peak_bytes)
            self.tracker.stop()
            self.tracker = None
        if reserved is not None:
            for key, value in ((f"{phase}_peak_bytes", reserved), (f"{phase}_peak_allocated_bytes", allocated)):
                self.peaks[key] = max(self.peaks.get(key, 0), int(value))
        row[f"{phase}_peak_bytes"], row[f"{phase}_peak_allocated_bytes"] = reserved, allocated

    def report(self, tuned_peak_bytes: int | None) -> dict[str, Any]:
        """The run's peaks so far next to the tuned prediction and the limit."""
        return {"memory_limit": self.limit, "tuned_peak_bytes": tuned_peak_bytes,
                **{k: self.peaks.get(k) for k in ("train_peak_bytes", "train_peak_allocated_bytes",
                                                  "val_peak_bytes", "val_peak_allocated_bytes")}}
