"""Read, check and write a bundle's ``configs/hyper_parameters.yaml``.

This file is the hand-off between generation, tuning and training: a person can read and
edit it, and every stage reads it through ``load_bundle`` (a ``Bundle``: the folder, the
checked config and its typed ``tuning:`` plan) or ``load_bundle_config`` (the config alone),
which check the values the stages rely on and name the key at fault.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.bundles.plan import TuningPlan, plan_of
from autotune.bundles.templates import reject_expressions
from autotune.errors import ConfigError
from autotune.files import atomic_write_yaml
from autotune.utils import expand_path, read_yaml

__all__ = [
    "CONFIG_RELPATH",
    "Bundle",
    "load_bundle",
    "bundle_config_path",
    "load_bundle_config",
    "save_bundle_config",
    "update_bundle_config",
    "check_bundle_config",
]

CONFIG_RELPATH = Path("configs") / "hyper_parameters.yaml"

_POSITIVE_INTS = (
    "input_channels",
    "output_classes",
    "num_images_per_batch",
    "num_crops_per_image",
    "num_patches_per_iter",
    "num_sw_batch_size",
    "num_epochs",
)
_BOOLS = ("sw_input_on_cpu", "amp")


def bundle_config_path(bundle: str | os.PathLike[str]) -> Path:
    """The config file of ``bundle`` (a bundle folder, or the YAML file itself)."""
    path = expand_path(bundle)
    if path.is_dir():
        return path / CONFIG_RELPATH
    if path.suffix in (".yaml", ".yml"):
        return path
    if not path.exists():
        raise ConfigError(f"{path}: no such bundle; give a folder made by 'autotune generate'")
    raise ConfigError(f"{path}: not a bundle folder or a .yaml config")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_bundle_config(cfg: Any, where: str) -> dict[str, Any]:
    """Check the keys probe, estimate and train rely on; return ``cfg``.

    Raises:
        ConfigError: naming ``where`` and the key, with the expected form.
    """
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where}: the top level must be a mapping; regenerate the bundle with 'autotune generate'")
    reject_expressions(cfg, where)
    for key in ("algo", "network", "loss", "optimizer", "roi_size", "resample_resolution", *_POSITIVE_INTS, *_BOOLS):
        if key not in cfg:
            raise ConfigError(f"{where}: key {key!r} is missing; regenerate the bundle with 'autotune generate'")
    for key in _POSITIVE_INTS:
        if not _is_int(cfg[key]) or cfg[key] < 1:
            raise ConfigError(f"{where}: key {key!r} must be a positive integer, got {cfg[key]!r}")
    for key in _BOOLS:
        if not isinstance(cfg[key], bool):
            raise ConfigError(f"{where}: key {key!r} must be true or false, got {cfg[key]!r}")
    roi = cfg["roi_size"]
    if not (isinstance(roi, list) and len(roi) == 3 and all(_is_int(v) and v > 0 for v in roi)):
        raise ConfigError(f"{where}: key 'roi_size' must be three positive integers, got {roi!r}")
    res = cfg["resample_resolution"]
    if not (
        isinstance(res, list)
        and len(res) == 3
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in res)
    ):
        raise ConfigError(f"{where}: key 'resample_resolution' must be three positive numbers, got {res!r}")
    for section in ("network", "loss", "optimizer"):
        if not isinstance(cfg[section], Mapping) or not isinstance(cfg[section].get("name"), str):
            raise ConfigError(f"{where}: key {section!r} must be a mapping with a 'name'")
    lr = cfg.get("learning_rate", 1e-3)
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or lr <= 0:
        raise ConfigError(f"{where}: key 'learning_rate' must be a positive number, got {lr!r}")
    cache_rate = cfg.get("cache_rate", 1.0)
    if not isinstance(cache_rate, (int, float)) or not 0.0 <= float(cache_rate) <= 1.0:
        raise ConfigError(f"{where}: key 'cache_rate' must be between 0 and 1, got {cache_rate!r}")
    plan_of(cfg, where)  # a malformed tuning block is named here, not where a stage reads it
    return cfg


def load_bundle_config(bundle: str | os.PathLike[str]) -> dict[str, Any]:
    """Load and check a bundle config; ``bundle_root`` is set to the bundle folder.

    Raises:
        ConfigError: missing file, bad YAML, or an invalid value (the key is named).
    """
    path = bundle_config_path(bundle)
    if not path.is_file():
        raise ConfigError(f"{path}: bundle config not found; run 'autotune generate' first")
    cfg = check_bundle_config(read_yaml(path, ConfigError), str(path))
    cfg["bundle_root"] = str(path.resolve().parent.parent) if path.parent.name == "configs" else str(path.parent)
    return cfg


@dataclass(frozen=True)
class Bundle:
    """A loaded bundle: what every stage hands on instead of reloading it.

    Attributes:
        path: the bundle folder.
        config_path: its ``configs/hyper_parameters.yaml``.
        config: the checked config (``bundle_root`` set to ``path``).
        plan: the typed ``tuning:`` block, or None when the bundle was never tuned.
    """

    path: Path
    config_path: Path
    config: dict[str, Any]
    plan: TuningPlan | None


def load_bundle(bundle: str | os.PathLike[str]) -> Bundle:
    """Load and check a bundle once: its config and its plan.

    Raises:
        ConfigError: missing file, bad YAML, or an invalid value, the tuning block's included (the key is named).
    """
    cfg = load_bundle_config(bundle)
    return Bundle(Path(cfg["bundle_root"]), bundle_config_path(bundle), cfg, plan_of(cfg))


def save_bundle_config(bundle: str | os.PathLike[str], cfg: Mapping[str, Any]) -> Path:
    """Write ``cfg`` atomically to the bundle's config file."""
    path = bundle_config_path(bundle)
    return atomic_write_yaml(path, dict(cfg))


def update_bundle_config(bundle: str | os.PathLike[str], updates: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``updates`` (top-level keys) into the bundle config and write it atomically."""
    cfg = load_bundle_config(bundle)
    cfg.update(updates)
    check_bundle_config(cfg, str(bundle_config_path(bundle)))
    save_bundle_config(bundle, cfg)
    return cfg
