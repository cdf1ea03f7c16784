"""The registry of algorithm templates: ``algorithm_templates/<algo>/template.yaml`` (top level).

Templates are plain data read with ``yaml.safe_load``. A value that looks like a
MONAI bundle expression (a string starting with ``$``) is refused: nothing in a
template is ever evaluated.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.bundles.schema import check_config_values
from autotune.checks.tree import refuse_expressions, refuse_non_finite
from autotune.errors import ConfigError
from autotune.tunables import TUNABLES
from autotune.utils import expand_path, look_up_option, read_yaml

__all__ = [
    "TEMPLATE_FILE",
    "REQUIRED_TRAINING_KEYS",
    "default_templates_path",
    "list_templates",
    "load_template",
    "reject_expressions",
    "list_presets",
    "preset_path",
    "load_overrides",
    "Overrides",
]

TEMPLATE_FILE = "template.yaml"
REQUIRED_TRAINING_KEYS = (
    "roi_size",
    "resample_resolution",
    "intensity_normalization",
    "num_images_per_batch",
    "num_crops_per_image",
    *(t.bundle_key or t.name for t in TUNABLES),  # each tunable's starting value (autotune.tunables)
    "amp",
    "learning_rate",
    "num_epochs",
    "cache_rate",
)


def default_templates_path() -> Path:
    """``$AUTOTUNE_TEMPLATES`` if set, else the shipped ``algorithm_templates/``: inside the package for a
    wheel (``setup.py`` maps the top-level folder to ``autotune/algorithm_templates``), at the top of the
    repository for a checkout."""
    from autotune.checks.environment import setting

    env = setting("AUTOTUNE_TEMPLATES")
    if env is not None:
        return Path(env)
    package = Path(__file__).resolve().parents[1]
    installed = package / "algorithm_templates"  # a wheel: setup.py maps the folder into the package
    checkout = package.parent / "algorithm_templates"  # a checkout (editable install): the top-level folder
    return installed if installed.is_dir() or not checkout.is_dir() else checkout


def _root(templates_path: str | os.PathLike[str] | None) -> Path:
    root = expand_path(templates_path).resolve() if templates_path else default_templates_path()
    if not root.is_dir():
        raise ConfigError(
            f"templates folder {root} not found; pass templates_path or set AUTOTUNE_TEMPLATES to the "
            "algorithm_templates/ folder of an autotune checkout"
        )
    return root


def list_templates(templates_path: str | os.PathLike[str] | None = None) -> list[str]:
    """Names of the templates found (folders holding a ``template.yaml``), sorted."""
    root = _root(templates_path)
    return sorted(p.parent.name for p in root.glob(f"*/{TEMPLATE_FILE}"))


def list_presets(templates_path: str | os.PathLike[str] | None = None) -> list[str]:
    """Names of the override presets shipped in ``algorithm_templates/presets/``."""
    return sorted(p.stem for p in (_root(templates_path) / "presets").glob("*.yaml"))


def preset_path(name_or_path: str | os.PathLike[str], templates_path: str | os.PathLike[str] | None = None) -> Path:
    """A preset name (``tiny``) -> its shipped YAML; anything else is taken as a path."""
    text = str(name_or_path)
    if os.sep not in text and not text.endswith((".yaml", ".yml")):
        look_up_option(text, list_presets(templates_path), "overrides preset")
        return _root(templates_path) / "presets" / f"{text}.yaml"
    return expand_path(text)


class Overrides(dict):  # type: ignore[type-arg]
    """Overrides as ``load_overrides`` returns them; ``source`` (the preset or file, else ``overrides``) is named in
    an error about them."""

    def __init__(self, values: Mapping[str, Any], source: str) -> None:
        super().__init__(values)
        self.source = source


def load_overrides(
    overrides: Mapping[str, Any] | str | os.PathLike[str] | None,
    templates_path: str | os.PathLike[str] | None = None,
) -> Overrides:
    """Overrides as the CLI's ``--overrides`` takes them: a preset name (``tiny``), a YAML file or a mapping.

    Its keys are held against what the templates know by ``autotune.bundles.override_keys``, once the
    algorithms generated are known.

    Returns:
        A new dict of plain data (empty for ``None`` or an empty file), naming where it came from.

    Raises:
        ConfigError: an unknown preset (the valid names are listed), an unreadable file,
            a top level that is not a mapping, a ``$`` expression, a NaN or infinity, a value a bundle
            config would refuse for its key (``check_config_values``).
    """
    if overrides is None:
        return Overrides({}, "overrides")
    if isinstance(overrides, Mapping):
        data: Any = dict(overrides)
        where = str(getattr(overrides, "source", "overrides"))
    elif isinstance(overrides, (str, os.PathLike)):
        if not str(overrides).strip():
            return Overrides({}, "overrides")
        data = read_yaml(preset_path(overrides, templates_path), ConfigError)
        where = str(overrides)
    else:
        raise ConfigError(
            f"overrides must be a preset name (tiny), a YAML file or a mapping, got {type(overrides).__name__}"
        )
    if data is None:
        return Overrides({}, where)
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: overrides must be a mapping of config keys to values")
    check_config_values(data, where, scopes=tuple(list_templates(templates_path)))
    return Overrides(data, where)


def reject_expressions(value: Any, where: str) -> None:
    """Raise ConfigError if any string in ``value`` is a ``$`` expression (each shared node looked at once)."""
    refuse_expressions(value, where, ConfigError)


def load_template(name: str, templates_path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Load and check one template.

    Raises:
        ConfigError: unknown name (listing the valid ones), unreadable YAML, a missing
            section or key, an expression string, or a NaN or infinity.
    """
    root = _root(templates_path)
    look_up_option(name, list_templates(root), "algorithm")
    path = root / name / TEMPLATE_FILE
    data = read_yaml(path, ConfigError)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    reject_expressions(data, str(path))
    refuse_non_finite(data, str(path))
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ConfigError(f"{path}: key 'version' must be a positive integer")
    for section in ("network", "loss", "optimizer"):
        if not isinstance(data.get(section), Mapping) or not isinstance(data[section].get("name"), str):
            raise ConfigError(f"{path}: key {section!r} must be a mapping with a 'name'")
    roi = data.get("roi")
    if not isinstance(roi, Mapping) or not {"divisor", "min", "max"} <= set(roi):
        raise ConfigError(f"{path}: key 'roi' must hold 'divisor', 'min' and 'max'")
    training = data.get("training")
    if not isinstance(training, Mapping):
        raise ConfigError(f"{path}: key 'training' must be a mapping")
    missing = [key for key in REQUIRED_TRAINING_KEYS if key not in training]
    if missing:
        raise ConfigError(f"{path}: 'training' lacks {', '.join(missing)}; add them")
    data.setdefault("name", name)
    data.setdefault("tuning", {"supported": False})
    data["path"] = str(path)
    return data
