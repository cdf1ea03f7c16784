"""MONAI Auto3DSeg's own bundles: recognise, read, probe, estimate, write back, launch, generate.

What it offers (names load lazily, so importing this package does not import torch):

- ``is_monai_bundle`` / ``monai_bundle_root`` / ``identify``: a bundle MONAI's ``BundleGen`` generated, its
  template and version by the hashes of its scripts (``versions``); unknown or changed ones are refused.
- ``load_view``: the bundle read through MONAI's ``ConfigParser`` as its ``train.py`` reads it, as the plain
  config the tuner, the probe and the estimator take (``format: monai``).
- ``probe_parts`` / ``fake_parts`` / ``MonaiWorkload``: the template's own network, loss, optimizer and
  training loop and validation, for the probe's child and for the estimator.
- ``update_bundle``: tuned values into the template's own keys, provenance in ``autotune/tuning.yaml``.
- ``MonaiBundleGen``: MONAI's ``BundleGen`` on MONAI's templates, tuned by autotune (``autotune.BundleGen``
  with ``templates_path_or_url`` pointing at them); ``monai_generation``: MONAI's own ``BundleGen`` (AutoRunner's
  generation step) given the memory autotune tunes for, so that SwinUNETR generates without a GPU too.
- ``launch`` (``python -m autotune.launch``): runs a template's ``scripts/train.py`` under a memory limit,
  recording the peak.
"""

from __future__ import annotations

from autotune.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "is_monai_bundle": "autotune.auto3dseg.recognise",
    "monai_bundle_root": "autotune.auto3dseg.recognise",
    "identify": "autotune.auto3dseg.recognise",
    "KNOWN_VERSIONS": "autotune.auto3dseg.versions",
    "load_view": "autotune.auto3dseg.view",
    "is_monai_view": "autotune.auto3dseg.view",
    "probe_parts": "autotune.auto3dseg.build",
    "fake_parts": "autotune.auto3dseg.build",
    "MonaiWorkload": "autotune.auto3dseg.workload",
    "update_bundle": "autotune.auto3dseg.writeback",
    "MonaiBundleGen": "autotune.auto3dseg.bundlegen",
    "is_monai_templates": "autotune.auto3dseg.bundlegen",
    "monai_generation": "autotune.auto3dseg.bundlegen",
    "launch": "autotune.auto3dseg.launcher",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
