"""MONAI's SwinUNETR template (21ed8e5): generated without a GPU, read, probed, estimated, written back, launched.

Everything SwinUNETR-specific lives here, in ``SwinUNETR`` (registered in ``autotune.auto3dseg.templates``); the
shared modules of ``autotune.auto3dseg`` reach it through the registry.

- **Generation.** The template's ``algo.py`` sizes its batch when the bundle is written (``fill_template_config``
  calls ``auto_scale``, which reads the free memory of every visible GPU and takes the smallest: on a host with
  no GPU, ``min()`` of an empty list). ``visible_gpu_memory`` hands that computation the memory of the device
  autotune tunes for instead (``generation_memory``: the target GPU when planning, else the memory limit, else
  the device's memory; 16 GiB where none is known, as MONAI's other templates assume without a GPU), by a patch
  of the algo module's ``get_mem_from_visible_gpus`` that is restored afterwards. The template's files are not
  touched (their hashes are how a bundle is recognised).
- **Reading**: DiNTS's reader (``autotune.auto3dseg.templates.dints.train_py_values``) over every key at the top
  level of ``hyper_parameters.yaml`` (no ``training#``). ``num_sw_batch_size`` is an expression,
  ``$@num_patches_per_iter``, which MONAI resolves.
- **The step** is ``scripts/train.py``'s: ``network`` through ``ConfigParser`` (SwinUNETR, feature size 48,
  windowed attention), ``loss`` (DiceCELoss), ``optimizer`` (AdamW); a loader batch of ``num_images_per_batch
  x num_crops_per_image`` patches on the host, shuffled by a permutation and stepped through in passes of
  ``num_patches_per_iter`` with ``loss(outputs.float(), labels)``, gradient clipping to 0.5 and the GradScaler
  under AMP on CUDA: DiNTS's loop, line for line (``autotune.auto3dseg.templates.dints.train_py_loop``). Its labels stay uint8
  (``CastToTyped`` and only flips and 90-degree rotations after it), DiNTS's come out float32.
- **Validation** of one case (``validate``): ``sliding_window_inference`` (Gaussian, ``overlap_ratio``) with the
  input and output on the device, or on the CPU (``sw_input_on_cpu``), then ``post_pred`` (argmax, or sigmoid
  and threshold) and ``compute_dice`` as ``train.py`` runs them.
- **Write-back** (DiNTS's ``train_py_updates`` at the top level): ``num_patches_per_iter``, ``num_images_per_batch``, ``num_crops_per_image``,
  ``num_sw_batch_size`` (a plain value in place of the template's expression), ``sw_input_on_cpu``,
  ``learning_rate`` where it changed, and ``auto_scale_allowed: false`` (``train.py``'s ``pre_operation`` would
  otherwise recompute the batch from the GPU's free memory).
- **The launcher on the CPU** (``cuda_on_cpu``): ``train.py`` hard-codes ``cuda:0`` and asks
  ``torch.cuda.device_count() == 1 or dist.get_rank() == 0``; run on the CPU, the launcher counts one device
  and moves every tensor meant for ``cuda`` to the CPU (and ``torch.load``'s ``map_location`` with it). AMP
  and the GradScaler turn themselves off there, as MONAI's ``autocast("cuda")`` does on any CPU.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from autotune.auto3dseg.templates.base import ConfigReader, KnownVersion, MonaiTemplate, known_version
from autotune.auto3dseg.templates.dints import train_py_loop, train_py_updates, train_py_values

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

__all__ = ["SwinUNETR", "DEFAULT_GENERATION_MEMORY", "generation_memory", "visible_gpu_memory", "build", "validate",
           "cuda_on_cpu", "LABEL_DTYPE"]

#: what ``auto_scale`` is given where no device, limit or target says otherwise and no GPU is visible
DEFAULT_GENERATION_MEMORY = 16 * 1024**3
#: the dtype of a loader batch's labels (``CastToTyped`` uint8, then only flips and 90-degree rotations)
LABEL_DTYPE = "uint8"
SW_OVERLAP = 0.125  # overlap_ratio: the validation during training


# ---------------------------------------------------------------------------------------------------- generation

def generation_memory(tune_kwargs: Mapping[str, Any], target_gpu_memory: Callable[[str], int] | None = None
                      ) -> int | None:
    """The memory ``auto_scale`` sizes the generated batch for, in bytes: the target GPU when planning
    (``target_memory``, or ``target_gpu`` through ``target_gpu_memory``), else ``memory_limit``, else the total
    memory of a ``cuda`` ``device``; None on a host whose GPUs MONAI can read itself (nothing said, a GPU
    visible); ``DEFAULT_GENERATION_MEMORY`` otherwise.

    Raises:
        SpecError / ConfigError: a bad size or an unknown target GPU (as ``autotune.tune`` says it).
    """
    from autotune.device import device_total_memory, resolve_device
    from autotune.errors import SpecError
    from autotune.utils import parse_bytes

    if tune_kwargs.get("target_memory"):
        return parse_bytes(tune_kwargs["target_memory"], "target_memory")
    if tune_kwargs.get("target_gpu") and target_gpu_memory is not None:
        return int(target_gpu_memory(str(tune_kwargs["target_gpu"])))
    if tune_kwargs.get("memory_limit") is not None:
        limit = tune_kwargs["memory_limit"]
        if isinstance(limit, bool):
            raise SpecError(f"memory_limit must be a size such as '8GiB', got {limit!r}")
        return parse_bytes(limit, "memory_limit")
    said = tune_kwargs.get("device") not in (None, "auto")
    device = resolve_device(str(tune_kwargs.get("device") or "auto"))
    if device.startswith("cuda"):
        return None if not said else device_total_memory(device)
    return DEFAULT_GENERATION_MEMORY


@contextlib.contextmanager
def visible_gpu_memory(algos: Any, memory: int | None) -> Iterator[None]:
    """While inside, the SwinUNETR algo modules of ``algos`` (MONAI's ``BundleAlgo`` objects) read one GPU of
    ``memory`` free bytes (``get_mem_from_visible_gpus``); restored on the way out. None: nothing is patched."""
    modules = []
    for algo in algos or []:
        module = sys.modules.get(type(algo).__module__)
        if getattr(algo, "name", None) == SwinUNETR.name and hasattr(module, "get_mem_from_visible_gpus"):
            modules.append(module)
    if memory is None or not modules:
        yield
        return
    saved = [(m, m.get_mem_from_visible_gpus) for m in modules]
    for module in modules:
        module.get_mem_from_visible_gpus = lambda: [int(memory)]
    try:
        yield
    finally:
        for module, original in saved:
            module.get_mem_from_visible_gpus = original


# ------------------------------------------------------------------------------------------------- probe parts

def _linspace_on_cpu() -> Any:
    """A mode computing ``torch.linspace`` on the CPU: SwinUNETR's constructor reads its drop-path rates with
    ``.item()``, which a tensor on the meta device (the estimator builds there) cannot give."""
    import torch
    from torch.overrides import TorchFunctionMode

    class LinspaceOnCpu(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if func is torch.linspace:
                kwargs["device"] = "cpu"
            return func(*args, **kwargs)

    return LinspaceOnCpu()


def build(parser: Any) -> tuple[Any, Any, Any, Any]:
    """(network, loss, optimizer section, None) as SwinUNETR's ``train.py`` builds them."""
    import io

    with io.StringIO() as buffer, contextlib.redirect_stdout(buffer), _linspace_on_cpu():  # train.py silences
        model = parser.get_parsed_content("network")  # the network's prints
    loss = parser.get_parsed_content("loss")
    optimizer = parser.get_parsed_content("optimizer", instantiate=False)
    return model, loss, optimizer, None


def _post_pred(outputs: Any, softmax: bool) -> Any:
    """``train.py``'s ``post_pred`` in the tensors it allocates (``EnsureType`` wraps without a copy): an argmax
    returned as float32 (``AsDiscrete(argmax=True)``), or sigmoid then threshold 0.5 as float32. Plain torch
    operations, so that the estimator's fake tensors run it too."""
    import torch

    if softmax:
        return torch.argmax(outputs, dim=0, keepdim=True).to(torch.float32)
    return (torch.sigmoid(outputs) >= 0.5).to(torch.float32)


def validate(model: Any, volume: Any, label: Any, config: BundleConfig, sw_batch_size: int, device: Any,
             amp_dtype: Any, score: bool = True) -> Any:
    """One case of SwinUNETR ``train.py``'s validation: the sliding window with its input and output where the
    volume is (the device, or the CPU for ``sw_input_on_cpu``), ``post_pred`` and ``compute_dice`` there."""
    import torch
    from monai.inferers import sliding_window_inference
    from monai.metrics import compute_dice

    device = torch.device(device)
    device_io = volume.device
    roi = config.validation_roi
    softmax = not config.sigmoid
    with torch.no_grad():
        with torch.autocast(device.type, dtype=torch.float16, enabled=amp_dtype is torch.float16):
            val_outputs = sliding_window_inference(
                inputs=volume.to(device_io), roi_size=roi, sw_batch_size=int(sw_batch_size), predictor=model,
                mode="gaussian", overlap=config.sw_overlap, sw_device=device, device=device_io)
        if not score:
            return val_outputs
        val_outputs = _post_pred(val_outputs[0, ...], softmax)
        val_outputs = val_outputs[None, ...]
        return compute_dice(y_pred=val_outputs, y=label.to(val_outputs.device), include_background=not softmax,
                            num_classes=config.output_classes).to(device)


# ---------------------------------------------------------------------------------------------------- launcher

def _on_cpu(value: Any) -> Any:
    import torch

    if isinstance(value, torch.device) and value.type == "cuda":
        return torch.device("cpu")
    if isinstance(value, str) and value.startswith("cuda"):
        return "cpu"
    return value


def _cuda_to_cpu_mode() -> Any:
    from torch.overrides import TorchFunctionMode

    class CudaOnCpu(TorchFunctionMode):
        """Every ``device=cuda`` argument (and ``Tensor.to(cuda)``) of a torch function becomes the CPU."""

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if "device" in kwargs:
                kwargs["device"] = _on_cpu(kwargs["device"])
            if getattr(func, "__name__", "") in ("to", "_to_copy") and args:
                args = (args[0], *(_on_cpu(a) for a in args[1:]))
            return func(*args, **kwargs)

    return CudaOnCpu()


@contextlib.contextmanager
def cuda_on_cpu() -> Iterator[None]:
    """SwinUNETR's ``train.py`` on the CPU: one device counted, ``cuda`` tensors and ``torch.load`` maps on the CPU."""
    import torch

    count, load = torch.cuda.device_count, torch.load

    def load_on_cpu(*args: Any, **kwargs: Any) -> Any:
        if "map_location" in kwargs:
            kwargs["map_location"] = _on_cpu(kwargs["map_location"])
        return load(*args, **kwargs)

    torch.cuda.device_count = lambda: 1  # train.py: device_count() == 1 or dist.get_rank() == 0
    torch.load = load_on_cpu
    try:
        with _cuda_to_cpu_mode():
            yield
    finally:
        torch.cuda.device_count, torch.load = count, load


# ---------------------------------------------------------------------------------------------------- template

class SwinUNETR(MonaiTemplate):
    """MONAI's SwinUNETR template (see the module docstring)."""

    name: ClassVar[str] = "swinunetr"
    spec_aliases: ClassVar[tuple[str, ...]] = ("swunetr",)  # scripts/algo.py, customize_param_for_gpu (sic)
    versions: ClassVar[Mapping[str, KnownVersion]] = {
        "21ed8e5": known_version(
            configs=('hyper_parameters.yaml', 'network.yaml', 'transforms_infer.yaml', 'transforms_train.yaml', 'transforms_validate.yaml'),
            files={
                "scripts/__init__.py": "b3d76349dea4bd588f9c5bcc475d4381ddf42efe2863a15a3c9af86592592ead",
                "scripts/algo.py": "8b418221bb87efecd221bc5d4b9176088358b4045629ac86d93926a60eb8a2d1",
                "scripts/dummy_runner.py": "90f25b86a5b7d424a6bb7831b275906c2cc8f741dc833c140428ddb488070286",
                "scripts/infer.py": "9bbe4488c2784d1f6705f7751721ec141062d721f568653651222fb73b9f89c9",
                "scripts/train.py": "76a60432dbb6f0ded0148cfa3aac8940b201d6b4fcfd6c2e6b2804e0e5d9a1a9",
                "scripts/validate.py": "dda87535e4dfad8b27f50055abe99c2aec6d4121553264fe07ea67135683ba7f",
            },
        ),
    }
    keys: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "num_patches_per_iter": ("num_patches_per_iter", "num_images_per_batch", "num_crops_per_image",
                                 "auto_scale_allowed"),
        "num_sw_batch_size": ("num_sw_batch_size",),
        "validation_device": ("sw_input_on_cpu",),
    }

    def view_values(self, reader: ConfigReader) -> dict[str, Any]:
        """``train.py``'s values at the top level; the sliding window's batch is the pass's when unset."""
        sw_default = reader.get("num_patches_per_iter")
        extra = {"use_pretrain": bool(reader.get("use_pretrain", False)), "loader_label_dtype": LABEL_DTYPE}
        return train_py_values(reader, "", sw_default, "overlap_ratio", reader.get("num_epochs", 1000) or 1000,
                               reader.section("network"), extra)

    def updates(self, view: Mapping[str, Any], updates: Mapping[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
        return train_py_updates(view, updates, "", tie_sw=True)

    def build(self, parser: Any, config: BundleConfig) -> tuple[Any, Any, Any, Any]:
        return build(parser)

    def training_loop(self, model: Any, loss_fn: Any, optimizer: Any, accuracy: Any, batch: Any,
                      num_patches_per_iter: int, amp_dtype: Any, config: BundleConfig) -> Iterator[None]:
        return train_py_loop(model, loss_fn, optimizer, batch, num_patches_per_iter, amp_dtype)

    def validate(self, model: Any, volume: Any, label: Any, config: BundleConfig, sw_batch_size: int,
                 device: Any, amp_dtype: Any, accuracy: Any, score: bool) -> Any:
        return validate(model, volume, label, config, sw_batch_size, device, amp_dtype, score=score)

    def cpu_context(self) -> contextlib.AbstractContextManager[None] | None:
        return cuda_on_cpu()

    def generation_context(self, algos: Any, tune_kwargs: Mapping[str, Any],
                           target_gpu_memory: Callable[[str], int] | None) -> contextlib.AbstractContextManager[None] | None:
        return visible_gpu_memory(algos, generation_memory(tune_kwargs, target_gpu_memory))
