"""MONAI's DiNTS template: its ``scripts/train.py``, as autotune reads, builds, runs and writes it.

- **Reading** (``train_py_values``, shared with SwinUNETR, whose ``train.py`` reads the same keys at the top
  level): loader batches of ``num_images_per_batch x num_crops_per_image`` patches, stepped through in
  passes of ``num_patches_per_iter``, every key under ``training#``. The pickled architecture code
  (``scripts/arch_code.pth``, ``torch.load(..., weights_only=False)`` on ``cuda`` in the template) is loaded
  only after its hash is checked, with ``weights_only=True`` (``load_arch_code``).
- **The network**: ``training_network#network``, ``training#loss``, ``training#optimizer``; for the estimator,
  its topology tests turned into plain values (``StaticTopologyInstance``: MONAI's forward reads each path's
  activation from a tensor).
- **The step** (``train_py_loop``, SwinUNETR's too): the host batch shuffled by a permutation (a copy), split
  into passes of ``num_patches_per_iter`` moved to the device; ``loss(outputs.float(), labels)``, backward,
  gradient clipping to 0.5 (after unscaling with AMP), the optimizer step; the previous pass's outputs stay
  alive through the next forward.
- **Validation**: ``sliding_window_inference`` (``overlap_ratio_train``), input and output on the device or on
  the CPU (``sw_input_on_cpu``), the argmax and per-class Dice as ``train.py`` computes them.
- **Write-back** (``train_py_updates``): ``training#num_patches_per_iter``, ``training#num_images_per_batch``,
  ``training#num_crops_per_image``, ``training#num_sw_batch_size``, ``training#sw_input_on_cpu``, and
  ``training#learning_rate`` where it changed; ``training#auto_scale_allowed: false`` so that ``train.py``'s
  ``pre_operation`` does not overwrite them from its memory formula.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from autotune.auto3dseg.templates.base import (
    ConfigReader,
    KnownVersion,
    MonaiTemplate,
    file_sha256,
    known_version,
)
from autotune.errors import ConfigError
from autotune.utils import plain_data

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from autotune.bundles.model import BundleConfig

__all__ = ["DiNTS", "load_arch_code", "train_py_values", "train_py_updates", "train_py_loop",
           "static_topology_target"]

SW_OVERLAP = 0.125  # overlap_ratio_train: the validation during training


def load_arch_code(root: Path, expected_sha256: str | None, label: str = "dints") -> dict[str, Any]:
    """DiNTS's ``scripts/arch_code.pth``, hash-checked, then loaded with ``weights_only=True`` on the CPU.

    Raises:
        ConfigError: its hash differs from the known version's (checked again here: it is a pickle).
    """
    import numpy as np
    import torch

    path = root / "scripts" / "arch_code.pth"
    if expected_sha256 is None or not path.is_file() or file_sha256(path) != expected_sha256:
        raise ConfigError(f"{path}: differs from MONAI's {label} architecture code; regenerate the bundle")
    # the file holds numpy arrays (node_a, code_a, code_c): allow exactly what rebuilds them
    rebuild = getattr(np, "_core", np.core).multiarray._reconstruct
    allowed = [(rebuild, "numpy.core.multiarray._reconstruct"), (rebuild, "numpy._core.multiarray._reconstruct"),
               np.ndarray, np.dtype, *(type(np.dtype(kind)) for kind in ("int64", "int32", "float64", "float32"))]
    with torch.serialization.safe_globals(allowed):
        return dict(torch.load(path, map_location="cpu", weights_only=True))


def train_py_values(reader: ConfigReader, prefix: str, sw_batch_default: Any, overlap_key: str, epochs: Any,
                    network: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """The values of a ``train.py`` that steps through its loader batch in passes of ``num_patches_per_iter``
    (DiNTS: keys under ``training#``; SwinUNETR: at the top level): ``prefix`` the keys' section,
    ``sw_batch_default`` the sliding window's batch when unset, ``overlap_key`` the template's, ``epochs`` its
    number of epochs, ``network`` its section, ``extra`` values of its own (placed before ``fold``)."""
    def get(key: str, default: Any = None) -> Any:
        return reader.get(prefix + key, default)

    roi = reader.xyz(get("roi_size"), prefix + "roi_size")
    sw_batch = get("num_sw_batch_size")
    source = (f"{prefix}num_patches_per_iter {get('num_patches_per_iter')} patches per optimizer step (train.py "
              f"steps through its loader batch of num_images_per_batch {get('num_images_per_batch')} x "
              f"num_crops_per_image {get('num_crops_per_image')} in passes of it)")
    return {
        "batch_source": source,
        "roi_size": roi, "roi_size_valid": reader.xyz(get("roi_size_valid", roi), prefix + "roi_size_valid"),
        "input_channels": int(get("input_channels")), "output_classes": int(get("output_classes")),
        "num_patches_per_iter": int(get("num_patches_per_iter")),
        "num_images_per_batch": int(get("num_images_per_batch")),
        "num_crops_per_image": int(get("num_crops_per_image")),
        "num_sw_batch_size": int(sw_batch) if sw_batch is not None else int(sw_batch_default),
        "sw_input_on_cpu": bool(get("sw_input_on_cpu", False)), "sw_overlap": float(get(overlap_key, SW_OVERLAP)),
        "amp": bool(get("amp", True)), "learning_rate": float(get("learning_rate")),
        "resample_resolution": reader.xyz(get("resample_resolution", [1.0, 1.0, 1.0]), prefix + "resample_resolution",
                                          float),
        "num_epochs": int(epochs), "sigmoid": not bool(get("softmax", True)),
        "seed": int(get("random_seed", 0) or 0), "auto_scale_allowed": bool(get("auto_scale_allowed", False)),
        **extra,
        "fold": int(reader.get("fold", 0)),
        "datalist": str(reader.get("data_list_file_path")),
        "dataroot": str(reader.get("data_file_base_dir")),
        "network": network, "loss": reader.section(prefix + "loss"), "optimizer": reader.section(prefix + "optimizer"),
    }


def train_py_updates(view: Mapping[str, Any], updates: Mapping[str, Any], prefix: str, tie_sw: bool) -> dict[str, Any]:
    """A ``train.py``'s loader and pass keys as they are, under ``prefix``; ``tie_sw``: the template ties
    ``num_sw_batch_size`` to ``num_patches_per_iter`` by expression, so it is written with the batch."""
    out: dict[str, Any] = {}
    for key in ("num_patches_per_iter", "num_images_per_batch", "num_crops_per_image"):
        if key in updates:
            out[prefix + key] = int(updates[key])
    if "num_sw_batch_size" in updates or (tie_sw and out):
        out[prefix + "num_sw_batch_size"] = int(updates.get("num_sw_batch_size", view["num_sw_batch_size"]))
    if "sw_input_on_cpu" in updates:
        out[prefix + "sw_input_on_cpu"] = bool(updates["sw_input_on_cpu"])
    if "learning_rate" in updates and float(updates["learning_rate"]) != float(view["learning_rate"]):
        out[prefix + "learning_rate"] = float(updates["learning_rate"])
    if out:
        out[prefix + "auto_scale_allowed"] = False
    return out


def train_py_loop(model: Any, loss_function: Any, optimizer: Any, batch: Any, num_patches_per_iter: int,
                  amp_dtype: Any) -> Iterator[None]:
    """DiNTS ``train.py``'s loop over one loader batch per iteration."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    model.train()
    device = next(model.parameters()).device
    use_amp = amp_dtype is torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=device.type == "cuda") if use_amp else None
    try:
        from apex.contrib.clip_grad import clip_grad_norm_  # type: ignore[import-not-found]  # as train.py
    except ModuleNotFoundError:
        from torch.nn.utils import clip_grad_norm_
    loss_torch = torch.zeros(2, dtype=torch.float, device=device)
    n = int(num_patches_per_iter)
    while True:
        inputs_l, labels_l = batch[0], batch[1]
        _idx = torch.randperm(inputs_l.shape[0])
        inputs_l, labels_l = inputs_l[_idx], labels_l[_idx]
        for _k in range(inputs_l.shape[0] // n):
            inputs = inputs_l[_k * n: (_k + 1) * n, ...]
            labels = labels_l[_k * n: (_k + 1) * n, ...]
            inputs = inputs.to(device)
            labels = labels.to(device)
            for param in model.parameters():
                param.grad = None
            if scaler is not None:
                with torch.autocast(device.type, dtype=torch.float16):
                    outputs = model(inputs)
                    loss = loss_function(outputs.float(), labels)
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                clip_grad_norm_(model.parameters(), 0.5)
                scaler.step(optimizer)
                scaler.update()
            else:
                outputs = model(inputs)
                loss = loss_function(outputs.float(), labels)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                optimizer.step()
            loss_torch[0] += 0.0 if isinstance(loss, FakeTensor) else loss.item()
            loss_torch[1] += 1.0
        yield


def static_topology_target() -> str:
    """The ``_target_`` of ``StaticTopologyInstance`` (for ``training_network#dints_space``)."""
    return f"{__name__}.StaticTopologyInstance"


class DiNTS(MonaiTemplate):
    """MONAI's DiNTS template (see the module docstring)."""

    name: ClassVar[str] = "dints"
    versions: ClassVar[Mapping[str, KnownVersion]] = {
        "21ed8e5": known_version(
            configs=('hyper_parameters.yaml', 'hyper_parameters_search.yaml', 'network.yaml', 'network_search.yaml', 'transforms_infer.yaml', 'transforms_train.yaml', 'transforms_validate.yaml'),
            files={
                "scripts/__init__.py": "b3d76349dea4bd588f9c5bcc475d4381ddf42efe2863a15a3c9af86592592ead",
                "scripts/algo.py": "216830943f2056729294225b16786e9b88ef793ee42c2f360fc568c593116347",
                "scripts/arch_code.pth": "cbd8418d29563d32c1fac23a2ad05ec847b926176595aaff27a1b4b1167b3d97",
                "scripts/dummy_runner.py": "fa134f44090da1cf123b427bb097d09fed36caba4288e210661f4d8715dff337",
                "scripts/infer.py": "be1f2bc28fb526d384deddd5c0a0774068246e6cb71c4e7983e021473bf5fb4c",
                "scripts/search.py": "70b1affaa36eed6d844bfd75717c49f6fad366dc94bae864a9e6e566d70c4ce4",
                "scripts/train.py": "eabbea9ca246dba5eccce75562b4cd515ec5466f8b4a83e442ab8836890889b4",
                "scripts/utils.py": "cccc6f6639e5577baf4f9af71c4a9c141139f80be1e6e993edc828bd674518d7",
                "scripts/validate.py": "f68cfa0cf819d89ef8eacc72f0f308de8c36a8feeea0e6b8464aed063d2c74d9",
            },
        ),
    }
    keys: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "num_patches_per_iter": ("training#num_patches_per_iter", "training#num_images_per_batch",
                                 "training#num_crops_per_image", "training#auto_scale_allowed"),
        "num_sw_batch_size": ("training#num_sw_batch_size",),
        "validation_device": ("training#sw_input_on_cpu",),
    }

    def prepare_parser(self, parser: Any, root: Path, device: str, arch_sha256: str | None) -> None:
        """``training_network#arch_ckpt`` becomes the architecture code checked against ``arch_sha256`` (None: not
        loaded, nothing can load it), and ``dints_space#device`` becomes ``device``."""
        import torch

        label = f"{self.name} (sha256 {str(arch_sha256)[:12]})"
        parser["training_network#arch_ckpt"] = load_arch_code(root, arch_sha256, label) if arch_sha256 else None
        parser["training_network#dints_space#device"] = torch.device(device)

    def view_values(self, reader: ConfigReader) -> dict[str, Any]:
        space = {k: reader.get(f"training_network#dints_space#{k}")
                 for k in ("num_blocks", "num_depths", "channel_mul", "use_downsample")}
        return train_py_values(reader, "training#", 1, "overlap_ratio_train",  # sw batch: train.py's 1
                               reader.get("training#num_epochs", 200), {"name": "DiNTS", "args": plain_data(space)}, {})

    def updates(self, view: Mapping[str, Any], updates: Mapping[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
        return train_py_updates(view, updates, "training#", tie_sw=False)

    def static_topology(self, parser: Any) -> None:
        parser["training_network#dints_space#_target_"] = static_topology_target()

    def build(self, parser: Any, config: BundleConfig) -> tuple[Any, Any, Any, Any]:
        with io.StringIO() as buffer, contextlib.redirect_stdout(buffer):  # train.py silences the roi hint so
            model = parser.get_parsed_content("training_network#network")
        loss = parser.get_parsed_content("training#loss")
        optimizer = parser.get_parsed_content("training#optimizer", instantiate=False)
        return model, loss, optimizer, None

    def training_loop(self, model: Any, loss_fn: Any, optimizer: Any, accuracy: Any, batch: Any,
                      num_patches_per_iter: int, amp_dtype: Any, config: BundleConfig) -> Iterator[None]:
        return train_py_loop(model, loss_fn, optimizer, batch, num_patches_per_iter, amp_dtype)

    def validate(self, model: Any, volume: Any, label: Any, config: BundleConfig, sw_batch_size: int,
                 device: Any, amp_dtype: Any, accuracy: Any, score: bool) -> Any:
        from autotune.auto3dseg.validation import validate_dints

        return validate_dints(model, volume, label, config, sw_batch_size, device, amp_dtype, score=score)


def _static_topology_class() -> type:
    from monai.networks.nets import TopologyInstance

    class StaticTopologyInstance(TopologyInstance):
        """MONAI's ``TopologyInstance`` whose path activations are Python values: the same forward, the same
        tensors, and no tensor read (``if activation:``), so it runs on fake tensors."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.active_paths = [[bool(v) for v in row] for row in self.arch_code_a.detach().cpu().tolist()]

        def forward(self, x: list[torch.Tensor]) -> list[torch.Tensor]:  # noqa: D102 - TopologyInstance.forward
            import torch

            inputs = x
            for blk_idx in range(self.num_blocks):
                outputs = [torch.tensor(0.0, dtype=x[0].dtype, device=x[0].device)] * self.num_depths
                for res_idx, _activation in enumerate(self.arch_code_a[blk_idx].data):  # MONAI's reads of the code
                    if self.active_paths[blk_idx][res_idx]:
                        mod = self.cell_tree[str((blk_idx, res_idx))]
                        _out = mod.forward(x=inputs[self.arch_code2in[res_idx]], weight=None)
                        outputs[self.arch_code2out[res_idx]] = outputs[self.arch_code2out[res_idx]] + _out
                inputs = outputs
            return inputs

    return StaticTopologyInstance


def __getattr__(name: str) -> Any:  # the class is made on first use so that importing this module stays cheap
    if name == "StaticTopologyInstance":
        cls = _static_topology_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
