"""Overrides held against the keys the templates know, before any bundle is written.

A template knows the keys of a bundle it fills (``render_config`` run on stand-in statistics: exactly the keys
and nesting a generated bundle holds) and the keys the stages read from any bundle (the schema's table). An
override key no generated template knows is refused in one line naming it and the nearest known key ("did you
mean"). Top-level overrides apply to every algorithm generated, so a top-level key that only some of them know
is refused too, naming the templates that take it (give it under their names). Inside a mapping the template
holds, keys are held against that mapping, except where the mapping is open by design: a constructor's ``args``
(MONAI's network, loss, optimizer or schedule takes them) and ``intensity_normalization`` (a mode's settings).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.errors import ConfigError

__all__ = ["CONSTRUCTORS", "OPEN_KEYS", "STAGE_KEYS", "check_override_keys", "template_keys"]

#: mappings whose keys are not the template's to list
OPEN_KEYS = frozenset({"args", "intensity_normalization"})
#: the sections that name a class (``name``) and what it is built with (``args``)
CONSTRUCTORS = frozenset({"network", "loss", "optimizer", "lr_scheduler"})
#: keys a stage reads from any autotune bundle that a template need not state
STAGE_KEYS = frozenset({"tuning", "lr_warmup_samples", "lr_warmup_start_factor", "sw_overlap_axes"})

# stand-in statistics: the keys and nesting of a filled bundle do not depend on the data
_STATS = {"stats_summary": {
    "image_stats": {"spacing": {"median": [1.0, 1.0, 1.0]}, "shape": {"median": [32, 32, 32]},
                    "sizemm": {"percentile_99_5": [32.0, 32.0, 32.0]}, "channels": {"max": 1}},
    "image_foreground_stats": {"intensity": {"percentile_00_5": 0.0, "percentile_99_5": 1.0}},
    "label_stats": {"labels": [0, 1]}}}


def template_keys(name: str, templates_path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """What a bundle of template ``name`` holds: a filled config (its values stand-ins), plus the keys the stages
    read from any bundle.

    Raises:
        ConfigError: the template is unknown or malformed.
    """
    from autotune.bundles.render import render_config
    from autotune.bundles.schema import known_config_keys
    from autotune.bundles.templates import load_template

    filled = render_config(load_template(name, templates_path), _STATS, {"modality": "MRI"}, 0, 1)
    known = {**dict.fromkeys((*known_config_keys(), *STAGE_KEYS)), **filled}
    for key, fields in _documented_sections().items():  # a switch the model documents, stated or not
        if isinstance(known.get(key), Mapping):
            known[key] = {**dict.fromkeys(fields), **known[key]}
    return known


def _documented_sections() -> dict[str, tuple[str, ...]]:
    """The sections whose keys the config model lists (``fast_training``, ``batch_scaling``, ...): their keys."""
    from autotune.bundles.model import BundleConfig
    from autotune.checks.typed import OpenModel, nested_model

    out = {}
    for name, field in BundleConfig.model_fields.items():
        nested = nested_model(field.annotation)
        if nested is not None and not issubclass(nested, OpenModel):
            out[name] = tuple(nested.model_fields)
    return out


def check_override_keys(overrides: Mapping[str, Any], algos: Sequence[str], where: str = "overrides",
                        templates_path: str | os.PathLike[str] | None = None) -> None:
    """Refuse an override key that the templates of ``algos`` do not know (see the module's docstring).

    ``overrides``: as ``load_overrides`` returns them (a top-level template name scopes its values).

    Raises:
        ConfigError: one line naming ``where``, the key's path, the nearest known key and what to do.
    """
    from autotune.bundles.templates import list_templates

    scopes = set(list_templates(templates_path))
    known = {algo: template_keys(algo, templates_path) for algo in algos}
    for algo, value in overrides.items():  # a scope is checked whether or not its algorithm is generated now
        if algo in scopes and isinstance(value, Mapping):
            _check(value, {algo: known.get(algo) or template_keys(algo, templates_path)}, "", f"{where}: {algo}")
    _check({k: v for k, v in overrides.items() if k not in scopes}, known, "", where)


def _check(values: Mapping[str, Any], holders: Mapping[str, Any], prefix: str, where: str) -> None:
    """``values`` against ``holders`` (template -> the mapping it holds at ``prefix``): every template must
    know every key (an override at a level applies to each template there); recursively, into the mappings
    the templates hold."""
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if prefix in CONSTRUCTORS and key == "args":  # what the named class takes, stated or not by the template
            continue
        takers = {algo: held[key] for algo, held in holders.items() if key in held}
        if not takers:
            candidates = [f"{prefix}.{k}" if prefix else str(k) for held in holders.values() for k in held]
            _refuse(path, candidates, where, list(holders))
        if len(takers) < len(holders):
            _partly(path, list(takers), list(holders), where)
        if isinstance(value, Mapping) and key not in OPEN_KEYS and all(isinstance(v, Mapping) for v in takers.values()):
            _check(value, takers, path, where)


def _refuse(key: str, candidates: Sequence[str], where: str, templates: Sequence[str]) -> None:
    close = difflib.get_close_matches(key, sorted(set(candidates)), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    whose = f"the {templates[0]} template" if len(templates) == 1 else f"any template of {', '.join(templates)}"
    raise ConfigError(f"{where}: key {key!r} is not a key of {whose}; {hint}fix or remove it")


def _partly(key: str, takers: Sequence[str], templates: Sequence[str], where: str) -> None:
    others = [t for t in templates if t not in takers]
    nested = "".join("{" + part + ": " for part in key.split(".")) + "..." + "}" * len(key.split("."))
    scoped = ", ".join(f"{t}: {nested}" for t in takers)
    raise ConfigError(f"{where}: key {key!r} is taken by {', '.join(takers)} only ({', '.join(others)} "
                      f"{'has' if len(others) == 1 else 'have'} no such key), and a top-level override applies to "
                      f"every algorithm generated; give it under {'its' if len(takers) == 1 else 'their'} "
                      f"name{'s' if len(takers) > 1 else ''} ({scoped})")
