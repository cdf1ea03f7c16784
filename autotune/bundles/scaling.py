"""How the batch handed to training follows the data, and how the recipe follows the batch.

Plain arithmetic, no torch: the tuner, the trainer and the tests share these rules.

1. **The batch cap** (nnU-Net v2's rule, ``ExperimentPlanner``: ``max_dataset_covered =
   0.05``): one optimizer step sees at most 5% of the training set's voxels,
   ``cap = round(0.05 x train_cases x median case voxels / patch voxels)``, and never
   less than ``max(2, reference batch)`` (nnU-Net's minimum batch is 2). A larger batch
   leaves too few optimizer steps per epoch on a small dataset.
2. **The learning rate** scales from the template's reference batch and learning rate
   by the template's rule: ``linear`` (``lr x N / N_ref``, Goyal et al.; DeepSpeed for
   SGD), ``sqrt`` (``lr x sqrt(N / N_ref)``; DeepSpeed for Adam-family) or ``none``.
   A scaled-up rate starts at the reference rate and ramps up over
   ``warmup_epochs x samples per epoch`` samples (Goyal et al.'s gradual warm-up).
3. **The schedule counts samples**: an epoch is every training case x crops once, the
   schedule's length is ``epochs x samples per epoch`` samples, so a batch of N takes
   ``ceil(samples / N)`` optimizer steps; the learning rate rule above, not a silent
   drop in updates, is what a larger batch changes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from autotune.errors import ConfigError
from autotune.utils import look_up_option

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

__all__ = [
    "COVERAGE_SHARE",
    "MIN_BATCH",
    "LR_RULES",
    "CAP_RULE",
    "BatchCap",
    "coverage_cap",
    "scaled_learning_rate",
    "steps_per_epoch",
    "SchedulePlan",
    "plan_schedule",
    "batch_scaling_of",
]

COVERAGE_SHARE = 0.05
MIN_BATCH = 2
LR_RULES = ("linear", "sqrt", "none")
CAP_RULE = (
    "one optimizer step covers at most 5% of the training set's voxels: "
    "round(0.05 x training cases x median case voxels / patch voxels), at least max(2, reference batch) "
    "(nnU-Net v2 ExperimentPlanner, max_dataset_covered=0.05, min batch 2)"
)


@dataclass(frozen=True)
class BatchCap:
    """The largest batch (patches per optimizer step) the training set supports."""

    value: int
    coverage_batch: float
    train_cases: int
    case_voxels: float
    patch_voxels: int
    share: float
    floor: int

    def as_dict(self) -> dict[str, Any]:
        return {"rule": CAP_RULE, **asdict(self), "coverage_batch": round(self.coverage_batch, 3)}


def coverage_cap(
    train_cases: int,
    case_shape: Sequence[float],
    roi_size: Sequence[int],
    reference_batch: int = 1,
    share: float = COVERAGE_SHARE,
) -> BatchCap:
    """nnU-Net's cap: at most ``share`` of the training voxels per optimizer step.

    Args:
        train_cases: cases the fold trains on.
        case_shape: the median case shape at the training spacing (voxels per axis).
        roi_size: the training patch.
        reference_batch: the template's batch; the cap never goes below it (nor below 2).
        share: the share of the training voxels one step may cover.
    """
    case_voxels = float(math.prod(float(v) for v in case_shape))
    patch_voxels = int(math.prod(int(v) for v in roi_size))
    coverage = share * int(train_cases) * case_voxels / max(1, patch_voxels)
    floor = max(MIN_BATCH, int(reference_batch))
    return BatchCap(max(floor, int(round(coverage))), coverage, int(train_cases), case_voxels, patch_voxels,
                    float(share), floor)


def scaled_learning_rate(reference_lr: float, reference_batch: int, batch: int, rule: str) -> float:
    """The learning rate for ``batch`` patches per step under ``rule`` (linear, sqrt, none)."""
    rule = look_up_option(rule, LR_RULES, "lr_scaling", ConfigError)
    ratio = int(batch) / max(1, int(reference_batch))
    if rule == "linear":
        return float(reference_lr) * ratio
    if rule == "sqrt":
        return float(reference_lr) * math.sqrt(ratio)
    return float(reference_lr)


def steps_per_epoch(num_cases: int, images_per_batch: int, crops_per_image: int, patches_per_iter: int) -> int:
    """Optimizer steps in one epoch: each loader batch (images x crops) splits into passes of N patches."""
    images, crops, per_pass = max(1, int(images_per_batch)), max(1, int(crops_per_image)), max(1, int(patches_per_iter))
    full, rest = divmod(int(num_cases), images)
    return full * math.ceil(images * crops / per_pass) + (math.ceil(rest * crops / per_pass) if rest else 0)


@dataclass(frozen=True)
class SchedulePlan:
    """The schedule of one run, in samples and optimizer steps."""

    batch: int
    samples_per_epoch: int
    total_samples: int
    steps_per_epoch: int
    total_steps: int
    warmup_samples: int
    warmup_steps: int
    warmup_start_factor: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_schedule(config: BundleConfig, num_cases: int, epochs: int) -> SchedulePlan:
    """The schedule for ``epochs`` epochs over ``num_cases`` training cases with the bundle's batch.

    The batch and the loader batch are read as training reads them (``autotune.bundles.tuned``);
    ``lr_warmup_samples`` and ``lr_warmup_start_factor`` (written by the tuner when the
    learning rate was scaled up) become a ramp of ``ceil(samples / N)`` steps.
    """
    tuned = config.tuned
    crops, batch = tuned.num_crops_per_image, tuned.num_patches_per_iter
    per_epoch = steps_per_epoch(num_cases, tuned.num_images_per_batch, crops, batch)
    samples = int(num_cases) * crops
    warmup_samples, start = config.lr_warmup_samples, config.lr_warmup_start_factor
    warmup_steps = math.ceil(warmup_samples / batch) if warmup_samples > 0 and start < 1.0 else 0
    return SchedulePlan(batch, samples, samples * int(epochs), per_epoch, per_epoch * int(epochs), warmup_samples,
                        warmup_steps, start if warmup_steps else 1.0)


def batch_scaling_of(cfg: Mapping[str, Any] | BundleConfig) -> dict[str, Any] | None:
    """The bundle's ``batch_scaling`` block, checked: of a loaded ``BundleConfig`` (checked when it was read), or
    of a plain config being generated; None for bundles generated without one.

    Raises:
        ConfigError: a malformed block (the key is named).
    """
    from autotune.bundles.model import BundleConfig

    if isinstance(cfg, BundleConfig):
        typed = cfg.batch_scaling
        return None if typed is None else typed.model_dump(
            include={"reference_batch", "reference_learning_rate", "lr_scaling", "warmup_epochs"})
    block = cfg.get("batch_scaling")
    if block is None:
        return None
    if not isinstance(block, Mapping):
        raise ConfigError("bundle config key 'batch_scaling' must be a mapping; regenerate the bundle")
    try:
        ref_batch = int(block["reference_batch"])
        ref_lr = float(block["reference_learning_rate"])
        warmup_epochs = float(block.get("warmup_epochs", 0.0))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"bundle config 'batch_scaling' needs reference_batch and reference_learning_rate ({exc})"
        ) from exc
    if ref_batch < 1 or ref_lr <= 0 or warmup_epochs < 0:
        raise ConfigError("bundle config 'batch_scaling': reference_batch >= 1, reference_learning_rate > 0, "
                          "warmup_epochs >= 0")
    rule = look_up_option(str(block.get("lr_scaling", "none")), LR_RULES, "batch_scaling.lr_scaling", ConfigError)
    return {"reference_batch": ref_batch, "reference_learning_rate": ref_lr, "lr_scaling": rule,
            "warmup_epochs": warmup_epochs}
