"""autotune's own templates (segresnet, dints, unet: ``algorithm_templates/*/template.yaml``).

Their bundles hold one plain ``configs/hyper_parameters.yaml`` (``autotune.bundles.schema``), are built by
``autotune.build`` and stepped by ``autotune.step`` through ``autotune.probe.workload``, and are trained by
``autotune train`` (``autotune.trainer``). The tuned values are written to the same top-level keys the view
reads, the ``tuning:`` plan beside them in the same file.

The templates are told apart in one place only, the calibration: ``CALIBRATED`` holds one ``OwnTemplate`` per
template ``autotune calibrate`` measures (what it probes of it), registered once; ``own_template`` finds one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from autotune.errors import SpecError
from autotune.families.interface import TemplateFamily

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

__all__ = ["OwnTemplates", "KEYS", "OwnTemplate", "CALIBRATED", "own_template", "calibrated_names"]


@dataclass(frozen=True)
class OwnTemplate:
    """One of autotune's own templates as the calibration tells it apart (``autotune.calibrate``).

    Its bundles are generated from ``algorithm_templates/<name>/template.yaml`` like every other; this object
    carries only what the code needs of it by name: the batch sizes ``autotune calibrate`` probes on a GPU
    (``points``, fixed by hand, never from the estimator: as on the first GPU run), with ``--quick``
    (``quick_points``) and on a dry run (``dry_run_points``).
    """

    name: str
    points: tuple[int, ...]
    quick_points: tuple[int, ...]
    dry_run_points: tuple[int, ...] = (1, 2)

    def points_for(self, *, quick: bool = False, dry_run: bool = False) -> tuple[int, ...]:
        """The batch sizes probed: a dry run's, else ``--quick``'s, else the full set."""
        return self.dry_run_points if dry_run else (self.quick_points if quick else self.points)


#: the templates ``autotune calibrate`` measures, in its order: each registered here once
CALIBRATED: tuple[OwnTemplate, ...] = (
    OwnTemplate("segresnet", points=(1, 2, 4), quick_points=(2, 4)),
    OwnTemplate("dints", points=(1, 4, 12), quick_points=(4, 12)),
    OwnTemplate("unet", points=(1, 8), quick_points=(1, 8)),
)


def calibrated_names() -> tuple[str, ...]:
    """The names of the templates ``autotune calibrate`` measures, in order."""
    return tuple(template.name for template in CALIBRATED)


def own_template(name: str) -> OwnTemplate:
    """The calibrated template ``name``.

    Raises:
        SpecError: one line naming the templates there are.
    """
    found = next((template for template in CALIBRATED if template.name == name), None)
    if found is None:
        raise SpecError(f"unknown template {name!r} for calibrate; known: {', '.join(calibrated_names())}")
    return found

#: tunable (``autotune.tunables``) -> the keys of ``configs/hyper_parameters.yaml`` it is written to: the same
#: for the three templates (the loader batch that yields N patches per pass goes with N)
KEYS: dict[str, tuple[str, ...]] = {
    "num_patches_per_iter": ("num_patches_per_iter", "num_images_per_batch", "num_crops_per_image"),
    "num_sw_batch_size": ("num_sw_batch_size",),
    "validation_device": ("sw_input_on_cpu",),
}


class OwnTemplates(TemplateFamily):
    """The family of every bundle no other family recognises: autotune's own (see the module docstring)."""

    name: ClassVar[str] = "autotune"

    def recognises(self, bundle: str | os.PathLike[str]) -> bool:
        return True  # the last family asked: a folder that is not a bundle is refused when it is read

    def reads(self, config: BundleConfig) -> bool:
        return True

    def template_names(self) -> tuple[str, ...]:
        from autotune.bundles.templates import list_templates

        return tuple(list_templates())

    def generates(self, templates: Any) -> bool:
        return True  # autotune's BundleGen: its own templates, or a folder of them it checks when it reads them

    def load_config(self, bundle: str | os.PathLike[str]) -> BundleConfig:
        from autotune.bundles.schema import read_own_config

        return read_own_config(bundle)

    def write_back(self, bundle: str | os.PathLike[str], updates: Mapping[str, Any]) -> BundleConfig:
        from autotune.bundles.schema import write_own_config

        return write_own_config(bundle, updates)

    def probe_parts(self, config: BundleConfig, device: Any, amp_dtype: Any) -> dict[str, Any]:
        import torch

        from autotune.build import build_loss, build_network, build_optimizer
        from autotune.probe import workload
        from autotune.step import make_grad_scaler

        torch.manual_seed(config.seed)
        model = build_network(config).to(device)
        return {"device": device, "model": model, "loss_fn": build_loss(config),
                "optimizer": build_optimizer(config, model.parameters()), "amp_dtype": amp_dtype,
                "scaler": make_grad_scaler(device, amp_dtype), "workload": workload}

    def fake_parts(self, config: BundleConfig, compute: str, emulate: bool) -> tuple[Any, Any, Any, Any]:
        import torch
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        from autotune.build import build_loss, build_network, build_optimizer
        from autotune.probe import workload

        with unset_fake_temporarily(), torch.device("meta"):  # no memory, then fake parameters on ``compute``
            model = build_network(config)
        model = model._apply(lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=compute))
        return model, build_loss(config), build_optimizer(config, model.parameters()), workload

    def tunable_keys(self, config: BundleConfig) -> dict[str, tuple[str, ...]]:
        return dict(KEYS)

    def training_command(self, bundle: str | os.PathLike[str], memory_limit: str | None = None) -> list[str]:
        limit = [f"--memory-limit={memory_limit}"] if memory_limit else []
        return [sys.executable, "-m", "autotune", "train", str(bundle), *limit]
