"""A bundle config's network as plain data: the networks autotune builds, a section's shape, and the factor
every roi dimension must be a multiple of.

Plain arithmetic on the config, below ``autotune.build`` (which builds the network from the same section)
so that filling a template (``autotune.bundles.render``) checks a roi without importing the builders.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.errors import ConfigError
from autotune.utils import look_up_option

__all__ = ["NETWORKS", "config_section", "roi_divisor"]

NETWORKS = ("SegResNet", "UNet", "DiNTS")


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
    """The factor every roi dimension must be a multiple of for this network."""
    net = config_section(cfg, "network")
    name = look_up_option(net["name"], NETWORKS, "network")
    args = net.get("args", {}) or {}
    if name == "SegResNet":
        return int(2 ** (len(args.get("blocks_down", (1, 2, 2, 4))) - 1))
    if name == "UNet":
        divisor = 1
        for stride in args.get("strides", ()):
            divisor *= int(stride)
        return divisor
    topo = net.get("topology", {}) or {}
    return int(2 ** (int(topo.get("num_depths", 3)) + int(bool(topo.get("use_downsample", True)))))
