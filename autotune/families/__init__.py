"""Template families: every kind of bundle autotune tunes, behind one interface.

A family is what wrote a bundle: autotune's own templates (``own``: ``algorithm_templates/``, read as plain
YAML, built by ``autotune.build``) or MONAI's official Auto3DSeg templates (``monai``: the bundles MONAI's
``BundleGen`` writes, through ``autotune.auto3dseg``). Each implements ``TemplateFamily`` (``interface``):
recognise a bundle, read its view, build the network and the steps for the probe and the estimator, list
its tunables with their config keys, write tuned values back with provenance, give the training command,
generate bundles from its templates, and the hooks the search and the hand-off need. ``family_of`` (a bundle
folder), ``family_for`` (a loaded view) and ``family_of_templates`` (``BundleGen``'s templates) in ``registry``
are the only place that tells the families apart; nothing outside a family tests a format or a template's name.

Names load lazily: importing this package imports neither torch nor MONAI.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "TemplateFamily": "autotune.families.interface",
    "FAMILIES": "autotune.families.registry",
    "family_of": "autotune.families.registry",
    "family_for": "autotune.families.registry",
    "family_of_templates": "autotune.families.registry",
    "template_names": "autotune.families.registry",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'autotune.families' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
