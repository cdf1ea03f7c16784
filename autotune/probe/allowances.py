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

THE DEFAULTS BELOW HAVE NOT BEEN VALIDATED ON A GPU. They are conservative round
figures from PyTorch's documentation and common reports (a CUDA context with cuDNN
loaded takes roughly 300-600 MiB; cuDNN's 3D convolution workspaces reach a few hundred
MiB; reserved exceeds allocated by roughly 5-20%). Replace them with figures measured
with ``autotune probe --device cuda`` on your GPU (compare ``cuda_max_memory_reserved``
with the estimate's ``peak_bytes``). On CPU the allowance is zero: the estimate is the
tracked peak itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["CudaAllowance", "DEFAULT_CUDA_ALLOWANCE", "NO_ALLOWANCE", "allowance_for", "apply_allowance"]

_MIB = 1024**2


@dataclass(frozen=True)
class CudaAllowance:
    """Bytes a CUDA device needs beyond the estimated tensor peak (defaults NOT validated on a GPU).

    Attributes:
        context_bytes: CUDA context and library code/handles, outside the caching allocator.
        cudnn_workspace_bytes: largest cuDNN/cuBLAS workspace alive at the peak.
        allocator_slack_fraction: reserved minus allocated, as a fraction of the tensor peak.
    """

    context_bytes: int = 512 * _MIB
    cudnn_workspace_bytes: int = 256 * _MIB
    allocator_slack_fraction: float = 0.10


DEFAULT_CUDA_ALLOWANCE = CudaAllowance()
NO_ALLOWANCE = CudaAllowance(context_bytes=0, cudnn_workspace_bytes=0, allocator_slack_fraction=0.0)


def allowance_for(device: str) -> CudaAllowance:
    """The default allowance for ``device``: ``DEFAULT_CUDA_ALLOWANCE`` for CUDA, none for CPU."""
    return DEFAULT_CUDA_ALLOWANCE if str(device).startswith("cuda") else NO_ALLOWANCE


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
