"""The tuned values a bundle trains and infers with, read through one typed accessor: ``TunedValues``.

autotune's trainer (``autotune.trainer``: the loader batch, the passes of a step, the out-of-memory line, the
step-downs it starts from) and its inferer (``autotune.trainer.infer``: the sliding-window batch and where the
volume lives) read the tuned values only here, as nnU-Net's trainer reads its plans only through its
``ConfigurationManager``: ``tuned_values(cfg)`` reads each tunable from the bundle's view
(``autotune.tunables``), the loader batch beside the batch, and the typed ``tuning:`` block
(``autotune.bundles.plan.TuningPlan``; None for a bundle never tuned). The values are read from the template's
keys only; the block is the tuning's provenance (its peak, its limit, a training run's step-downs), never a second
source of the batch, the window batch or where validation lives.

A bundle states its batch once: ``num_patches_per_iter`` patches per forward pass, each loader batch of
``num_images_per_batch`` x ``num_crops_per_image`` patches split into whole passes of it (what the write-back
writes: ``autotune.tunables.loader_settings``; a template may state a loader batch of several passes, as
DiNTS's 2 x 1 in passes of 1). A bundle whose loader batch is not a whole number of passes (a
``num_patches_per_iter`` edited by hand past its loader batch: 8 over 2 x 1 would train passes of 2 while its
out-of-memory line said 8) is refused in one line naming the three keys and what to set; nothing is
reconciled silently. Bundles written by earlier versions hold the same keys and load unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.bundles.plan import TuningPlan
from autotune.errors import ConfigError
from autotune.tunables import (
    BATCH,
    SW_BATCH,
    TUNABLES,
    VALIDATION_DEVICE,
    Point,
    ValidationDevice,
    loader_settings,
)

__all__ = ["TunedValues", "tuned_values"]


@dataclass(frozen=True)
class TunedValues:
    """What a bundle trains and infers with (see the module docstring).

    Attributes:
        point: each tunable's value in the bundle's view (``autotune.tunables.Point``, every tunable present).
        num_images_per_batch: images per loader batch; ``num_crops_per_image`` patches cropped from each.
        plan: the typed ``tuning:`` block, or None when the bundle was never tuned.
    """

    point: Point
    num_images_per_batch: int
    num_crops_per_image: int
    plan: TuningPlan | None = None

    @property
    def num_patches_per_iter(self) -> int:
        """Patches per forward pass (and optimizer step)."""
        return int(self.point.values[BATCH.name])

    @property
    def num_sw_batch_size(self) -> int:
        """Windows per pass of the sliding window."""
        return int(self.point.values[SW_BATCH.name])

    @property
    def validation_device(self) -> ValidationDevice:
        """Where the validation volume and the stitched output are held (its ``volume_device(device)``: where a
        volume is put for windows running on ``device``)."""
        return ValidationDevice(self.point.values[VALIDATION_DEVICE.name])

    @property
    def loader_patches(self) -> int:
        """Patches per loader batch: images x crops."""
        return self.num_images_per_batch * self.num_crops_per_image

    @property
    def passes_per_loader_batch(self) -> int:
        """Forward passes (optimizer steps) per loader batch."""
        return self.loader_patches // self.num_patches_per_iter

    @property
    def tuned_peak_bytes(self) -> int | None:
        """The peak the tuning measured (or estimated) at these values; None for a bundle never tuned."""
        return self.plan.peak_bytes if self.plan is not None else None


def tuned_values(config: Any, where: str | None = None) -> TunedValues:
    """The tuned values of the loaded config ``config`` (an ``autotune.bundles.model.BundleConfig``, which
    imports this module: ``config.tuned``); ``where`` names it in an error (default the bundle).

    Raises:
        ConfigError: the loader batch is not a whole number of passes of ``num_patches_per_iter`` (one line
            naming the keys and what to set), or the config is malformed.
    """
    place = where or str(config.bundle_root or "bundle config")
    values = {t.name: t.bundle_value(config) for t in TUNABLES}
    images, crops = config.num_images_per_batch, config.num_crops_per_image
    n = int(values[BATCH.name])
    if (images * crops) % n:
        fix = loader_settings(n, crops)["num_images_per_batch"]
        raise ConfigError(
            f"{place}: {BATCH.name} {n} is not a whole number of passes of the loader batch num_images_per_batch "
            f"{images} x num_crops_per_image {crops} = {images * crops} patches (training would run passes of "
            f"other sizes); set num_images_per_batch to {fix}, or {BATCH.name} to a divisor of {images * crops}, "
            "or run 'autotune tune' again, which writes all three")
    return TunedValues(Point.of(values), images, crops, config.plan)
