"""MONAI's official Auto3DSeg templates: the bundles MONAI's ``BundleGen`` writes (``autotune.auto3dseg``).

A bundle is recognised by its ``scripts/algo.py`` and its template and version by its scripts' hashes; its
view is read through MONAI's ``ConfigParser`` as its ``train.py`` reads it; the probe and the estimator run
the template's own network, loss, optimizer, loop and validation; tuned values go into the template's own
keys (``MonaiTemplate.keys``) with its ``auto_scale_*`` off, the ``tuning:`` record in ``autotune/tuning.yaml``; MONAI's
``train.py`` trains it through ``python -m autotune.launch``. What differs per template is its ``MonaiTemplate`` in the registry
``autotune.auto3dseg.templates``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from autotune.families.interface import TemplateFamily

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

__all__ = ["MonaiTemplates"]

_NO_REFERENCE = ("MONAI bundle tuned before autotune recorded its template's batch (autotune/tuning.yaml has no "
                 "recipe.reference), so its configs no longer state it: the largest fit is handed over and the "
                 "learning rate stays; regenerate the bundle to hand over by the goodput rule")


class MonaiTemplates(TemplateFamily):
    """The family of the bundles MONAI's ``BundleGen`` wrote from MONAI's templates (see the module docstring)."""

    name: ClassVar[str] = "monai"
    trained_by_autotune: ClassVar[bool] = False
    uncalibrated_reason: ClassVar[str | None] = "no calibration covers MONAI's own templates: N+1 probed"

    def recognises(self, bundle: str | os.PathLike[str]) -> bool:
        from autotune.auto3dseg.recognise import is_monai_bundle

        return is_monai_bundle(bundle)

    def reads(self, config: BundleConfig) -> bool:
        from autotune.auto3dseg.view import is_monai_view

        return is_monai_view(config)

    def template_names(self) -> tuple[str, ...]:
        from autotune.auto3dseg.versions import KNOWN_VERSIONS

        return tuple(dict.fromkeys(version.name for version in KNOWN_VERSIONS.values()))

    def spec_aliases(self) -> dict[str, str]:
        from autotune.auto3dseg.templates import registered

        return {alias: template.name for template in registered() for alias in template.spec_aliases}

    def generates(self, templates: Any) -> bool:
        from autotune.auto3dseg.bundlegen import is_monai_templates

        return is_monai_templates(templates)

    def bundle_generator(self, args: tuple[Any, ...], kwargs: Mapping[str, Any], tuner: Any) -> Any:
        from autotune.auto3dseg.bundlegen import MonaiBundleGen

        return MonaiBundleGen(*args, tuner=tuner, **kwargs)

    def load_config(self, bundle: str | os.PathLike[str]) -> BundleConfig:
        from autotune.auto3dseg.view import load_view
        from autotune.bundles.schema import check_bundle_config

        return check_bundle_config(load_view(bundle), str(bundle))

    def write_back(self, bundle: str | os.PathLike[str], updates: Mapping[str, Any]) -> BundleConfig:
        from autotune.auto3dseg.writeback import update_bundle
        from autotune.bundles.schema import check_bundle_config

        return check_bundle_config(update_bundle(bundle, updates), str(bundle))

    def probe_parts(self, config: BundleConfig, device: Any, amp_dtype: Any) -> dict[str, Any]:
        import torch

        from autotune.auto3dseg.build import probe_parts

        torch.manual_seed(config.seed)
        return probe_parts(config, device, amp_dtype)

    def fake_parts(self, config: BundleConfig, compute: str, emulate: bool) -> tuple[Any, Any, Any, Any]:
        from autotune.auto3dseg.build import fake_parts

        return fake_parts(config, compute, emulate)

    def tunable_keys(self, config: BundleConfig) -> dict[str, tuple[str, ...]]:
        from autotune.auto3dseg.templates import find_template
        from autotune.auto3dseg.view import template_of

        template = find_template(template_of(config))  # a template autotune does not tune: none
        return dict(template.keys) if template is not None else {}

    def training_command(self, bundle: str | os.PathLike[str], memory_limit: str | None = None) -> list[str]:
        from pathlib import Path

        from autotune.auto3dseg.recognise import monai_bundle_root

        root = monai_bundle_root(bundle) or Path(bundle)
        limit = [f"--memory-limit={memory_limit}"] if memory_limit else []
        return [sys.executable, "-m", "autotune.launch", *limit, "--", str(root / "scripts" / "train.py"), "run",
                f"--config_file={root / 'configs' / 'hyper_parameters.yaml'}"]

    def calibrated_as(self, config: BundleConfig) -> str | None:
        return None  # a calibration's bound was measured on autotune's own templates: MONAI's are probed at N+1

    def handoff_reference(self, config: BundleConfig) -> dict[str, Any] | None:
        block = config.batch_scaling
        return block.model_dump(exclude_none=True) if block is not None else None

    def keeps_learning_rate_largest(self, config: BundleConfig) -> bool:
        return True

    def no_reference_reason(self, config: BundleConfig) -> str:
        return _NO_REFERENCE
