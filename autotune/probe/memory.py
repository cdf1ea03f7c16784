"""Measuring memory: the lean tensor tracker, peak RSS, CUDA allocator peaks, OOM classification.

Device facts (names, total memory, host RAM, NVML) live in ``autotune.device``.

``MemoryTracker`` is a ``TorchDispatchMode`` that adds the bytes of every new output
storage (rounded up to 512, the CUDA caching allocator's block size) to a running total,
subtracts them when the storage is freed, and keeps the peak. The CPU probe runs real
steps under it and the estimator runs fake steps under it, so both count the same way.
It relies on two PyTorch internals, each pinned by ``tests/probe/test_memory.py``: a storage's
Python object is preserved while the storage lives (so a weak reference to it fires when
the storage is freed), and the autograd engine carries dispatch modes into backward.

torch is imported inside the functions; ``MemoryTracker`` is created by ``make_tracker``
so that importing this module stays cheap.
"""

from __future__ import annotations

import re
import resource
import sys
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from autotune.device import device_total_memory, proc_field_bytes

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "GRANULARITY",
    "round_up",
    "make_tracker",
    "tensors_of",
    "is_oom_error",
    "reset_peak_rss",
    "peak_rss_bytes",
    "cuda_reset_peaks",
    "cuda_peaks",
    "cuda_set_memory_limit",
]

GRANULARITY = 512  # bytes; the CUDA caching allocator rounds every block up to this

# Narrow message checks for allocation failures that do not raise torch.OutOfMemoryError.
_OOM_MESSAGES = re.compile(
    r"out of memory|DefaultCPUAllocator: (?:can't|not enough memory)|CUDNN_STATUS_ALLOC_FAILED|"
    r"CUBLAS_STATUS_ALLOC_FAILED|Cannot allocate memory",
    re.IGNORECASE,
)


def round_up(nbytes: int, granularity: int = GRANULARITY) -> int:
    """``nbytes`` rounded up to a multiple of ``granularity`` (0 stays 0)."""
    return -(-int(nbytes) // granularity) * granularity


def tensors_of(*objects: Any) -> list[torch.Tensor]:
    """Every tensor in ``objects``: modules (parameters, gradients, buffers), optimizers (state),
    tensors, and lists, tuples or dicts of these."""
    import torch

    found: list[torch.Tensor] = []
    stack = list(objects)
    while stack:
        obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            found.append(obj)
            if obj.is_leaf and obj.grad is not None:
                found.append(obj.grad)
        elif isinstance(obj, torch.nn.Module):
            stack.extend(obj.parameters())
            stack.extend(obj.buffers())
        elif isinstance(obj, torch.optim.Optimizer):
            stack.extend(obj.state.values())
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    return found


def make_tracker(device_type: str | None = None, limit_bytes: int | None = None) -> Any:
    """A new ``MemoryTracker`` (see the class docstring); torch is imported here.

    Args:
        device_type: count only storages on this device type (``"cpu"``, ``"cuda"``); None: all.
        limit_bytes: raise ``torch.OutOfMemoryError`` the moment the running total exceeds it.
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class MemoryTracker(TorchDispatchMode):
        """Counts live tensor storage bytes (each rounded up to 512) and the peak.

        Enter it (``with tracker:``) around the work to measure; storages that exist
        before, such as parameters and inputs, are added with ``track``. A storage is
        counted once, however many views share it; a storage that grows (``resize_``)
        adds the difference. Frees are seen through a weak reference to the storage, so
        they are counted even after the mode is left, until ``stop`` is called.

        Raises:
            torch.OutOfMemoryError: from inside the op that makes the total exceed ``limit_bytes``.
        """

        def __init__(self) -> None:
            super().__init__()
            self.device_type = device_type
            self.limit_bytes = limit_bytes
            self.current_bytes = 0
            self.peak_bytes = 0
            self._reserved = 0
            self._live: dict[int, tuple[weakref.ref, int]] = {}
            # with ``record()``: what happened, in order, for ``autotune.probe.replay``
            self.events: list[tuple[str, int, int, str]] | None = None
            self._slots: dict[int, int] = {}
            self._next_slot = 0
            self._op = "existing"

        def record(self) -> None:
            """Keep every count from now on as an event: ("alloc" | "grow", slot, raw bytes, op) when a
            storage is counted or grows, ("free", slot, 0, "") when it is freed; slots number storages in
            the order they were first counted. Two runs of one program at two batch sizes give the same
            events with other sizes (``autotune.probe.replay``)."""
            self.events = []

        def track(self, tensors: Iterable[torch.Tensor], label: str = "existing") -> int:
            """Count storages that already exist (parameters, gradients, state, inputs); returns the new total.
            ``label`` names them in the recorded events."""
            self._op = label
            for tensor in tensors:
                self._add(tensor)
            return self.current_bytes

        def set_reserved(self, nbytes: int) -> int:
            """Count ``nbytes`` held outside the tracked storages (e.g. a batch a loader thread
            prefetched); replaces the previous reservation. Returns the new total.

            Raises:
                torch.OutOfMemoryError: the total now exceeds ``limit_bytes``.
            """
            nbytes = round_up(max(0, int(nbytes)))
            self.current_bytes += nbytes - self._reserved
            self._reserved = nbytes
            if self.current_bytes > self.peak_bytes:
                self.peak_bytes = self.current_bytes
                if self.limit_bytes is not None and self.current_bytes > self.limit_bytes:
                    raise torch.OutOfMemoryError(
                        f"tracked tensor memory {self.current_bytes} bytes exceeds the memory limit "
                        f"{self.limit_bytes} bytes")
            return self.current_bytes

        def reset_peak(self) -> None:
            """Start a new peak from the current total."""
            self.peak_bytes = self.current_bytes

        def stop(self) -> None:
            """Forget every storage: later frees no longer change the totals."""
            self._live.clear()

        def _freed(self, key: int) -> None:
            entry = self._live.pop(key, None)
            if entry is not None:
                self.current_bytes -= entry[1]
                slot = self._slots.pop(key, None)
                if self.events is not None and slot is not None:
                    self.events.append(("free", slot, 0, ""))

        def _add(self, tensor: torch.Tensor) -> None:
            if self.device_type is not None and tensor.device.type != self.device_type:
                return
            storage = tensor.untyped_storage()
            key = id(storage)
            nbytes = round_up(storage.nbytes())
            entry = self._live.get(key)
            if entry is not None:
                if nbytes <= entry[1]:
                    return
                self._live[key] = (entry[0], nbytes)
                self.current_bytes += nbytes - entry[1]
                if self.events is not None and key in self._slots:
                    self.events.append(("grow", self._slots[key], storage.nbytes(), self._op))
            else:
                ref = weakref.ref(storage, lambda _ref, key=key: self._freed(key))
                self._live[key] = (ref, nbytes)
                self.current_bytes += nbytes
                if self.events is not None:
                    self._slots[key] = slot = self._next_slot
                    self._next_slot += 1
                    self.events.append(("alloc", slot, storage.nbytes(), self._op))
            if self.current_bytes > self.peak_bytes:
                self.peak_bytes = self.current_bytes
                if self.limit_bytes is not None and self.current_bytes > self.limit_bytes:
                    raise torch.OutOfMemoryError(
                        f"tracked tensor memory {self.current_bytes} bytes exceeds the memory limit "
                        f"{self.limit_bytes} bytes"
                    )

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            self._op = func.__name__
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    self._add(leaf)
            return out

    return MemoryTracker()


def is_oom_error(exc: BaseException) -> bool:
    """True if ``exc`` is an out-of-memory failure: the type first, then a narrow message check.

    ``torch.OutOfMemoryError`` (CUDA allocator, the tracker's limit) and Python's
    ``MemoryError`` count by type; a ``RuntimeError`` counts only when its message is one
    of the allocator failure messages (CPU allocator, cuDNN/cuBLAS workspace). Anything
    else is an error, not an OOM.
    """
    torch = sys.modules.get("torch")  # not imported: exc cannot be a torch error, and importing is slow
    if torch is not None and isinstance(exc, torch.OutOfMemoryError):
        return True
    if isinstance(exc, MemoryError):
        return True
    return isinstance(exc, RuntimeError) and bool(_OOM_MESSAGES.search(str(exc)))


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (Linux ``clear_refs``); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """Peak resident set size of this process since start or the last ``reset_peak_rss``, bytes."""
    peak = proc_field_bytes("/proc/self/status", "VmHWM")
    if peak is not None:
        return peak
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB on Linux


def cuda_set_memory_limit(device: str, limit_bytes: int) -> float:
    """Cap the caching allocator of ``device`` at ``limit_bytes``; returns the fraction set (at most 1)."""
    import torch

    dev = torch.device(device)
    total = int(device_total_memory(str(device)) or 0)
    fraction = min(1.0, max(0.0, float(limit_bytes) / total))
    torch.cuda.set_per_process_memory_fraction(fraction, dev)
    return fraction


def cuda_reset_peaks(device: str) -> None:
    """Synchronise and reset the CUDA allocator's peak statistics before a phase."""
    import torch

    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)


def cuda_peaks(device: str) -> dict[str, int]:
    """Peak reserved and allocated bytes of ``device`` since the last ``cuda_reset_peaks``."""
    import torch

    torch.cuda.synchronize(device)
    return {
        "cuda_max_memory_reserved": int(torch.cuda.max_memory_reserved(device)),
        "cuda_max_memory_allocated": int(torch.cuda.max_memory_allocated(device)),
    }
