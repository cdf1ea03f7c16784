"""MONAI's SegResNet2D template: its view, network, training step, validation and write-back.

MONAI generates it only where the median spacing is highly anisotropic (its ``algo.py``
``pre_check_skip_algo``: ``spacing[2] >= 3 (spacing[0] + spacing[1]) / 2``), or everywhere with
``SEGRESNET2D_ALWAYS=1``. Its ``scripts/segmenter_2d.py`` is SegResNet's ``Segmenter`` with a 2D network
over the slices of each 3D patch, and this module follows it:

- **the network** (``Segmenter2D.setup_model``): the ``network`` section (``SegResNetDS``,
  ``spatial_dims: 2``, batch norm) through ``ConfigParser`` as it is, wrapped as ``WrappedModel2D``: a
  patch (B, C, H, W, D) becomes B x D slices (``permute`` then ``reshape``, a copy), moved to
  channels-last (2D) when the template's ``channels_last`` is on, and each output goes back to
  (B, C', H', W', D) as a view. ``setup_model`` then turns ``channels_last`` off, so the loop moves its
  batches to the device in their own layout (``preserve_format``).
- **the training step**: SegResNet's ``Segmenter.train_epoch`` (the template's own copy), the same loop
  autotune runs for SegResNet (``autotune.auto3dseg.templates.segresnet.segmenter_loop``), with
  ``channels_last`` off.
- **validation**: ``Segmenter2D``'s ``SlidingWindowInfererAdapt`` over 3D windows of the roi (overlap
  ``[0.625, 0.625, 0]``, Gaussian, no cached weight map: computed on the device for each case), or the
  one the bundle's ``sliding_inferrer`` names; ``val_epoch``'s Dice on the device.
- **the write-back** (SegResNet's ``segmenter_updates``): SegResNet's keys (crops of one image in crop mode ``ratio``, else images of one
  crop; ``auto_scale_allowed: false``), and a ``sliding_inferrer`` as ``Segmenter2D`` makes its own,
  with the tuned ``sw_batch_size`` (stitched on the CPU when validation was tuned there).

``SegResNet2D`` is the template's object in the registry (``autotune.auto3dseg.templates``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from autotune.auto3dseg.templates.base import ConfigReader, KnownVersion, MonaiTemplate, known_version
from autotune.auto3dseg.templates.segresnet import SegResNet, segmenter_loop, segmenter_updates
from autotune.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

__all__ = ["SegResNet2D", "SW_OVERLAP", "view_values", "build_parts", "wrapped_model_2d", "validate", "inferrer"]

#: Segmenter2D.__init__'s default SlidingWindowInfererAdapt: no overlap along the slices
SW_OVERLAP = [0.625, 0.625, 0.0]

# get(key, default) -> the key resolved by MONAI's ConfigParser; section(key) -> {"name", "args"}
Getter = Callable[[str, Any], Any]


def _three(value: Any, key: str, where: Path, kind: type = int) -> list[Any]:
    if not (isinstance(value, (list, tuple)) and len(value) == 3):
        raise ConfigError(f"{where}: key {key!r} must be three numbers, got {value!r}")
    return [kind(v) for v in value]


def _overlap(value: Any, where: Path) -> list[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)] * 3
    return _three(value, "sliding_inferrer#overlap", where, float)


def view_values(get: Getter, section: Callable[[str], dict[str, Any]], where: Path) -> dict[str, Any]:
    """The plain values of a SegResNet2D bundle (``autotune.auto3dseg.view.load_view``'s reader).

    ``channels_last`` is the loop's (off: ``setup_model`` turns it off); ``model_channels_last`` is the
    template's, the 2D network's memory format. ``sw_overlap_axes`` is the inferrer's overlap per axis
    (``sw_overlap``, the in-plane one, for what reads one number)."""
    batch = int(get("batch_size", 1))
    crops = int(get("num_crops_per_image", 1))
    steps = int(get("num_steps_per_image", None) or 1)
    sw_batch, overlap, sw_cpu = 1, list(SW_OVERLAP), False
    if get("sliding_inferrer#_target_", None) is not None:  # the bundle names its inferrer (a tuned one does)
        sw_batch = int(get("sliding_inferrer#sw_batch_size", 1))
        overlap = _overlap(get("sliding_inferrer#overlap", SW_OVERLAP), where)
        sw_cpu = str(get("sliding_inferrer#device", "") or "") == "cpu"
    roi = _three(get("roi_size", None), "roi_size", where)
    source = f"batch_size {batch} x num_crops_per_image {crops}" + (f" / num_steps_per_image {steps}" if steps > 1 else "")
    network = section("network")
    return {
        "roi_size": roi, "roi_size_valid": roi,
        "batch_source": f"{source} patches (of {roi[2]} slices each) per optimizer step",
        "input_channels": int(get("input_channels", None)), "output_classes": int(get("output_classes", None)),
        "num_patches_per_iter": max(1, batch * crops // steps), "num_images_per_batch": max(1, batch * crops // steps),
        "num_crops_per_image": 1, "num_sw_batch_size": sw_batch, "sw_input_on_cpu": sw_cpu,
        "sw_overlap": overlap[0], "sw_overlap_axes": overlap,
        "amp": bool(get("amp", True)), "learning_rate": float(get("learning_rate", None)),
        "resample_resolution": _three(get("resample_resolution", [1.0, 1.0, 1.0]), "resample_resolution", where, float),
        "num_epochs": int(get("num_epochs", 300)), "sigmoid": bool(get("sigmoid", False)), "seed": 0,
        "channels_last": False, "model_channels_last": bool(get("channels_last", True)),
        "spatial_dims": int(network["args"].get("spatial_dims", 2)),
        "auto_scale_allowed": bool(get("auto_scale_allowed", False)), "fold": int(get("fold", 0)),
        "datalist": str(get("data_list_file_path", None)), "dataroot": str(get("data_file_base_dir", None)),
        "network": network, "loss": section("loss"), "optimizer": section("optimizer"),
    }


def _wrapped_class() -> type:
    import torch

    class WrappedModel2D(torch.nn.Module):
        """``segmenter_2d.WrappedModel2D``'s computation: slices through a 2D network, outputs back in 3D."""

        def __init__(self, net: torch.nn.Module, memory_format: torch.memory_format = torch.preserve_format) -> None:
            super().__init__()
            self.net = net.to(memory_format=memory_format)
            self.memory_format = memory_format

        def forward(self, x: torch.Tensor) -> Any:  # noqa: D102 - as WrappedModel2D.forward
            shape = x.shape
            x = x.permute(0, 4, 1, 2, 3).reshape(-1, x.shape[1], x.shape[2], x.shape[3])
            x = self.net(x.to(memory_format=self.memory_format))
            if isinstance(x, (list, tuple)):
                return [self._to_3d(out, shape) for out in x]
            return self._to_3d(x, shape)

        @staticmethod
        def _to_3d(x: torch.Tensor, shape: Any) -> torch.Tensor:
            return x.reshape(shape[0], shape[4], x.shape[1], x.shape[2], x.shape[3]).permute(0, 2, 3, 4, 1)

    return WrappedModel2D


def wrapped_model_2d(net: Any, channels_last: bool) -> Any:
    """``net`` wrapped as ``Segmenter2D.setup_model`` wraps it (channels-last 2D when ``channels_last``)."""
    import torch

    memory_format = torch.channels_last if channels_last else torch.preserve_format
    return _wrapped_class()(net, memory_format=memory_format)


def build_parts(parser: Any, config: BundleConfig) -> tuple[Any, Any, Any, Any]:
    """(network, loss, optimizer section, accuracy) as ``Segmenter2D`` builds them; the optimizer section is
    MONAI's ``ConfigItem`` (``instantiate(params=...)``)."""
    import warnings

    from monai.bundle import ConfigParser
    from monai.losses import DeepSupervisionLoss
    from monai.metrics import DiceHelper

    network = ConfigParser(parser.get_parsed_content("network", instantiate=False).get_config()).get_parsed_content()
    model = wrapped_model_2d(network, config.model_channels_last is not False)
    loss = DeepSupervisionLoss(ConfigParser(parser.get_parsed_content("loss", instantiate=False).get_config())
                               .get_parsed_content(instantiate=True))
    with warnings.catch_warnings():  # the template's own call; MONAI 1.5+ warns that 'sigmoid' is deprecated
        warnings.simplefilter("ignore", FutureWarning)
        accuracy = DiceHelper(sigmoid=config.sigmoid)
    optimizer = ConfigParser(parser.get_parsed_content("optimizer", instantiate=False).get_config())
    return model, loss, optimizer.get_parsed_content(instantiate=False), accuracy


def inferrer(config: BundleConfig, sw_batch_size: int, output_device: Any, sw_device: Any) -> Any:
    """The inferrer SegResNet2D validates with. MONAI computes its Gaussian weight map on the device at each
    case (no cache); here an empty tensor of that shape on the device stands for it (memory, not values)."""
    import torch
    from monai.inferers import SlidingWindowInfererAdapt

    roi = config.validation_roi
    sliding = SlidingWindowInfererAdapt(roi_size=roi, sw_batch_size=int(sw_batch_size),
                                        overlap=list(config.sw_overlap_axes or SW_OVERLAP), mode="gaussian",
                                        cache_roi_weight_map=False, progress=False, device=output_device)
    sliding.roi_weight_map = torch.empty(roi, dtype=torch.float32, device=sw_device)
    return sliding


def validate(model: Any, volume: Any, label: Any, config: BundleConfig, sw_batch_size: int, device: Any,
             amp_dtype: Any, accuracy: Any, score: bool = True) -> Any:
    """One case of ``Segmenter.val_epoch`` with SegResNet2D's inferrer (no post-transforms, no loss); the view's
    ``channels_last`` is off, as after ``setup_model``."""
    from autotune.auto3dseg.validation import validate_segresnet

    return validate_segresnet(model, volume, label, config, sw_batch_size, device, amp_dtype, accuracy, score,
                              make_inferrer=lambda output_device: inferrer(config, sw_batch_size, output_device, device))


class SegResNet2D(MonaiTemplate):
    """MONAI's SegResNet2D template (see the module docstring)."""

    name: ClassVar[str] = "segresnet2d"
    versions: ClassVar[Mapping[str, KnownVersion]] = {
        "21ed8e5": known_version(
            configs=('hyper_parameters.yaml',),
            files={
                "scripts/__init__.py": "b3d76349dea4bd588f9c5bcc475d4381ddf42efe2863a15a3c9af86592592ead",
                "scripts/algo.py": "1cceb5dcbd8467d0f1da9632030895f9efa5f9be54071bd41075e023c168a1bd",
                "scripts/infer.py": "a2b09d0ca302aa31b031b8e28d872679852ba7ab11bdcb426215cecab34694d4",
                "scripts/segmenter.py": "ef7ef494fcf51605fa04bc6ae38333dee4e4f6488c2a35866df7224b685c7f66",
                "scripts/segmenter_2d.py": "561076218d4ea1d978548e3426f47ae767637489b2db78ea49da40a1e538401c",
                "scripts/train.py": "895b00236546a4515e6c3bacc27406196ee461f08310a3c8c7ea41517b3d77bc",
                "scripts/utils.py": "183ea6bee1f7dbea2ec8b9f57cb78366fe5600245fbb06852869ea9f641928ff",
                "scripts/validate.py": "7d669f97a85f22c8d024dcf90a59335f86c412f8205dac756ca62d6214e32aaa",
            },
        ),
    }
    keys: ClassVar[Mapping[str, tuple[str, ...]]] = SegResNet.keys  # Segmenter2D reads them as Segmenter does
    validates_without_gradients: ClassVar[bool] = True  # Segmenter.train_epoch too

    def view_values(self, reader: ConfigReader) -> dict[str, Any]:
        return view_values(reader.get, reader.section, reader.where)

    def updates(self, view: Mapping[str, Any], updates: Mapping[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
        """SegResNet's, with Segmenter2D's inferrer: overlap per axis, no cached weight map."""
        return segmenter_updates(view, updates, raw, [float(v) for v in view["sw_overlap_axes"]], False)

    def build(self, parser: Any, config: BundleConfig) -> tuple[Any, Any, Any, Any]:
        """``Segmenter2D.setup_model``: wrapped, no 3D channels-last."""
        return build_parts(parser, config)

    def training_loop(self, model: Any, loss_fn: Any, optimizer: Any, accuracy: Any, batch: Any,
                      num_patches_per_iter: int, amp_dtype: Any, config: BundleConfig) -> Iterator[None]:
        return segmenter_loop(model, loss_fn, optimizer, accuracy, batch, amp_dtype, config)

    def validate(self, model: Any, volume: Any, label: Any, config: BundleConfig, sw_batch_size: int,
                 device: Any, amp_dtype: Any, accuracy: Any, score: bool) -> Any:
        return validate(model, volume, label, config, sw_batch_size, device, amp_dtype, accuracy, score=score)
