"""What a bundle config must hold, and autotune's own bundles read and written as plain YAML.

The typed key table (``check_bundle_config``: every key the stages read, against its type and range) is
what every template family's view must pass (``autotune.families``), and what an overrides file is
held against (``check_config_values``). ``read_own_config`` / ``write_own_config`` read and write the
``configs/hyper_parameters.yaml`` of a bundle autotune generated; the stages load any bundle through
``autotune.bundles.config``, which asks the bundle's family.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.bundles.plan import plan_of
from autotune.checks import Flag, Integer, Items, Number, Triple, refuse_expressions, refuse_non_finite
from autotune.errors import ConfigError
from autotune.files import atomic_write_yaml
from autotune.tunables import TUNABLES
from autotune.utils import expand_path, read_yaml

__all__ = [
    "CONFIG_RELPATH",
    "MAX_BATCH",
    "bundle_config_path",
    "check_bundle_config",
    "check_config_values",
    "known_config_keys",
    "read_own_config",
    "write_own_config",
    "save_bundle_config",
]

CONFIG_RELPATH = Path("configs") / "hyper_parameters.yaml"

MAX_BATCH = 65_536  # patches or windows per pass: beyond any device
# What each key the stages read must hold: the required keys first, then those a bundle may leave out
# (``None`` allowed where a key's absence has a meaning). Every number anywhere in the file must also be
# finite (``refuse_non_finite``).
_REQUIRED: dict[str, Any] = {
    "input_channels": Integer(1, 256),
    "output_classes": Integer(1, 1024),
    "num_images_per_batch": Integer(1, MAX_BATCH),
    "num_crops_per_image": Integer(1, MAX_BATCH),
    # each tunable's key in a view (``autotune.tunables``): a whole number of patches or windows, or a flag
    **{t.bundle_key or t.name: Flag() if t.kind == "choice" else Integer(1, MAX_BATCH) for t in TUNABLES},
    "num_epochs": Integer(1, 1_000_000),
    "amp": Flag(),
    "roi_size": Triple(Integer(1, 4096)),
    "resample_resolution": Triple(Number(0.0, 1000.0, low_open=True)),
}
_OPTIONAL: dict[str, Any] = {
    "learning_rate": Number(0.0, 1000.0, low_open=True),
    "cache_rate": Number(0.0, 1.0),
    "sw_overlap": Number(0.0, 1.0, high_open=True),
    "num_epochs_per_validation": Integer(1, 1_000_000),
    "num_workers": Integer(0, 1024),
    "seed": Integer(0, 2**32 - 1),
    "fold": Integer(0, 99),
    "num_fold": Integer(1, 100),
    "infer_volume_shape": Triple(Integer(1, 65_536)),
    "pos_neg_ratio": Items(Number(0.0, 1e6), 2, "positive to negative crops"),
    "early_stop_patience": Integer(0, 1_000_000),
    **{key: Flag() for key in ("crop_foreground", "cache_on_device", "persistent_cache", "sigmoid", "cpu_bf16")},
}
_NULLABLE = ("early_stop_patience",)  # null: no early stop


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


def check_bundle_config(cfg: Any, where: str) -> dict[str, Any]:
    """Check the keys probe, estimate and train rely on, each against its type and range; return ``cfg``.

    Raises:
        ConfigError: naming ``where``, the key, the value and what is allowed (one line).
    """
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where}: the top level must be a mapping; regenerate the bundle with 'autotune generate'")
    refuse_expressions(cfg, where)
    for key in ("algo", "network", "loss", "optimizer", *_REQUIRED):
        if key not in cfg:
            raise ConfigError(f"{where}: key {key!r} is missing; regenerate the bundle with 'autotune generate'")
    for key, check in _REQUIRED.items():
        check(cfg[key], f"{where}: key {key!r}", ConfigError)
    for key, check in _OPTIONAL.items():
        if key in cfg and not (cfg[key] is None and key in _NULLABLE):
            check(cfg[key], f"{where}: key {key!r}", ConfigError)
    refuse_non_finite(cfg, where)  # and everywhere else: a NaN weight decay is as wrong
    for section in ("network", "loss", "optimizer"):
        if not isinstance(cfg[section], Mapping) or not isinstance(cfg[section].get("name"), str):
            raise ConfigError(f"{where}: key {section!r} must be a mapping with a 'name'")
    plan_of(cfg, where)  # a malformed tuning block is named here, not where a stage reads it
    return cfg


def known_config_keys() -> tuple[str, ...]:
    """Every key the stages read from a bundle config (the table above), whatever its template."""
    return ("algo", "network", "loss", "optimizer", *_REQUIRED, *_OPTIONAL)


def check_config_values(values: Mapping[str, Any], where: str, scopes: tuple[str, ...] = ()) -> None:
    """Check the values ``values`` gives for the keys a bundle config holds, with the same checker per key as a
    loaded config (and, under a key of ``scopes``, an algorithm's name, the values scoped to it): overrides are
    refused when they are read, before any analysis, not when the bundle is written.

    Raises:
        ConfigError: naming ``where``, the key, the value and what is allowed.
    """
    refuse_expressions(values, where)
    refuse_non_finite(values, where)
    for key, value in values.items():
        if key in scopes and isinstance(value, Mapping):
            check_config_values(value, f"{where}: {key}", ())
            continue
        check = _REQUIRED.get(key) or _OPTIONAL.get(key)
        if check is not None and not (value is None and key in _NULLABLE):
            check(value, f"{where}: key {key!r}", ConfigError)
        elif key in ("network", "loss", "optimizer") and not isinstance(value, Mapping):
            raise ConfigError(f"{where}: key {key!r} must be a mapping (its 'name' and 'args')")


def read_own_config(bundle: str | os.PathLike[str]) -> dict[str, Any]:
    """Load and check the config of a bundle autotune generated; ``bundle_root`` is set to the bundle folder.

    Raises:
        ConfigError: missing file, bad YAML, or an invalid value (the key is named).
    """
    path = bundle_config_path(bundle)
    if not path.is_file():
        raise ConfigError(f"{path}: bundle config not found; run 'autotune generate' first")
    cfg = check_bundle_config(read_yaml(path, ConfigError), str(path))
    cfg["bundle_root"] = str(path.resolve().parent.parent) if path.parent.name == "configs" else str(path.parent)
    return cfg


def save_bundle_config(bundle: str | os.PathLike[str], cfg: Mapping[str, Any]) -> Path:
    """Write ``cfg`` atomically to the bundle's config file."""
    path = bundle_config_path(bundle)
    return atomic_write_yaml(path, dict(cfg))


def write_own_config(bundle: str | os.PathLike[str], updates: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``updates`` (top-level keys) into the config of a bundle autotune generated, check it and write
    it atomically; returns the config."""
    cfg = read_own_config(bundle)
    cfg.update(updates)
    check_bundle_config(cfg, str(bundle_config_path(bundle)))
    save_bundle_config(bundle, cfg)
    return cfg
