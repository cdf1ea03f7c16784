"""The fake session: ``FakeTensorMode`` with what it takes to allocate as a real step does.

The estimator (``autotune.probe.estimate``) runs a training step and a sliding-window pass
inside ``fake_session``. Where fake tensors would differ from real ones, each pinned by tests:

- Data-dependent Python values cannot come from fake tensors. MONAI's Dice losses read
  ``torch.arange(2, ndim).tolist()``; here ``arange`` with plain-number arguments is computed
  for real and carried as a constant, so the bundle's real loss (DiceCE, DiceFocal, Dice)
  runs unchanged: no surrogate is needed. A truth value read from a bool tensor (Novograd's
  ``if exp_avg_sq == 0``) is answered False and noted in ``guesses``. The sliding
  window's Gaussian importance map calls ``.item()``; it is replaced by an empty tensor of
  the same shape, dtype and device (its short-lived intermediates are not counted).
- GroupNorm's fake kernels (PyTorch's decompositions) allocate other dtypes than the real
  kernels under mixed dtypes (bf16 autocast); their outputs are cast to what the kernels allocate.
- CUDA target with no GPU visible: fake CUDA tensors cannot run autograd on a CPU-only build
  (PyTorch aborts for want of a CUDA device guard), so the pass runs on fake CPU tensors under
  CPU fp16 autocast with CUDA's float32 op list applied on top (``autotune.autocast``) and
  without CPU autocast's own float32 ops (``CudaAutocastPolicy``).

Not thread-safe: ``fake_session`` patches ``monai.inferers.utils`` while it is open. This module
imports torch at its top: the estimator imports it inside its functions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode

from autotune.autocast import CUDA_FP32_OPS, Fp32OpList

__all__ = ["CudaAutocastPolicy", "FakeCorrections", "fake_session"]

_ARANGE = torch.ops.aten.arange
_SCALAR_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)
_GROUP_NORM = torch.ops.aten.native_group_norm.default
_GROUP_NORM_BACKWARD = torch.ops.aten.native_group_norm_backward.default

# Ops CPU autocast runs in float32 that CUDA autocast leaves in the input dtype.
_CPU_ONLY_FP32_OPS = frozenset({
    "max_pool3d", "_max_pool3d", "max_pool3d_with_indices", "avg_pool3d", "adaptive_avg_pool3d",
    "adaptive_max_pool3d", "max_unpool3d", "replication_pad3d", "reflection_pad3d",
})




class FakeCorrections(TorchDispatchMode):
    """A dispatch mode for where the fake pass would otherwise differ from a real step: the few Python
    values a step reads from tensors, and fake kernels that allocate otherwise than the real ones.

    CPU ``aten.arange`` with plain-number arguments becomes a constant fake tensor, so
    ``.tolist()`` on it gives the real numbers (MONAI's Dice loss reads its reduce axes so).
    A truth value read from a non-constant bool tensor (``if state == 0:`` in Novograd) is
    answered False and noted in ``guesses``: such branches choose between in-place updates,
    so memory does not depend on the answer. Any other data-dependent value still fails.
    GroupNorm: PyTorch's decompositions promote the input's gradient to the weight's dtype and keep
    mean and rstd in the input's; the kernels do the opposite under mixed dtypes (bf16 autocast), so
    the outputs are cast to what the kernels allocate (the promoted intermediate is never counted).
    """

    def __init__(self, fake_mode: FakeTensorMode, guesses: list[str]) -> None:
        super().__init__()
        self.fake_mode = fake_mode
        self.guesses = guesses

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is _GROUP_NORM_BACKWARD:  # the kernels give the input's gradient the input's dtype; the
            out = func(*args, **kwargs)  # decomposition promotes it with the fp32 weight (2x in bf16)
            if out[0] is not None and out[0].dtype != args[1].dtype:
                out = (out[0].to(args[1].dtype), *out[1:])
            return out
        if func is _GROUP_NORM:  # mixed input and weight dtypes: the kernels keep mean and rstd in the weight's
            out = func(*args, **kwargs)
            weight = args[1]
            if weight is not None and weight.dtype != args[0].dtype and out[1].dtype != weight.dtype:
                out = (out[0], out[1].to(weight.dtype), out[2].to(weight.dtype))
            return out
        if func.overloadpacket is _ARANGE and torch.device(kwargs.get("device") or "cpu").type == "cpu":
            with unset_fake_temporarily():
                real = func(*args, **kwargs)
            return self.fake_mode.fake_tensor_converter.from_real_tensor(self.fake_mode, real, make_constant=True)
        if (func in _SCALAR_READS and isinstance(args[0], FakeTensor) and args[0].constant is None
                and args[0].dtype == torch.bool):
            self.guesses.append(str(func))
            return False
        return func(*args, **kwargs)


class CudaAutocastPolicy(Fp32OpList):
    """A torch-function mode that makes CPU autocast allocate as CUDA autocast does (for estimating a CUDA
    target where no GPU is present): CUDA's whole float32 list (``autotune.autocast``'s CPU steps keep all
    of it but normalization and interpolation; here also for a MONAI bundle's own loop), and the ops CPU
    autocast alone runs in float32 run without it."""

    ops = CUDA_FP32_OPS

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) in _CPU_ONLY_FP32_OPS and torch.is_autocast_enabled("cpu"):
            with torch.autocast("cpu", enabled=False):
                return func(*args, **kwargs)
        return super().__torch_function__(func, types, args, kwargs)


def _empty_importance_map(patch_size: Any, mode: Any = "constant", sigma_scale: Any = 0.125,
                          device: Any = "cpu", dtype: Any = None) -> torch.Tensor:
    """Stand-in for ``compute_importance_map``: same shape, dtype and device, no data."""
    return torch.empty(tuple(int(v) for v in patch_size), dtype=torch.float, device=device).to(dtype or torch.float)


@contextlib.contextmanager
def fake_session(emulate_cuda: bool = False, guesses: list[str] | None = None) -> Iterator[FakeTensorMode]:
    """``FakeTensorMode`` plus what the fake pass needs: the data values and kernel corrections
    (``FakeCorrections``), the importance-map stand-in, and with ``emulate_cuda`` CUDA's autocast
    float32 list on CPU tensors (``CudaAutocastPolicy``)."""
    import monai.inferers.utils as sw_utils

    saved_map = sw_utils.compute_importance_map
    sw_utils.compute_importance_map = _empty_importance_map
    fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(fake_mode)
            stack.enter_context(FakeCorrections(fake_mode, guesses if guesses is not None else []))
            if emulate_cuda:
                stack.enter_context(CudaAutocastPolicy())
            yield fake_mode
    finally:
        sw_utils.compute_importance_map = saved_map
