"""The MONAI Auto3DSeg template versions autotune knows: SHA-256 of each template's scripts.

A bundle that MONAI's ``BundleGen`` generated carries the template's ``scripts/`` unchanged,
so the hashes name the template and its version, and tell a tampered script from a known one.
``configs`` names the files the version writes into ``configs/`` (each must be there).
Each template's versions are data in its module (``MonaiTemplate.versions``, computed from the
templates by ``benchmarks/monai_template_hashes.py``, not a copy of them), gathered into
``KNOWN_VERSIONS`` when it is registered (``autotune.auto3dseg.templates``). A version of a template
that is not registered (added to ``KNOWN_VERSIONS`` alone) is recognised and left as generated
("does not support tuning").
"""

from __future__ import annotations

from autotune.auto3dseg.templates import KNOWN_VERSIONS, TemplateVersion, find_template

__all__ = ["TemplateVersion", "KNOWN_VERSIONS", "MONAI_DEFAULT_VERSION", "supported_line"]

#: ``MONAI_ALGO_HASH`` of MONAI 1.6.1 (``monai/utils/misc.py``): the templates it downloads by default
MONAI_DEFAULT_VERSION = "21ed8e5"


def supported_line() -> str:
    """``segresnet 21ed8e5, dints 21ed8e5``: the versions whose training autotune builds (registered templates)."""
    return ", ".join(v.label for v in KNOWN_VERSIONS.values() if find_template(v.name) is not None)
