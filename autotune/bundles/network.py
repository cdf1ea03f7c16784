"""The networks autotune's own templates build: one ``NetworkKind`` each, registered here once.

A template (``algorithm_templates/<algo>/template.yaml``) names its network (``network.name``), and the network's
kind brings everything the code needs of it: how it is built from the bundle's ``network`` section (``build``;
torch and MONAI are imported only then), the factor every roi dimension must be a multiple of (``roi_divisor``,
which filling a template checks without importing a builder) and whether DistributedDataParallel must look for
parameters a step leaves without a gradient (``ddp_find_unused_parameters``: DiNTS's inactive paths).

``network_named`` finds a kind (an unknown name is one ``ConfigError`` line listing the known ones);
``register_network`` adds one: a template with a network of its own is its ``template.yaml`` and one
``NetworkKind`` registered where it is defined (``tests/bundles/test_network_kinds.py`` adds a fifth template so).
No other module tells the networks apart. This module sits below ``autotune.build`` (which builds every network
through it) and imports neither torch nor MONAI at import time.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.errors import ConfigError
from autotune.utils import look_up_option

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from autotune.bundles.model import Section

__all__ = ["NetworkKind", "register_network", "unregister_network", "network_named", "network_names",
           "network_args", "config_section", "roi_divisor"]

#: ``build(section, in_channels, out_channels)``: the network of a bundle's ``network`` section
Builder = Callable[["Section", int, int], "torch.nn.Module"]
#: ``roi_divisor(section)``: the factor every roi dimension must be a multiple of
Divisor = Callable[["Section"], int]
#: ``shallower(args)``: the network's arguments with one down-sampling fewer, or None where it has no fewer
Shallower = Callable[[dict[str, Any]], "dict[str, Any] | None"]


@dataclass(frozen=True)
class NetworkKind:
    """One network autotune's own templates build (``network.name`` of a template).

    Attributes:
        name: the ``network.name`` a template gives.
        build: ``build(section, in_channels, out_channels)`` -> the ``torch.nn.Module`` (a 3D network taking
            ``in_channels`` and giving ``out_channels`` logits); ``network_args(section)`` gives the section's
            arguments with MONAI's layer specs as tuples. ``TypeError``, ``ValueError`` and ``KeyError`` it raises
            become one ``ConfigError`` naming the network (``autotune.build.build_network``).
        roi_divisor: ``roi_divisor(section)`` -> the factor every roi dimension must be a multiple of.
        ddp_find_unused_parameters: a training step leaves some parameters without a gradient, so
            DistributedDataParallel must look for them (``find_unused_parameters``; ``autotune.trainer.setup``).
        shallower: ``shallower(args)`` -> the ``network.args`` with one down-sampling fewer (None: none fewer),
            for a template whose ``roi.min_bottleneck`` fits the depth to the data (``autotune.bundles.render``);
            None: the depth is the template's.
    """

    name: str
    build: Builder
    roi_divisor: Divisor
    ddp_find_unused_parameters: bool = False
    shallower: Shallower | None = None


_REGISTRY: dict[str, NetworkKind] = {}


def register_network(kind: NetworkKind) -> NetworkKind:
    """Add ``kind`` under its ``name``; returns it.

    Raises:
        ValueError: a network of that name is registered already.
    """
    if kind.name in _REGISTRY:
        raise ValueError(f"network {kind.name!r} is registered already")
    _REGISTRY[kind.name] = kind
    return kind


def unregister_network(name: str) -> None:
    """Remove the network ``name`` (nothing when it is not registered)."""
    _REGISTRY.pop(name, None)


def network_names() -> tuple[str, ...]:
    """The registered networks' names, in the order they were registered."""
    return tuple(_REGISTRY)


def network_named(name: str) -> NetworkKind:
    """The registered network ``name``.

    Raises:
        ConfigError: one line listing the registered networks (and a close match).
    """
    return _REGISTRY[look_up_option(name, network_names(), "network")]


def config_section(cfg: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """The section ``key`` (``network``, ``loss``, ``optimizer``): a mapping with a ``name`` and mapping ``args``."""
    section = cfg.get(key)
    if not isinstance(section, Mapping) or not isinstance(section.get("name"), str):
        raise ConfigError(f"bundle config key {key!r} must be a mapping with a 'name'; regenerate the bundle")
    args = section.get("args", {}) or {}
    if not isinstance(args, Mapping):
        raise ConfigError(f"bundle config key '{key}.args' must be a mapping")
    return section


def roi_divisor(cfg: Mapping[str, Any]) -> int:
    """The factor every roi dimension must be a multiple of for the network of ``cfg`` (a config as plain data).

    Raises:
        ConfigError: no ``network`` section, or a network no kind is registered for.
    """
    from autotune.bundles.model import Section

    section = config_section(cfg, "network")
    kind = network_named(section["name"])
    return int(kind.roi_divisor(Section.model_validate({**section, "args": dict(section.get("args") or {})})))


def _as_tuple_args(value: Any) -> Any:
    """YAML has no tuples: MONAI's ``("GROUP", {...})`` layer specs arrive as lists."""
    if (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], dict)
    ):
        return (value[0], dict(value[1]))
    return value


def network_args(section: Section) -> dict[str, Any]:
    """The section's ``args`` as a MONAI constructor takes them (its ``("GROUP", {...})`` layer specs as tuples)."""
    return {k: _as_tuple_args(v) for k, v in section.args.items()}


# -- the networks of autotune's templates ----------------------------------------------------------------------


def _build_segresnet(section: Section, in_channels: int, out_channels: int) -> torch.nn.Module:
    from monai.networks.nets import SegResNet

    return SegResNet(spatial_dims=3, in_channels=in_channels, out_channels=out_channels, **network_args(section))


def _segresnet_divisor(section: Section) -> int:
    return int(2 ** (len(section.args.get("blocks_down", (1, 2, 2, 4))) - 1))


def _build_unet(section: Section, in_channels: int, out_channels: int) -> torch.nn.Module:
    from monai.networks.nets import UNet

    return UNet(spatial_dims=3, in_channels=in_channels, out_channels=out_channels, **network_args(section))


def _unet_divisor(section: Section) -> int:
    divisor = 1
    for stride in section.args.get("strides", ()):
        divisor *= int(stride)
    return divisor


def _unet_shallower(args: dict[str, Any]) -> dict[str, Any] | None:
    """UNet's arguments without its last down-sampling (its last stride and deepest channel count)."""
    strides, channels = list(args.get("strides") or ()), list(args.get("channels") or ())
    if len(strides) < 2 or len(channels) != len(strides) + 1:
        return None
    return {**args, "strides": strides[:-1], "channels": channels[:-1]}


def _static_topology_class() -> type:
    """A ``TopologyInstance`` whose active paths are plain Python values.

    MONAI's instance tests tensor values (``if activation:``) in ``forward``; with the
    architecture fixed as data that test is a constant, and as plain values it also
    runs under ``FakeTensorMode`` (the estimator) and avoids a device sync per path.
    """
    import torch
    from monai.networks.nets import TopologyInstance

    class StaticTopologyInstance(TopologyInstance):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.active_paths: list[list[int]] = [
                [int(v) for v in row] for row in self.arch_code_a.detach().cpu().tolist()
            ]

        def forward(self, x: list[torch.Tensor]) -> list[torch.Tensor]:  # noqa: D102
            inputs = x
            for blk_idx in range(self.num_blocks):
                outputs: list[torch.Tensor | None] = [None] * self.num_depths
                for res_idx, active in enumerate(self.active_paths[blk_idx]):
                    if active:
                        out = self.cell_tree[str((blk_idx, res_idx))](
                            inputs[self.arch_code2in[res_idx]], None
                        )
                        dst = self.arch_code2out[res_idx]
                        outputs[dst] = out if outputs[dst] is None else outputs[dst] + out
                inputs = [
                    o if o is not None else torch.zeros((), dtype=x[0].dtype, device=x[0].device)
                    for o in outputs
                ]
            return inputs

    return StaticTopologyInstance


def _build_dints(net: Section, in_channels: int, out_channels: int) -> torch.nn.Module:
    import numpy as np
    from monai.networks.nets import DiNTS

    topo = net.extra("topology")
    if not isinstance(topo, Mapping):
        raise ConfigError("bundle config 'network.topology' is missing; DiNTS needs its architecture code")
    try:
        num_blocks = int(topo.get("num_blocks", 6))
        num_depths = int(topo.get("num_depths", 3))
        arch_a = np.asarray(topo["arch_code_a"], dtype=np.float32)
        arch_c = np.asarray(topo["arch_code_c"], dtype=np.int64)
        node_a = [[int(v) for v in row] for row in topo["node_a"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"bundle config 'network.topology' is malformed ({exc}); regenerate the bundle"
        ) from exc
    num_paths = 3 * num_depths - 2
    if arch_a.shape != (num_blocks, num_paths) or arch_c.shape != (num_blocks, num_paths):
        raise ConfigError(
            f"network.topology: arch_code_a/arch_code_c must be {num_blocks}x{num_paths} for "
            f"num_blocks={num_blocks}, num_depths={num_depths}; got {arch_a.shape} and {arch_c.shape}"
        )
    if len(node_a) != num_blocks + 1 or any(len(row) != num_depths for row in node_a):
        raise ConfigError(f"network.topology.node_a must be {num_blocks + 1}x{num_depths}")
    if arch_c.min() < 0 or arch_c.max() > 4:
        raise ConfigError("network.topology.arch_code_c holds operation indices 0-4 only")
    args = network_args(net)
    use_downsample = bool(topo.get("use_downsample", True))
    # MONAI prints a roi hint on every construction; the roi is already checked at generation.
    with contextlib.redirect_stdout(io.StringIO()):
        space = _static_topology_class()(
            arch_code=[arch_a, arch_c],
            channel_mul=float(topo.get("channel_mul", 1.0)),
            num_blocks=num_blocks,
            num_depths=num_depths,
            use_downsample=use_downsample,
            act_name=args.get("act_name", "RELU"),
            norm_name=args.get("norm_name", ("INSTANCE", {"affine": True})),
        )
    return DiNTS(
        dints_space=space,
        in_channels=in_channels,
        num_classes=out_channels,
        use_downsample=use_downsample,
        node_a=node_a,
        **args,
    )


def _dints_divisor(section: Section) -> int:
    topo = section.extra("topology", {}) or {}
    return int(2 ** (int(topo.get("num_depths", 3)) + int(bool(topo.get("use_downsample", True)))))


# the networks of the shipped templates, registered once: a step of DiNTS leaves its inactive paths' parameters
# without a gradient, so DDP looks for them there
for _kind in (NetworkKind("SegResNet", _build_segresnet, _segresnet_divisor),
              NetworkKind("UNet", _build_unet, _unet_divisor, shallower=_unet_shallower),
              NetworkKind("DiNTS", _build_dints, _dints_divisor, ddp_find_unused_parameters=True)):
    register_network(_kind)
