"""Measuring memory outside the tracker: what counts as out of memory, peak RSS, CUDA allocator peaks.

The tensor tracker that the CPU probe and the estimator count with is ``autotune.probe.tracker``
(it imports torch at its top, so only the functions that measure import it). Device facts
(names, total memory, host RAM, NVML) live in ``autotune.device``. Nothing here imports torch
until a CUDA function runs.
"""

from __future__ import annotations

import re
import resource
import sys

from autotune.device import device_total_memory, proc_field_bytes

__all__ = [
    "GRANULARITY",
    "round_up",
    "is_oom_error",
    "reset_peak_rss",
    "peak_rss_bytes",
    "cuda_reset_peaks",
    "cuda_peaks",
    "cuda_set_memory_limit",
    "cuda_allocator_counts",
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


def cuda_allocator_counts(device: str) -> dict[str, int] | None:
    """The allocator's counts since the process started: ``cudaMalloc`` and ``cudaFree`` calls, retries after
    a failed ``cudaMalloc`` and out-of-memory errors: a release of cached segments without a retry is an
    ``empty_cache`` (cuDNN's search calls one), with one it is the allocator freeing its cache to retry.
    None when the allocator does not report them."""
    import torch

    try:
        stats = torch.cuda.memory_stats(device)
    except (RuntimeError, AssertionError):
        return None
    keys = {"num_device_alloc": "device_allocs", "num_device_free": "device_frees", "num_alloc_retries": "alloc_retries",
            "num_ooms": "ooms"}
    return {name: int(stats.get(key, 0)) for key, name in keys.items()}
