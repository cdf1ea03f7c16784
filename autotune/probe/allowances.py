"""What a CUDA device needs beyond the tensor bytes the estimator counts.

The estimator's raw peak is the bytes of live tensor storages, each rounded up to 512
as the CUDA caching allocator does: close to ``torch.cuda.max_memory_allocated``. A real
GPU also needs:

- the CUDA context and library handles (CUDA runtime, cuDNN, cuBLAS kernels), which live
  outside the caching allocator, so ``max_memory_reserved`` does not show them;
- cuDNN and cuBLAS workspaces, taken from the caching allocator while a convolution or
  matrix product runs, which a fake pass cannot see;
- allocator slack: the caching allocator reserves whole segments (2 MiB for small
  blocks, larger for big ones) and cannot always reuse freed blocks, so reserved memory
  exceeds allocated memory.

A GPU with a calibration file (``autotune.probe.calibration``, written by
``benchmarks/gpu_check.py`` from real probes on that card) uses the fitted figures.
Any other GPU uses the defaults below, which are round guesses NOT validated on a GPU
(a CUDA context with cuDNN loaded takes roughly 300-600 MiB; cuDNN's 3D convolution
workspaces reach a few hundred MiB; reserved exceeds allocated by roughly 5-20%).
``source`` says which applied, and is recorded in the tuning provenance. On CPU the
allowance is zero: the estimate is the tracked peak itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CudaAllowance", "DEFAULT_CUDA_ALLOWANCE", "NO_ALLOWANCE", "DEFAULT_SOURCE", "allowance_for",
           "allowance_from_record", "apply_allowance", "allocator_budget", "is_calibrated", "tensor_budget"]

_MIB = 1024**2
DEFAULT_SOURCE = "default (not validated on a GPU)"


@dataclass(frozen=True)
class CudaAllowance:
    """Bytes a CUDA device needs beyond the estimated tensor peak (defaults NOT validated on a GPU).

    Attributes:
        context_bytes: CUDA context and library code/handles, outside the caching allocator.
        cudnn_workspace_bytes: largest cuDNN/cuBLAS workspace alive at the peak.
        allocator_slack_fraction: reserved minus allocated, as a fraction of the tensor peak.
        source: where the figures come from: ``DEFAULT_SOURCE``, or ``calibration: FILE (GPU, versions)``.
    """

    context_bytes: int = 512 * _MIB
    cudnn_workspace_bytes: int = 256 * _MIB
    allocator_slack_fraction: float = 0.10
    source: str = DEFAULT_SOURCE

    def affine(self) -> tuple[float, int]:
        """``(scale, offset)`` with ``raw * scale + offset`` = :func:`apply_allowance` without the context."""
        return 1.0 + float(self.allocator_slack_fraction), int(self.cudnn_workspace_bytes)


DEFAULT_CUDA_ALLOWANCE = CudaAllowance()


NO_ALLOWANCE = CudaAllowance(context_bytes=0, cudnn_workspace_bytes=0, allocator_slack_fraction=0.0, source="cpu")


def is_calibrated(allowance: CudaAllowance) -> bool:
    """True when the figures were fitted on a real GPU (a calibration file), not the defaults."""
    return str(allowance.source).startswith("calibration")


def allowance_for(device: str, gpu_name: str | None = None) -> CudaAllowance:
    """The allowance for ``device``: none on the CPU; on CUDA the calibration of the GPU named
    ``gpu_name`` (default: the visible GPU of ``device``) when one exists, else the defaults."""
    if not str(device).startswith("cuda"):
        return NO_ALLOWANCE
    from autotune.device import gpu_name as visible_gpu_name
    from autotune.probe.calibration import find_calibration

    name = gpu_name or visible_gpu_name(str(device))
    found = find_calibration(name)
    if found is None:
        return DEFAULT_CUDA_ALLOWANCE
    fitted = found["allowance"]
    versions = ", ".join(f"{k} {found.get(k)}" for k in ("driver", "torch", "cuda", "cudnn") if found.get(k))
    return CudaAllowance(
        context_bytes=int(fitted["context_bytes"]),
        cudnn_workspace_bytes=int(fitted["cudnn_workspace_bytes"]),
        allocator_slack_fraction=float(fitted["allocator_slack_fraction"]),
        source=f"calibration: {Path(found['path']).name} ({found['gpu_name']}; {versions}; {found.get('measured_at')})",
    )


def allowance_from_record(record: Mapping[str, Any] | None, device: str) -> CudaAllowance:
    """The allowance a plan or tuning record names (``record["allowances"]``, e.g. a target GPU's
    calibration) on CUDA, else :func:`allowance_for` ``device``. None applies on the CPU."""
    if not str(device).startswith("cuda"):
        return NO_ALLOWANCE
    if record and record.get("allowances"):
        return CudaAllowance(**record["allowances"])
    return allowance_for(device)


def allocator_budget(limit_bytes: int, margin: float, allowance: CudaAllowance) -> int:
    """What the caching allocator may hold under a device memory limit: the limit less the
    safety margin (a fraction) and the CUDA context, which lives outside the allocator.
    The one formula tune, verify and estimate use; may be <= 0 (nothing fits)."""
    return int(limit_bytes * (1.0 - float(margin))) - int(allowance.context_bytes)


def tensor_budget(allocator_bytes: float, allowance: CudaAllowance) -> float:
    """The largest raw tensor peak whose :func:`apply_allowance` (without the context) stays
    within ``allocator_bytes``: the inverse of ``peak * (1 + slack) + workspace``."""
    return (float(allocator_bytes) - allowance.cudnn_workspace_bytes) / (1.0 + allowance.allocator_slack_fraction)


def apply_allowance(peak_bytes: float, allowance: CudaAllowance, *, include_context: bool = True) -> int:
    """Device memory needed for an estimated tensor peak: ``peak * (1 + slack) + workspace (+ context)``.

    Leave the context out (``include_context=False``) when comparing with a limit on the
    caching allocator, such as the probe's ``memory_limit`` on CUDA; keep it when comparing
    with the device's total memory.

    Raises:
        ValueError: a negative peak or allowance.
    """
    if peak_bytes < 0 or allowance.context_bytes < 0 or allowance.cudnn_workspace_bytes < 0 \
            or allowance.allocator_slack_fraction < 0:
        raise ValueError("peak_bytes and every allowance must be >= 0")
    total = peak_bytes * (1.0 + allowance.allocator_slack_fraction) + allowance.cudnn_workspace_bytes
    if include_context:
        total += allowance.context_bytes
    return int(math.ceil(total))
