"""Which family a bundle or a view belongs to: the only place that tells the template families apart."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from autotune.families.interface import TemplateFamily
from autotune.families.monai import MonaiTemplates
from autotune.families.own import OwnTemplates

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

__all__ = ["FAMILIES", "family_of", "family_for", "family_of_templates", "template_names", "spec_aliases"]

#: asked in order: the first that recognises a bundle is its family; autotune's own templates last (they take
#: any other folder and refuse it when it is read)
FAMILIES: tuple[TemplateFamily, ...] = (MonaiTemplates(), OwnTemplates())


def family_of(bundle: str | os.PathLike[str]) -> TemplateFamily:
    """The family of the bundle folder (or config file) ``bundle``."""
    return next(family for family in FAMILIES if family.recognises(bundle))


def family_of_templates(templates: Any) -> TemplateFamily:
    """The family whose templates ``templates`` (``BundleGen``'s ``templates_path_or_url``) are."""
    return next(family for family in FAMILIES if family.generates(templates))


def family_for(config: BundleConfig) -> TemplateFamily:
    """The family whose ``load_config`` read ``config``."""
    return next(family for family in FAMILIES if family.reads(config))


def template_names() -> list[str]:
    """Every template name the families know (a specs key may give any of them), sorted."""
    return sorted({name for family in FAMILIES for name in family.template_names()})


def spec_aliases() -> dict[str, str]:
    """A specs key in another spelling (MONAI's own template's, ``swunetr``) -> the template's name."""
    return {alias: name for family in FAMILIES for alias, name in family.spec_aliases().items()}
