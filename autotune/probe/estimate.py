"""Estimate a bundle's peak memory with no compute and no real memory, and fit peak(N) as a line.

``estimate`` runs the same training steps and sliding-window pass as the probe
(``autotune.step``), with the model built by ``autotune.build``, under PyTorch's
``FakeTensorMode`` and the probe's own ``MemoryTracker``: tensors carry shapes, dtypes
and devices but no data, and the tracker counts their storages exactly as it counts
the real ones in a CPU probe. On CPU the estimate equals the probe's tracked peak; for
CUDA the tensors are fake CUDA tensors (this works on a CPU-only build) and the raw
figure leaves out what the allocator and libraries add (see ``autotune.probe.allowances``).

Differences from a real step, each small and pinned by tests:

- Data-dependent Python values cannot come from fake tensors. MONAI's Dice losses read
  ``torch.arange(2, ndim).tolist()``; here ``arange`` with plain-number arguments is computed
  for real and carried as a constant, so the bundle's real loss (DiceCE, DiceFocal, Dice)
  runs unchanged: no surrogate is needed. A truth value read from a bool tensor (Novograd's
  ``if exp_avg_sq == 0``) is answered False and counted in ``guessed_values``. The sliding
  window's Gaussian importance map calls ``.item()``; it is replaced by an empty tensor of
  the same shape, dtype and device (its short-lived intermediates are not counted).
- fp16 on CUDA: no GradScaler (its few scalar tensors are left out).
- The training state a first step leaves (a gradient for every parameter, the optimizer's
  state) is created untraced, then one loader batch is traced: the probe's later steps,
  whose peak is the probe's (the first step, without that state, peaks lower). With
  ``record=True`` the tracker's events are returned as well, from which
  ``autotune.probe.replay`` gives the peak at any other batch size.
- CUDA target with no GPU visible: fake CUDA tensors cannot run autograd on a CPU-only
  build (PyTorch aborts for want of a CUDA device guard), so the pass runs on fake CPU tensors
  under CPU fp16 autocast with CUDA's float32 op list applied on top (``_cuda_autocast_policy``;
  ``semantics`` is ``"cpu-emulating-cuda"``); a validation volume held on the CPU goes on the
  meta device so it is not counted. cuDNN/cuBLAS-specific saved buffers are not modelled.

Not thread-safe: the importance-map replacement patches ``monai.inferers.utils`` while an
estimate runs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import ProbeError
from autotune.probe.model import MemoryModel, num_windows

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["estimate", "fit_memory_model"]



def _resolve(bundle: str | Path | Mapping[str, Any], num_patches_per_iter: int | None, num_sw_batch_size: int | None,
             validation_device: str, device: str, phases: Any, precision: str | None = None) -> dict[str, Any]:
    """Check the arguments the way ``run_probe`` does; returns a request dict."""
    from autotune.probe.runner import resolve_request

    return resolve_request(bundle, num_patches_per_iter=num_patches_per_iter, num_sw_batch_size=num_sw_batch_size,
                           validation_device=validation_device, device=device, memory_limit=None, phases=phases,
                           warmup_steps=1, measure_steps=1, check_device=False, precision=precision)


def _fake_corrections(fake_mode: Any, guesses: list[str]) -> Any:
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
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
    from torch.utils._python_dispatch import TorchDispatchMode

    arange = torch.ops.aten.arange
    scalar_reads = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)
    group_norm = torch.ops.aten.native_group_norm.default
    group_norm_backward = torch.ops.aten.native_group_norm_backward.default

    class FakeCorrections(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func is group_norm_backward:  # the kernels give the input's gradient the input's dtype; the
                out = func(*args, **kwargs)  # decomposition promotes it with the fp32 weight (2x in bf16)
                if out[0] is not None and out[0].dtype != args[1].dtype:
                    out = (out[0].to(args[1].dtype), *out[1:])
                return out
            if func is group_norm:  # mixed input and weight dtypes: the kernels keep mean and rstd in the weight's
                out = func(*args, **kwargs)
                weight = args[1]
                if weight is not None and weight.dtype != args[0].dtype and out[1].dtype != weight.dtype:
                    out = (out[0], out[1].to(weight.dtype), out[2].to(weight.dtype))
                return out
            if func.overloadpacket is arange and torch.device(kwargs.get("device") or "cpu").type == "cpu":
                with unset_fake_temporarily():
                    real = func(*args, **kwargs)
                return fake_mode.fake_tensor_converter.from_real_tensor(fake_mode, real, make_constant=True)
            if (func in scalar_reads and isinstance(args[0], FakeTensor) and args[0].constant is None
                    and args[0].dtype == torch.bool):
                guesses.append(str(func))
                return False
            return func(*args, **kwargs)

    return FakeCorrections()


def _empty_importance_map(patch_size: Any, mode: Any = "constant", sigma_scale: Any = 0.125,
                          device: Any = "cpu", dtype: Any = None) -> torch.Tensor:
    """Stand-in for ``compute_importance_map``: same shape, dtype and device, no data."""
    import torch

    return torch.empty(tuple(int(v) for v in patch_size), dtype=torch.float, device=device).to(dtype or torch.float)


# Ops CUDA autocast runs in float32 (ATen autocast_mode.h: AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE)
# where CPU autocast keeps the input dtype; by their Python names.
_CUDA_FP32_OPS = frozenset({
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
# Ops CPU autocast runs in float32 that CUDA autocast leaves in the input dtype.
_CPU_ONLY_FP32_OPS = frozenset({
    "max_pool3d", "_max_pool3d", "max_pool3d_with_indices", "avg_pool3d", "adaptive_avg_pool3d",
    "adaptive_max_pool3d", "max_unpool3d", "replication_pad3d", "reflection_pad3d",
})


def _cuda_autocast_policy() -> Any:
    """A torch-function mode that gives CPU fp16 autocast CUDA's float32 list (for estimating a CUDA
    target where no GPU is present): fp16 tensor arguments of those ops are cast to float32 first,
    above autograd, as CUDA autocast does."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_map

    def upcast(value: Any) -> Any:
        return value.float() if isinstance(value, torch.Tensor) and value.dtype == torch.float16 else value

    class CudaAutocastPolicy(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            name = getattr(func, "__name__", None)
            if name in _CUDA_FP32_OPS and kwargs.get("dtype") is None and torch.is_autocast_enabled("cpu"):
                args, kwargs = tree_map(upcast, (args, kwargs))
            elif name in _CPU_ONLY_FP32_OPS and torch.is_autocast_enabled("cpu"):
                with torch.autocast("cpu", enabled=False):
                    return func(*args, **kwargs)
            return func(*args, **kwargs)

    return CudaAutocastPolicy()


@contextlib.contextmanager
def _fake_session(emulate_cuda: bool = False, guesses: list[str] | None = None) -> Iterator[Any]:
    """FakeTensorMode plus what the fake pass needs: data values and kernel corrections (``_fake_corrections``), the importance-map
    stand-in, and with ``emulate_cuda`` CUDA's autocast float32 list on CPU tensors."""
    import monai.inferers.utils as sw_utils
    from torch._subclasses.fake_tensor import FakeTensorMode

    saved_map = sw_utils.compute_importance_map
    sw_utils.compute_importance_map = _empty_importance_map
    fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(fake_mode)
            stack.enter_context(_fake_corrections(fake_mode, guesses if guesses is not None else []))
            if emulate_cuda:
                stack.enter_context(_cuda_autocast_policy())
            yield fake_mode
    finally:
        sw_utils.compute_importance_map = saved_map


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Python's cyclic collector off: frees happen where references drop, the same in every trace."""
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _fake_model(cfg: Mapping[str, Any], device: str) -> torch.nn.Module:
    """Build the network on the meta device (no memory), then give it fake parameters on ``device``.

    Must be called inside ``_fake_session``.
    """
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from autotune.build import build_network

    with unset_fake_temporarily(), torch.device("meta"):
        model = build_network(cfg)
    return model._apply(lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device))


def estimate(bundle: str | Path | Mapping[str, Any], *, num_patches_per_iter: int | None = None,
             num_sw_batch_size: int | None = None, validation_device: str = "device", device: str = "cpu",
             phases: Any = ("train", "infer"), precision: str | None = None, record: bool = False) -> dict[str, Any]:
    """Estimate the peak tensor memory of a probe of ``bundle``, in this process, with fake tensors.

    Returns the probe's result keys where they apply (timings are None), with
    ``measured: False``, ``seconds`` (how long the estimate took), the raw peaks
    ``train_peak_bytes``, ``infer_peak_bytes``, ``peak_bytes`` (no allowance added),
    ``semantics`` (``cpu``, ``cuda``, or ``cpu-emulating-cuda`` for a CUDA target with no GPU
    visible) and ``guessed_values`` (truth values answered without data; see the module
    docstring). Only the compute device's storages are counted: for a CUDA target with
    ``validation_device="cpu"`` the volume and stitched output are left out, as on a GPU.

    Raises:
        ConfigError: the bundle is missing or invalid.
        ProbeError: bad arguments, or the fake pass failed (the message names the phase).
    """
    from autotune.build import amp_dtype, build_loss, build_optimizer
    from autotune.probe import memory, workload
    from autotune.probe.trial import base_result
    from autotune.step import make_dice_metric

    start = time.perf_counter()
    req = _resolve(bundle, num_patches_per_iter, num_sw_batch_size, validation_device, device, phases, precision)
    cfg, device = req["config"], req["device"]
    result = base_result(req)
    result.update(measured=False, status="ok", device_name=None, device_total_memory=None)
    phase = "build"
    try:
        import monai
        import torch

        result.update(torch_version=torch.__version__, monai_version=monai.__version__)
        # Fake CUDA tensors need CUDA's device guard for autograd; without a GPU, emulate on CPU.
        emulate = device.startswith("cuda") and not torch.cuda.is_available()
        compute = "cpu" if emulate else device
        volume_device = ("meta" if emulate else "cpu") if req["validation_device"] == "cpu" else compute
        result["semantics"] = "cpu-emulating-cuda" if emulate else device.split(":")[0]
        dtype = amp_dtype(cfg, device, req["precision"])
        guesses: list[str] = []
        with _fake_session(emulate_cuda=emulate, guesses=guesses):
            if cfg.get("format") == "monai":  # MONAI's own network, loss, optimizer and loop (autotune.auto3dseg)
                from autotune import auto3dseg

                model, loss_fn, optimizer, workload = auto3dseg.fake_parts(cfg, compute, emulate)
            else:
                model = _fake_model(cfg, compute)
                loss_fn = build_loss(cfg)
                optimizer = build_optimizer(cfg, model.parameters())
            for phase in req["phases"]:
                tracker = memory.make_tracker(compute.split(":")[0])
                if phase == "train":
                    model.train()
                    batches = workload.make_loader_batches(cfg, req["num_patches_per_iter"], compute)
                    # the state a first step leaves (gradients, optimizer state), then one loader batch:
                    # the peak of the probe's later steps, at half the cost of tracing two
                    workload.ensure_training_state(model, optimizer)
                    if record:
                        tracker.record()
                    tracker.track(memory.tensors_of(model, optimizer), "state")
                    tracker.track(memory.tensors_of(batches), "loader")
                    with tracker, _no_gc():
                        workload.train_loader_batch(model, loss_fn, optimizer, batches[0],
                                                    req["num_patches_per_iter"], dtype, None)
                    if record:
                        result["train_events"] = tracker.events
                    del batches
                else:
                    workload.ensure_training_state(model, optimizer)
                    model.eval()
                    volume = workload.make_volume(cfg, volume_device)
                    label = workload.make_volume_label(cfg, volume_device)
                    tracker.track(memory.tensors_of(model, optimizer, volume, label))
                    with tracker:
                        metric = None if volume_device == "meta" else make_dice_metric(cfg)
                        out = workload.validate_volume(model, volume, label, cfg, req["num_sw_batch_size"], compute,
                                                       dtype, metric)
                        del out
                    del volume, label
                result[f"{phase}_peak_bytes"] = tracker.peak_bytes
                tracker.stop()
    except Exception as exc:  # the fake pass is ours: any failure is reported as a ProbeError
        raise ProbeError(f"estimate of {cfg.get('algo')} failed in phase {phase!r}: {type(exc).__name__}: {exc}") from exc
    peaks = [result[f"{p}_peak_bytes"] for p in ("train", "infer") if result.get(f"{p}_peak_bytes") is not None]
    result["peak_bytes"] = max(peaks) if peaks else None
    result["guessed_values"] = len(guesses)
    result["seconds"] = time.perf_counter() - start
    return result


def fit_memory_model(bundle: str | Path | Mapping[str, Any], *, phase: str = "train", n_values: tuple[int, int] = (1, 2),
                     device: str = "cpu", validation_device: str = "device", **kw: Any) -> MemoryModel:
    """Fit ``MemoryModel`` for ``phase`` from two estimates at ``n_values``.

    Raises:
        ProbeError: an unknown phase, n_values not two different positive integers, or a failed estimate.
        ConfigError: the bundle is missing or invalid.
    """
    if phase not in ("train", "infer"):
        raise ProbeError(f"unknown phase {phase!r}; valid: train, infer")
    n1, n2 = (int(v) for v in n_values)
    if n1 < 1 or n2 < 1 or n1 == n2:
        raise ProbeError(f"n_values must be two different positive integers, got {n_values!r}")
    key = "num_patches_per_iter" if phase == "train" else "num_sw_batch_size"
    peaks = []
    for n in (n1, n2):
        res = estimate(bundle, device=device, validation_device=validation_device, phases=(phase,), **{key: n}, **kw)
        peaks.append(int(res[f"{phase}_peak_bytes"]))
    slope = (peaks[1] - peaks[0]) / (n2 - n1)
    cap = None
    if phase == "infer":
        from autotune.probe.runner import resolve_request

        cap = num_windows(resolve_request(bundle, check_device=False)["config"])
    return MemoryModel(intercept=peaks[0] - slope * n1, slope=slope, cap=cap, phase=phase,
                       points=[(n1, peaks[0]), (n2, peaks[1])])
