"""MONAI's SegResNet template: ``scripts/segmenter.py``'s ``Segmenter``, as autotune reads, builds, runs and writes it.

- **Reading**: one optimizer step per loader batch of ``batch_size`` x ``num_crops_per_image`` patches (split
  into ``num_steps_per_image`` steps when that is set); the ``sliding_inferrer`` the bundle names, else
  Segmenter's default ``SlidingWindowInfererAdapt`` (overlap 0.625).
- **The network** follows ``Segmenter.setup_model`` and ``Segmenter.__init__``: the ``network`` section through
  ``ConfigParser`` with its ``INSTANCE_NVFUSER`` norm resolved as there, channels-last,
  ``DeepSupervisionLoss`` around the ``loss`` section, ``DiceHelper`` as the training accuracy.
- **The step** (``Segmenter.train_epoch``): the batch moved to the device channels-last, gradients set to
  None, the forward under ``autocast`` (fp16, CUDA only), ``DeepSupervisionLoss`` outside it, the
  GradScaler's step, then the training Dice on the first output. The loop's variables live as long as
  there: the previous step's first output stays alive (as ``pred``) through the next step.
- **Validation**: ``Segmenter.val_epoch`` (``autotune.auto3dseg.validation.validate_segresnet``).
- **Write-back**: the step batch as the template's own auto-scaling lays it out (crop mode ``ratio``:
  ``num_crops_per_image`` crops of one image, ``batch_size: 1``; else ``batch_size`` images of one crop),
  a ``sliding_inferrer`` (``SlidingWindowInfererAdapt``, the tuned ``sw_batch_size``, stitched on the CPU
  when validation was tuned there), ``learning_rate`` where it changed, and ``auto_scale_allowed: false``
  so that ``auto_adjust_network_settings`` (batch from GPU GiB / 16) and ``train()`` leave them.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from autotune.auto3dseg.templates.base import ConfigReader, KnownVersion, MonaiTemplate, known_version

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

__all__ = ["SegResNet", "SW_OVERLAP", "segmenter_loop", "segmenter_updates"]

SW_OVERLAP = 0.625  # Segmenter's default SlidingWindowInfererAdapt


def segmenter_loop(model: Any, loss_function: Any, optimizer: Any, accuracy: Any, batch: Any,
                   amp_dtype: Any, config: BundleConfig) -> Iterator[None]:
    """``Segmenter.train_epoch``, one loader batch per iteration (``num_steps_per_image`` 1)."""
    import torch

    model.train()
    device = next(model.parameters()).device
    memory_format = torch.channels_last_3d if config.channels_last else torch.preserve_format
    use_amp = amp_dtype is torch.float16
    grad_scaler = torch.amp.GradScaler("cuda", enabled=use_amp and device.type == "cuda")
    sigmoid = config.sigmoid
    while True:
        batch_data = {"image": batch[0], "label": batch[1]}
        data = batch_data["image"].as_subclass(torch.Tensor).to(memory_format=memory_format, device=device)
        target = batch_data["label"].as_subclass(torch.Tensor).to(memory_format=memory_format, device=device)
        data_list, target_list = [data], [target]
        data, target = data_list[0], target_list[0]
        for param in model.parameters():
            param.grad = None
        with torch.autocast(device.type, dtype=torch.float16, enabled=use_amp):
            logits = model(data)
        loss = loss_function(logits, target)
        grad_scaler.scale(loss).backward()
        grad_scaler.step(optimizer)
        grad_scaler.update()
        with torch.no_grad():
            pred = logits[0] if isinstance(logits, (list, tuple)) else logits  # logits2pred(skip_softmax=True)
            if sigmoid:
                pred = torch.sigmoid(pred)
            acc = accuracy(pred, target)
        if isinstance(acc, (list, tuple)):
            acc, batch_size_adjusted = acc  # noqa: F841 - alive until the next step, as in train_epoch
        yield


def segmenter_updates(view: Mapping[str, Any], updates: Mapping[str, Any], raw: Mapping[str, Any], overlap: Any,
                      cache_weights: bool) -> dict[str, Any]:
    """Segmenter's (and Segmenter2D's) keys: the step batch laid out as ``train()`` lays out its own, and the
    sliding inferrer it makes with ``overlap`` (per axis for the 2D one) and ``cache_weights``."""
    out: dict[str, Any] = {}
    if "num_images_per_batch" in updates or "num_patches_per_iter" in updates:
        crops = int(updates.get("num_crops_per_image", view["num_crops_per_image"]))
        images = int(updates.get("num_images_per_batch") or updates["num_patches_per_iter"])
        patches = images * crops  # one optimizer step per loader batch
        ratio = str(raw.get("crop_mode", "ratio")) == "ratio"
        out.update(num_crops_per_image=patches if ratio else 1, batch_size=1 if ratio else patches,
                   auto_scale_allowed=False)
        if raw.get("num_steps_per_image") not in (None, 1):
            out["num_steps_per_image"] = 1
    if "num_sw_batch_size" in updates or "sw_input_on_cpu" in updates:
        inferrer: dict[str, Any] = {
            "_target_": "SlidingWindowInfererAdapt", "roi_size": list(view["roi_size_valid"]),
            "sw_batch_size": int(updates.get("num_sw_batch_size", view["num_sw_batch_size"])),
            "overlap": overlap, "mode": "gaussian", "cache_roi_weight_map": cache_weights, "progress": False,
        }
        if updates.get("sw_input_on_cpu", view["sw_input_on_cpu"]):
            inferrer["device"] = "cpu"
        out["sliding_inferrer"] = inferrer
    if "learning_rate" in updates and float(updates["learning_rate"]) != float(view["learning_rate"]):
        out["learning_rate"] = float(updates["learning_rate"])
    return out


def _network_config(parser: Any, config: BundleConfig) -> dict[str, Any]:
    """The ``network`` section as ``Segmenter.setup_model`` hands it to ``ConfigParser``."""
    from monai.networks.layers.factories import split_args
    from monai.utils import optional_import

    network = copy.deepcopy(dict(parser.get_parsed_content("network", instantiate=False).get_config()))
    spatial_dims = network.get("spatial_dims", 3)
    norm_name, norm_args = split_args(network.get("norm", ""))
    norm_name = norm_name.upper()
    if norm_name == "INSTANCE_NVFUSER":
        _, has_nvfuser = optional_import("apex.normalization", name="InstanceNorm3dNVFuser")
        if has_nvfuser and spatial_dims == 3:
            act = network.get("act", "relu")
            if isinstance(act, str):
                network["act"] = [act, {"inplace": False}]
        else:
            norm_name = "INSTANCE"
    if len(norm_name) > 0:
        network["norm"] = norm_name if len(norm_args) == 0 else [norm_name, norm_args]
    anisotropic = bool(parser.get_parsed_content("anisotropic_scales")) if "anisotropic_scales" in parser else False
    if spatial_dims == 3 and anisotropic and "SegResNetDS" in str(network["_target_"]):
        network["resolution"] = list(config.resample_resolution)
    return network


class SegResNet(MonaiTemplate):
    """MONAI's SegResNet template (see the module docstring)."""

    name: ClassVar[str] = "segresnet"
    versions: ClassVar[Mapping[str, KnownVersion]] = {
        "21ed8e5": known_version(
            configs=('hyper_parameters.yaml',),
            files={
                "scripts/__init__.py": "b3d76349dea4bd588f9c5bcc475d4381ddf42efe2863a15a3c9af86592592ead",
                "scripts/algo.py": "37e2d6ff0d7244fe734949aa5ace5ac64306b3002bdc3dacefad745d4fec7a8b",
                "scripts/infer.py": "55d90df3430f0b11740c04c232d85038077d5395863963ef350f7f11c14ae93c",
                "scripts/segmenter.py": "0477831782c5855966f2a4dd3c5079f1bc93b7d2e6331e6a0badde6e40b41d43",
                "scripts/train.py": "35929803646ddc9c94251600f47b0b67881cf2e07668295f2412cbb10f141024",
                "scripts/utils.py": "a66d447c1f77d7f20f63b19ce92c4cd9a7684134865c92c544e75c14b4e805d5",
                "scripts/validate.py": "958a94e384fa01244d1b863848816306f018c8fd7de2d49b5cbdef54a0a3c4d0",
            },
        ),
    }
    keys: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "num_patches_per_iter": ("batch_size", "num_crops_per_image", "num_steps_per_image", "auto_scale_allowed"),
        "num_sw_batch_size": ("sliding_inferrer#sw_batch_size",),
        "validation_device": ("sliding_inferrer#device",),
    }
    validates_without_gradients: ClassVar[bool] = True  # train_epoch sets them to None

    def view_values(self, reader: ConfigReader) -> dict[str, Any]:
        get = reader.get
        batch = int(get("batch_size", 1))
        crops = int(get("num_crops_per_image", 1))
        steps = int(get("num_steps_per_image", None) or 1)
        inferrer = reader.raw("sliding_inferrer")
        sw_batch, overlap, sw_cpu = 1, SW_OVERLAP, False
        if isinstance(inferrer, Mapping):
            sw_batch = int(get("sliding_inferrer#sw_batch_size", 1))
            overlap = float(get("sliding_inferrer#overlap", SW_OVERLAP))
            sw_cpu = str(get("sliding_inferrer#device", "") or "") == "cpu"
        roi = reader.xyz(get("roi_size"), "roi_size")
        per_step = f" / num_steps_per_image {steps}" if steps > 1 else ""
        source = f"batch_size {batch} x num_crops_per_image {crops}{per_step}"
        return {
            "roi_size": roi, "roi_size_valid": roi, "batch_source": f"{source} patches per optimizer step",
            "input_channels": int(get("input_channels")),
            "output_classes": int(get("output_classes")),
            "num_patches_per_iter": max(1, batch * crops // steps),
            "num_images_per_batch": max(1, batch * crops // steps), "num_crops_per_image": 1,
            "num_sw_batch_size": sw_batch, "sw_input_on_cpu": sw_cpu, "sw_overlap": overlap,
            "amp": bool(get("amp", True)),
            "learning_rate": float(get("learning_rate")),
            "resample_resolution": reader.xyz(get("resample_resolution", [1.0, 1.0, 1.0]), "resample_resolution",
                                              float),
            "num_epochs": int(get("num_epochs", 300)),
            "sigmoid": bool(get("sigmoid", False)), "seed": 0,
            "channels_last": bool(get("channels_last", True)),
            "auto_scale_allowed": bool(get("auto_scale_allowed", False)),
            "fold": int(get("fold", 0)),
            "datalist": str(get("data_list_file_path")),
            "dataroot": str(get("data_file_base_dir")),
            "network": reader.section("network"), "loss": reader.section("loss"),
            "optimizer": reader.section("optimizer"),
        }

    def updates(self, view: Mapping[str, Any], updates: Mapping[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
        return segmenter_updates(view, updates, raw, float(view["sw_overlap"]), True)

    def build(self, parser: Any, config: BundleConfig) -> tuple[Any, Any, Any, Any]:
        import warnings

        from monai.bundle import ConfigParser
        from monai.losses import DeepSupervisionLoss
        from monai.metrics import DiceHelper

        model = ConfigParser(_network_config(parser, config)).get_parsed_content()
        loss = DeepSupervisionLoss(ConfigParser(parser.get_parsed_content("loss", instantiate=False).get_config())
                                   .get_parsed_content(instantiate=True))
        ignore_empty = bool(parser.get_parsed_content("dice_ignore_empty")) if "dice_ignore_empty" in parser else True
        with warnings.catch_warnings():  # the template's own call; MONAI 1.5+ warns that 'sigmoid' is deprecated
            warnings.simplefilter("ignore", FutureWarning)
            accuracy = DiceHelper(sigmoid=config.sigmoid, ignore_empty=ignore_empty)
        optimizer = ConfigParser(parser.get_parsed_content("optimizer", instantiate=False).get_config())
        return model, loss, optimizer.get_parsed_content(instantiate=False), accuracy

    def placed(self, model: Any, config: BundleConfig) -> Any:
        import torch

        if config.channels_last:  # setup_model, after the move
            return model.to(memory_format=torch.channels_last_3d)
        return model

    def training_loop(self, model: Any, loss_fn: Any, optimizer: Any, accuracy: Any, batch: Any,
                      num_patches_per_iter: int, amp_dtype: Any, config: BundleConfig) -> Iterator[None]:
        return segmenter_loop(model, loss_fn, optimizer, accuracy, batch, amp_dtype, config)

    def validate(self, model: Any, volume: Any, label: Any, config: BundleConfig, sw_batch_size: int,
                 device: Any, amp_dtype: Any, accuracy: Any, score: bool) -> Any:
        from autotune.auto3dseg.validation import validate_segresnet

        return validate_segresnet(model, volume, label, config, sw_batch_size, device, amp_dtype, accuracy, score=score)
