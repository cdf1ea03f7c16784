"""One place that turns a bundle config into network, loss, optimizer, schedule and transforms.

The probe, the estimator and the trainer all build through these functions, so
what is measured is what trains. Everything here reads plain data from the
bundle's ``hyper_parameters.yaml`` (see ``autotune.bundles.config``); nothing is
evaluated. torch and monai are imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from autotune.bundles.network import network_named, roi_divisor
from autotune.errors import ConfigError
from autotune.utils import look_up_option

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from monai.transforms import Compose

    from autotune.bundles.model import BundleConfig

__all__ = ["LOSSES", "OPTIMIZERS", "SCHEDULERS", "build_network", "build_loss", "build_optimizer",
           "build_lr_scheduler", "build_transforms", "amp_dtype", "roi_divisor"]

LOSSES = ("DiceCELoss", "DiceFocalLoss", "DiceLoss")
OPTIMIZERS = ("AdamW", "Adam", "SGD", "Novograd")
SCHEDULERS = ("WarmupCosineSchedule", "PolynomialLR", "CosineAnnealingLR", "none")


def build_network(config: BundleConfig) -> torch.nn.Module:
    """Build the network of ``config.network`` with the data's channels and classes, by its registered kind
    (``autotune.bundles.network``).

    Raises:
        ConfigError: unknown network name or arguments MONAI rejects.
    """
    net = config.network
    kind = network_named(net.name)
    try:
        return kind.build(net, config.input_channels, config.output_classes)
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError(f"bundle config 'network' ({kind.name}) is invalid: {exc}") from exc


def build_loss(config: BundleConfig) -> torch.nn.Module:
    """Build the loss of ``config.loss``; sigmoid bundles switch softmax for sigmoid."""
    from monai import losses

    name = look_up_option(config.loss.name, LOSSES, "loss")
    args = dict(config.loss.args)
    if config.sigmoid:
        args.update(softmax=False, sigmoid=True, to_onehot_y=False)
    try:
        return getattr(losses, name)(**args)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"bundle config 'loss' ({name}) is invalid: {exc}") from exc


def build_optimizer(config: BundleConfig, params: Iterable[Any]) -> torch.optim.Optimizer:
    """Build the optimizer of ``config.optimizer`` with ``config.learning_rate`` (else the section's ``lr``,
    else 1e-3)."""
    import torch

    name = look_up_option(config.optimizer.name, OPTIMIZERS, "optimizer")
    args = dict(config.optimizer.args)
    section_lr = args.pop("lr", 1e-3)
    lr = float(config.learning_rate if config.learning_rate is not None else section_lr)
    try:
        if name == "Novograd":
            from monai.optimizers import Novograd

            return Novograd(params, lr=lr, **args)
        return getattr(torch.optim, name)(params, lr=lr, **args)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"bundle config 'optimizer' ({name}) is invalid: {exc}") from exc


def build_lr_scheduler(
    config: BundleConfig, optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0,
    warmup_start_factor: float = 1.0,
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """Build the schedule of ``config.lr_scheduler``, stepped ``total_steps`` times in all.

    Every schedule is the closed form of ``autotune.schedule`` in a ``LambdaLR`` (step for step MONAI's
    ``WarmupCosineSchedule`` and PyTorch's ``PolynomialLR`` and ``CosineAnnealingLR``), so a run trained
    to a time budget can re-plan its length. With ``warmup_steps`` and ``warmup_start_factor < 1`` (a
    learning rate scaled up for a larger batch, see ``autotune.bundles.scaling``) the rate ramps from
    that share of itself to all of it first, and the template's schedule multiplies on top. None for
    ``none`` without a ramp.
    """
    from autotune.schedule import build_scaled_scheduler

    section = config.lr_scheduler
    name = look_up_option(section.name if section is not None else "none", SCHEDULERS, "lr_scheduler")
    args = dict(section.args) if section is not None else {}
    ramp = warmup_steps > 0 and warmup_start_factor < 1.0
    if name == "none" and not ramp:
        return None
    return build_scaled_scheduler({"name": name, "args": args}, optimizer, max(1, int(total_steps)),
                                  warmup_steps if ramp else 0, warmup_start_factor if ramp else 1.0)


def amp_dtype(config: BundleConfig, device: str | torch.device, precision: str | None = None) -> torch.dtype | None:
    """Autocast dtype for this bundle on ``device``; None means fp32 (no autocast).

    ``precision`` (``fp32``, ``bf16``, ``fp16``) when the caller has decided it (a probe request
    carries the tuning key's); else ``autotune.precision.for_bundle``: the precision the bundle was
    tuned in on this kind of device, or what its ``amp`` means on ``device``.
    """
    from autotune.precision import dtype_of, for_bundle

    if precision is None:
        precision = for_bundle(config, str(device))[0].name
    return dtype_of(precision)


def _intensity_transform(config: BundleConfig) -> Any:
    """``intensity_normalization``: z-score per channel over the foreground, or a clipped range (its bounds
    checked when the config was read: ``autotune.bundles.model.Normalization``)."""
    from monai.transforms import NormalizeIntensityd, ScaleIntensityRanged

    norm = config.intensity_normalization
    if norm.mode == "zscore":
        return NormalizeIntensityd(keys="image", nonzero=True, channel_wise=True)
    return ScaleIntensityRanged(keys="image", a_min=float(norm.a_min), a_max=float(norm.a_max), b_min=norm.b_min,
                                b_max=norm.b_max, clip=True)


def _load_transforms(config: BundleConfig, keys: list[str], modes: list[str]) -> list[Any]:
    """Load, channel first, float32, RAS, resample to the training spacing, normalise: every stage's start."""
    import torch
    from monai.transforms import EnsureChannelFirstd, EnsureTyped, LoadImaged, Orientationd, Spacingd

    return [
        LoadImaged(keys=keys, image_only=True),
        EnsureChannelFirstd(keys=keys),
        EnsureTyped(keys=keys, dtype=torch.float32),
        Orientationd(keys=keys, axcodes="RAS", labels=None),
        Spacingd(keys=keys, pixdim=list(config.resample_resolution), mode=modes),
        _intensity_transform(config),
    ]


def _random_transforms(config: BundleConfig, keys: list[str]) -> list[Any]:
    """Training's random part: crops by the foreground/background indices, flips, intensity jitter (and with
    ``augmentation: nnunet``, nnU-Net's set after them)."""
    from monai.transforms import (
        RandCropByPosNegLabeld,
        RandFlipd,
        RandScaleIntensityd,
        RandShiftIntensityd,
    )

    pos, neg = config.pos_neg_ratio
    return [
        RandCropByPosNegLabeld(
            keys=keys,
            label_key="label",
            spatial_size=list(config.roi_size),
            pos=pos,
            neg=neg,
            num_samples=config.num_crops_per_image,
            fg_indices_key="label_fg",
            bg_indices_key="label_bg",
        ),
        RandFlipd(keys=keys, prob=0.5, spatial_axis=0),
        RandFlipd(keys=keys, prob=0.5, spatial_axis=1),
        RandFlipd(keys=keys, prob=0.5, spatial_axis=2),
        RandScaleIntensityd(keys="image", factors=0.1, prob=0.5),
        RandShiftIntensityd(keys="image", offsets=0.1, prob=0.5),
        *(_nnunet_transforms(keys) if config.augmentation == "nnunet" else []),
    ]


def _nnunet_transforms(keys: list[str]) -> list[Any]:
    """nnU-Net v2's default spatial and intensity augmentation, with its probabilities, on the cropped patch:
    rotation up to 30 degrees and scaling 0.7-1.3 (each 0.2), Gaussian noise (0.1), blur (0.2), brightness
    (0.15), contrast about the mean (0.15), low resolution (0.25), gamma 0.7-1.5 keeping mean and spread (0.3)."""
    import math

    from monai.transforms import (
        RandAdjustContrastd,
        RandAffined,
        RandGaussianNoised,
        RandGaussianSmoothd,
        RandScaleIntensityd,
        RandScaleIntensityFixedMeand,
        RandSimulateLowResolutiond,
    )

    angle, blur = math.pi / 6, (0.5, 1.0)
    return [
        RandAffined(keys=keys, prob=0.2, rotate_range=(angle, angle, angle), scale_range=(0.3, 0.3, 0.3),
                    mode=("bilinear", "nearest"), padding_mode="zeros"),
        RandGaussianNoised(keys="image", prob=0.1, std=0.1),
        RandGaussianSmoothd(keys="image", prob=0.2, sigma_x=blur, sigma_y=blur, sigma_z=blur),
        RandScaleIntensityd(keys="image", factors=0.25, prob=0.15),
        RandScaleIntensityFixedMeand(keys="image", factors=0.25, prob=0.15, preserve_range=True),
        RandSimulateLowResolutiond(keys="image", prob=0.25, zoom_range=(0.5, 1.0)),
        RandAdjustContrastd(keys="image", prob=0.3, gamma=(0.7, 1.5), retain_stats=True),
    ]


def build_transforms(config: BundleConfig, stage: str, device: str | torch.device | None = None) -> Compose:
    """Transforms for ``stage`` in ``train``, ``val``, ``infer``.

    The deterministic part (load, orient, resample, normalise, crop foreground, and
    for training the foreground/background indices) comes first, so ``CacheDataset``
    caches it. With ``device`` set for training, the cached tensors move there just
    before the first random transform, so random crops and flips run on the device.
    """
    from monai.transforms import Compose, CropForegroundd, EnsureTyped, FgBgToIndicesd, SpatialPadd

    stage = look_up_option(stage, ("train", "val", "infer"), "transform stage")
    if stage == "infer":
        return Compose(_load_transforms(config, ["image"], ["bilinear"]))
    keys = ["image", "label"]
    xforms = _load_transforms(config, keys, ["bilinear", "nearest"])
    if config.crop_foreground:
        xforms.append(CropForegroundd(keys=keys, source_key="image", allow_smaller=True))
    if stage == "val":
        return Compose(xforms)
    xforms += [
        SpatialPadd(keys=keys, spatial_size=list(config.roi_size)),
        FgBgToIndicesd(keys="label", fg_postfix="_fg", bg_postfix="_bg", image_key="image"),
    ]
    if device is not None:
        xforms.append(EnsureTyped(keys=keys, device=device, track_meta=False))
    return Compose(xforms + _random_transforms(config, keys))
