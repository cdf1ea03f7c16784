"""Template families: every kind of bundle autotune tunes, behind one interface.

A family is what wrote a bundle: autotune's own templates (``own``: ``algorithm_templates/``, read as plain
YAML, built by ``autotune.build``) or MONAI's official Auto3DSeg templates (``monai``: the bundles MONAI's
``BundleGen`` writes, through ``autotune.auto3dseg``). Each implements ``TemplateFamily`` (``interface``):
recognise a bundle, read its view, build the network and the steps for the probe and the estimator, list
its tunables with their config keys, write tuned values back with provenance, give the training command,
generate bundles from its templates, and the hooks the search and the hand-off need. ``family_of`` (a bundle
folder), ``family_for`` (a loaded view) and ``family_of_templates`` (``BundleGen``'s templates) in ``registry``
are the only place that tells the families apart; nothing outside a family tests a format or a template's name.

The modules import neither torch nor MONAI at import time (each family imports its code when asked).
"""

from __future__ import annotations

from autotune.families.interface import TemplateFamily
from autotune.families.registry import FAMILIES, family_for, family_of, family_of_templates, template_names

__all__ = ["TemplateFamily", "FAMILIES", "family_of", "family_for", "family_of_templates", "template_names"]
