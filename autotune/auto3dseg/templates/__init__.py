"""MONAI's templates that autotune tunes: one ``MonaiTemplate`` subclass per template, registered here once.

The registry is the only place that knows the templates by name. ``template_named`` gives a bundle's template
(an unknown one is refused in one line), ``find_template`` the same or None (a recognised template autotune
does not tune: listed and skipped), ``registered`` every registered template in order. A new template is one
module holding one subclass of ``MonaiTemplate`` (``base``: its contract) with the hashes of its versions'
scripts (``versions``: how its bundles are recognised), and one ``register`` call, here or in the code that
adds it (a test registers a fake one in its own file). ``KNOWN_VERSIONS`` holds every registered template's
versions (``autotune.auto3dseg.versions`` gives it to ``recognise``).

Importing this package imports neither torch nor MONAI.
"""

from __future__ import annotations

from autotune.auto3dseg.templates.base import ConfigReader, MonaiTemplate, TemplateVersion
from autotune.auto3dseg.templates.dints import DiNTS
from autotune.auto3dseg.templates.segresnet import SegResNet
from autotune.auto3dseg.templates.segresnet2d import SegResNet2D
from autotune.auto3dseg.templates.swinunetr import SwinUNETR
from autotune.errors import ConfigError

__all__ = ["MonaiTemplate", "ConfigReader", "TemplateVersion", "KNOWN_VERSIONS", "register", "unregister",
           "template_named", "find_template", "registered", "tuned_names"]

_REGISTRY: dict[str, MonaiTemplate] = {}
#: (template, version) -> its hashes: the registered templates' ``versions`` (tests add their own bundles' here)
KNOWN_VERSIONS: dict[tuple[str, str], TemplateVersion] = {}


def register(template: MonaiTemplate) -> MonaiTemplate:
    """Add ``template`` under its ``name``, and its versions to ``KNOWN_VERSIONS``; returns it.

    Raises:
        ValueError: a template of that name is registered already.
    """
    if template.name in _REGISTRY:
        raise ValueError(f"MONAI template {template.name!r} is registered already")
    _REGISTRY[template.name] = template
    for version, (configs, files) in template.versions.items():
        KNOWN_VERSIONS[(template.name, version)] = TemplateVersion(template.name, version, configs, files)
    return template


def unregister(name: str) -> None:
    """Remove the template ``name`` and its versions (nothing when it is not registered)."""
    template = _REGISTRY.pop(name, None)
    for version in template.versions if template is not None else ():
        KNOWN_VERSIONS.pop((name, version), None)


def find_template(name: str) -> MonaiTemplate | None:
    """The registered template ``name``, or None."""
    return _REGISTRY.get(name)


def template_named(name: str, where: object = None) -> MonaiTemplate:
    """The registered template ``name``.

    Raises:
        ConfigError: one line (prefixed with ``where``) when autotune does not tune a template of that name.
    """
    template = _REGISTRY.get(name)
    if template is None:
        prefix = f"{where}: " if where is not None else ""
        raise ConfigError(f"{prefix}autotune does not tune MONAI's {name} template (it tunes "
                          f"{', '.join(tuned_names())}); regenerate the bundle with one of those")
    return template


def registered() -> tuple[MonaiTemplate, ...]:
    """Every registered template, in the order they were registered."""
    return tuple(_REGISTRY.values())


def tuned_names() -> tuple[str, ...]:
    """The names of the registered templates."""
    return tuple(_REGISTRY)


for _template in (SegResNet(), DiNTS(), SwinUNETR(), SegResNet2D()):
    register(_template)
