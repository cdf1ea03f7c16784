"""Build a MONAI bundle's own network, loss, accuracy and optimizer, as its ``scripts/`` build them.

SegResNet follows ``Segmenter.setup_model`` and ``Segmenter.__init__`` (segmenter.py): the
``network`` section through ``ConfigParser`` with its ``INSTANCE_NVFUSER`` norm resolved as there,
channels-last, ``DeepSupervisionLoss`` around the ``loss`` section, ``DiceHelper`` as the training
accuracy, the ``optimizer`` section instantiated on the parameters. DiNTS follows ``train.py``:
``training_network#network``, ``training#loss``, ``training#optimizer``. The probe builds these on
its device (``probe_parts``); the estimator builds them on the meta device and gives them fake
parameters (``fake_parts``), with DiNTS's topology tests turned into plain values
(``StaticTopologyInstance``: MONAI's forward reads each path's activation from a tensor).
"""

from __future__ import annotations

import contextlib
import copy
import io
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.auto3dseg import segresnet2d
from autotune.auto3dseg.view import read_parser, template_of

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["build_model_loss_optimizer", "probe_parts", "fake_parts", "static_topology_target"]


def _segresnet_network_config(parser: Any, cfg: Mapping[str, Any]) -> dict[str, Any]:
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
        network["resolution"] = copy.deepcopy(list(cfg["resample_resolution"]))
    return network


def _segresnet(parser: Any, cfg: Mapping[str, Any]) -> tuple[Any, Any, Any, Any]:
    """(network, loss, optimizer section, accuracy) as SegResNet's Segmenter builds them."""
    from monai.bundle import ConfigParser
    from monai.losses import DeepSupervisionLoss
    from monai.metrics import DiceHelper

    model = ConfigParser(_segresnet_network_config(parser, cfg)).get_parsed_content()
    loss = DeepSupervisionLoss(ConfigParser(parser.get_parsed_content("loss", instantiate=False).get_config())
                               .get_parsed_content(instantiate=True))
    ignore_empty = bool(parser.get_parsed_content("dice_ignore_empty")) if "dice_ignore_empty" in parser else True
    with warnings.catch_warnings():  # the template's own call; MONAI 1.5+ warns that 'sigmoid' is deprecated
        warnings.simplefilter("ignore", FutureWarning)
        accuracy = DiceHelper(sigmoid=bool(cfg.get("sigmoid")), ignore_empty=ignore_empty)
    optimizer = ConfigParser(parser.get_parsed_content("optimizer", instantiate=False).get_config())
    return model, loss, optimizer, accuracy


def _dints(parser: Any) -> tuple[Any, Any, Any, Any]:
    """(network, loss, optimizer section, None) as DiNTS's train.py builds them."""
    with io.StringIO() as buffer, contextlib.redirect_stdout(buffer):  # train.py silences the roi hint so
        model = parser.get_parsed_content("training_network#network")
    loss = parser.get_parsed_content("training#loss")
    optimizer = parser.get_parsed_content("training#optimizer", instantiate=False)
    return model, loss, optimizer, None


#: template -> "module:function" building (network, loss, optimizer section, accuracy) from its parser
_BUILDERS = {"swinunetr": "autotune.auto3dseg.swinunetr:build"}


def _builder(template: str) -> Any:
    """The builder of ``template`` (``_BUILDERS``); DiNTS's ``_dints`` for the rest."""
    import importlib

    target = _BUILDERS.get(template)
    if target is None:
        return _dints
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def static_topology_target() -> str:
    """The ``_target_`` of ``StaticTopologyInstance`` (for ``training_network#dints_space``)."""
    return f"{__name__}.StaticTopologyInstance"


def build_model_loss_optimizer(cfg: Mapping[str, Any], device: str, *, static_topology: bool = False,
                               on_meta: bool = False) -> tuple[Any, Any, Any, Any]:
    """The bundle's (network, loss, optimizer, accuracy); the network on ``device`` (``on_meta``: on the meta
    device, for the estimator). ``static_topology``: DiNTS with plain-value path tests (fake tensors)."""
    import torch

    root = Path(str(cfg["bundle_root"]))  # recognised by load_view; the pickle's hash is checked again
    parser = read_parser(root, template_of(cfg), "cpu" if on_meta else device, cfg.get("arch_code_sha256"))
    if template_of(cfg) == "dints" and static_topology:
        parser["training_network#dints_space#_target_"] = static_topology_target()
    torch.manual_seed(int(cfg.get("seed", 0)))
    context = torch.device("meta") if on_meta else contextlib.nullcontext()
    with context:
        if template_of(cfg) == "segresnet":
            model, loss, optimizer_part, accuracy = _segresnet(parser, cfg)
            optimizer_part = optimizer_part.get_parsed_content(instantiate=False)
        elif template_of(cfg) == segresnet2d.NAME:  # Segmenter2D.setup_model: wrapped, no 3D channels-last
            model, loss, optimizer_part, accuracy = segresnet2d.build_parts(parser, cfg)
        else:
            model, loss, optimizer_part, accuracy = _builder(template_of(cfg))(parser)
        if not on_meta:
            model = model.to(device)
        if template_of(cfg) == "segresnet" and cfg.get("channels_last", True):  # setup_model, after the move
            model = model.to(memory_format=torch.channels_last_3d)
    return model, loss, optimizer_part, accuracy


def probe_parts(cfg: Mapping[str, Any], device: Any, amp_dtype: Any) -> dict[str, Any]:
    """What the probe's child runs for a MONAI bundle: its ``_build`` keys plus ``workload`` (the template's step)."""
    from autotune.auto3dseg.workload import MonaiWorkload

    model, loss, optimizer_part, accuracy = build_model_loss_optimizer(cfg, str(device))
    optimizer = optimizer_part.instantiate(params=model.parameters())
    return {"device": device, "model": model, "loss_fn": loss, "optimizer": optimizer, "amp_dtype": amp_dtype,
            "scaler": None, "workload": MonaiWorkload(cfg, loss, accuracy, host="cpu")}


def fake_parts(cfg: Mapping[str, Any], compute: str, emulate: bool) -> tuple[Any, Any, Any, Any]:
    """(model, loss, optimizer, workload) for the estimator, inside its fake session: built on the meta device,
    then given fake parameters on ``compute``. ``emulate``: a CUDA target on the CPU (host tensors on meta)."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from autotune.auto3dseg.workload import MonaiWorkload

    with unset_fake_temporarily():
        model, loss, optimizer_part, accuracy = build_model_loss_optimizer(cfg, compute, static_topology=True,
                                                                            on_meta=True)
    model = model._apply(lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=compute))
    for module in model.modules():  # DiNTS keeps its architecture code as plain tensors on the device
        for name in ("arch_code_a", "arch_code_c"):
            code = getattr(module, name, None)
            if isinstance(code, torch.Tensor):
                setattr(module, name, torch.empty_strided(code.shape, code.stride(), dtype=code.dtype, device=compute))
    optimizer = optimizer_part.instantiate(params=model.parameters())
    return model, loss, optimizer, MonaiWorkload(cfg, loss, accuracy, host="meta" if emulate else "cpu")


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
