"""Autocast on the CPU with CUDA's float32 list: the precision-sensitive ops run in float32 there too.

CUDA autocast runs a list of ops in float32 whatever their inputs (ATen ``autocast_mode.h``:
softmax and log_softmax, sum and prod, cumsum, the vector norms and group/layer norm, exp, log,
pow, rsqrt, the losses, interpolation, ...). CPU autocast keeps most of them in the low
precision: under bf16 on the CPU a DiceCE loss takes its softmax and its sums in bf16, with 8
bits of mantissa where CUDA keeps 24. ``autocast`` gives the CPU CUDA's list but the ops that
make activations, normalization and interpolation (``CPU_FP32_OPS``; see there why):
low-precision (bf16, fp16) tensor arguments of those ops are cast to float32 first, above
autograd, as CUDA autocast does. Convolutions, matrix products, normalization and
interpolation stay in the low precision.

``autotune.step`` trains and validates through ``autocast``, so the probe, the estimator and
training compute, and allocate, the same. The estimator's emulation of a CUDA target on the CPU
(``autotune.probe.fake``) uses the same list. This module imports torch at its top: import it
inside functions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

__all__ = ["CUDA_FP32_OPS", "CPU_FP32_OPS", "Fp32OpList", "autocast"]

# Ops CUDA autocast runs in float32 (ATen autocast_mode.h: AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE)
# where CPU autocast keeps the input dtype; by their Python names.
CUDA_FP32_OPS = frozenset({
    "acos", "asin", "cosh", "sinh", "tan", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "pow", "__pow__", "__rpow__", "softplus", "layer_norm", "group_norm", "norm",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "hinge_embedding_loss",
    "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "cross_entropy", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "interpolate", "upsample", "upsample_nearest3d", "upsample_trilinear3d", "upsample_nearest2d",
    "upsample_bilinear2d", "upsample_bicubic2d", "grid_sample", "softmax", "log_softmax", "cumprod",
    "cumsum", "sum", "prod", "linalg_vector_norm", "linalg_matrix_norm",
})
# On the CPU: CUDA's list but the ops that make a network's activations, the normalization layers and
# interpolation. Their CPU kernels already accumulate in float32 (a norm's statistics, an interpolation's
# weighted sum), and a float32 activation takes 4 bytes where bf16 takes 2: with them the tiny SegResNet's
# training peak at 2 patches rose from 25 to 44 MiB, and its sliding-window batch under 64 MiB fell from
# 21 to 11 (measured; BENCHMARKS.md). What stays is the loss's arithmetic: softmax, sums, exp, log, pow.
_ACTIVATION_OPS = frozenset({
    "layer_norm", "group_norm", "interpolate", "upsample", "upsample_nearest3d", "upsample_trilinear3d",
    "upsample_nearest2d", "upsample_bilinear2d", "upsample_bicubic2d", "grid_sample",
})
CPU_FP32_OPS = CUDA_FP32_OPS - _ACTIVATION_OPS
_LOW = (torch.float16, torch.bfloat16)


def _upcast(value: Any) -> Any:
    return value.float() if isinstance(value, torch.Tensor) and value.dtype in _LOW else value


class Fp32OpList(TorchFunctionMode):
    """A torch-function mode that gives CPU autocast a float32 list: while CPU autocast is on, the bf16 and
    fp16 tensor arguments of the ops in ``ops`` (default ``CPU_FP32_OPS``) are cast to float32 before the op
    (an op given an explicit ``dtype`` keeps it, as under CUDA autocast)."""

    ops: frozenset[str] = CPU_FP32_OPS

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if (getattr(func, "__name__", None) in self.ops and kwargs.get("dtype") is None
                and torch.is_autocast_enabled("cpu")):
            args, kwargs = tree_map(_upcast, (args, kwargs))
        return func(*args, **kwargs)


@contextlib.contextmanager
def autocast(device_type: str, dtype: Any) -> Iterator[None]:
    """``torch.autocast(device_type, dtype)`` (no autocast when ``dtype`` is None), and on the CPU the float32
    list on top (``Fp32OpList``: CUDA's, but normalization and interpolation)."""
    with torch.autocast(device_type=device_type, dtype=dtype or torch.float32, enabled=dtype is not None):
        if dtype is None or device_type != "cpu":
            yield
            return
        with Fp32OpList():
            yield
