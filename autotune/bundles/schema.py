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

from autotune.bundles.model import MAX_BATCH, BundleConfig
from autotune.errors import ConfigError
from autotune.files import atomic_write_yaml
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


def check_bundle_config(view: Any, where: str) -> BundleConfig:
    """The checked config of a family's plain ``view`` (``autotune.bundles.model.BundleConfig``).

    Raises:
        ConfigError: naming ``where``, the key, the value and what is allowed (one line).
    """
    if isinstance(view, BundleConfig):
        return view
    if not isinstance(view, Mapping):
        raise ConfigError(f"{where}: the top level must be a mapping; regenerate the bundle with 'autotune generate'")
    return BundleConfig.parse(view, where)


def known_config_keys() -> tuple[str, ...]:
    """Every key a bundle config may hold (``BundleConfig``'s fields), whatever its template."""
    return tuple(name for name in BundleConfig.model_fields if name != "bundle_root")


def check_config_values(values: Mapping[str, Any], where: str, scopes: tuple[str, ...] = ()) -> None:
    """Check the values ``values`` gives for the keys a bundle config holds, with the same field types as a
    loaded config (and, under a key of ``scopes``, an algorithm's name, the values scoped to it): overrides are
    refused when they are read, before any analysis, not when the bundle is written. A mapping given for a
    section is checked key by key (an override merges into the template's section).

    Raises:
        ConfigError: naming ``where``, the key, the value and what is allowed.
    """
    from autotune.checks import refuse_expressions, refuse_non_finite
    from autotune.checks.typed import check_partial

    refuse_expressions(values, where)
    refuse_non_finite(values, where)
    for key, value in values.items():
        if key in scopes and isinstance(value, Mapping):
            check_config_values(value, f"{where}: {key}", ())
    check_partial(BundleConfig, {k: v for k, v in values.items() if k not in scopes}, where)


def read_own_config(bundle: str | os.PathLike[str]) -> BundleConfig:
    """Load and check the config of a bundle autotune generated; ``bundle_root`` is set to the bundle folder.

    Raises:
        ConfigError: missing file, bad YAML, or an invalid value (the key is named).
    """
    path = bundle_config_path(bundle)
    if not path.is_file():
        raise ConfigError(f"{path}: bundle config not found; run 'autotune generate' first")
    view = read_yaml(path, ConfigError)
    if isinstance(view, dict):
        view["bundle_root"] = str(path.resolve().parent.parent) if path.parent.name == "configs" else str(path.parent)
    return check_bundle_config(view, str(path))


def save_bundle_config(bundle: str | os.PathLike[str], view: Mapping[str, Any]) -> Path:
    """Write ``view`` (plain data; a ``BundleConfig``'s own) atomically to the bundle's config file."""
    path = bundle_config_path(bundle)
    data = view.as_view() if isinstance(view, BundleConfig) else dict(view)
    data.pop("bundle_root", None)  # set where the bundle is read, not kept in the file
    return atomic_write_yaml(path, data)


def write_own_config(bundle: str | os.PathLike[str], updates: Mapping[str, Any]) -> BundleConfig:
    """Merge ``updates`` (top-level keys) into the config of a bundle autotune generated, check it and write
    it atomically; returns the config."""
    config = read_own_config(bundle)
    view = {**config.as_view(), **updates}
    checked = check_bundle_config(view, str(bundle_config_path(bundle)))
    save_bundle_config(bundle, view)
    return checked
