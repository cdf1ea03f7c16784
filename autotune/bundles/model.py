"""A bundle's config as one typed, checked object: ``BundleConfig``.

Every stage reads a bundle through this object (``autotune.bundles.config.load_bundle_config``): its template
family makes the plain view (autotune's own ``configs/hyper_parameters.yaml``, or what MONAI's configs resolve
to), and ``BundleConfig.parse`` checks it once, key by key, into typed fields; nothing after that reads the view
as a dict. A refused value is one line naming the file and the key (``autotune.checks.typed``).

The sections a person edits are typed too: ``network``, ``loss``, ``optimizer`` and ``lr_scheduler``
(``Section``: a class name and the arguments MONAI's class takes), ``fast_training`` (``FastTraining``: the
documented switches, ``ram_fraction`` in (0, 1]), ``batch_scaling`` (``BatchScaling``), ``intensity_normalization``
and the ``tuning:`` block (``autotune.bundles.plan.TuningPlan``). What a bundle derives from its data is held
against what any device can run: a validation volume (``infer_volume_shape``) or a patch (``roi_size``) of
more than ``MAX_VOXELS`` voxels is refused, naming the key it comes from.

The template families keep the view itself (``view``): they write tuned values back into their own keys and
MONAI's readers resolve what a MONAI template holds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import cached_property
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from autotune.checks import Choice, Flag, Integer, Items, Number, Text, Triple
from autotune.checks.typed import Checked, FileModel, OpenModel, Refused, parse, refuse_key

__all__ = ["BundleConfig", "Section", "FastTraining", "BatchScaling", "Normalization", "MAX_BATCH", "MAX_VOXELS",
           "LR_RULES", "AUGMENTATIONS"]

MAX_BATCH = 65_536  # patches or windows per pass: beyond any device
#: a volume or patch larger than this (2^31 voxels, about 1290^3) is beyond any device's memory in float32
MAX_VOXELS = 2**31
LR_RULES = ("linear", "sqrt", "none")
AUGMENTATIONS = ("standard", "nnunet")
_REGENERATE = "regenerate the bundle with 'autotune generate', or fix the key"

PositiveInt = Annotated[int, Checked(Integer(1, MAX_BATCH))]
Switch = Annotated[bool, Checked(Flag())]
Fraction = Annotated[float, Checked(Number(0.0, 1.0, low_open=True))]


class Section(OpenModel):
    """A constructor's section (``network``, ``loss``, ``optimizer``, ``lr_scheduler``): the class ``name`` and
    the ``args`` it is built with; further keys a template keeps there (DiNTS's ``topology``, the MONAI
    template's tag) are kept as they are (``extra``)."""

    name: Annotated[str, Checked(Text())]
    args: dict[str, Any] = Field(default_factory=dict)

    def extra(self, key: str, default: Any = None) -> Any:
        """A further key of the section (``topology``), or ``default``."""
        return (self.model_extra or {}).get(key, default)

    def as_dict(self) -> dict[str, Any]:
        """The section as plain data (what the view holds)."""
        return self.model_dump()


class FastTraining(FileModel):
    """The fast-mode switches (``autotune train --mode fast``; docs/training.md)."""

    cache: Switch = True
    thread_loader: Switch = True
    # torch.compile of the training forward (and its backward); eager after one line where it fails
    compile: Switch = False
    nvtx: Switch = True
    gpu_monitor: Switch = True
    gpu_monitor_interval_s: Annotated[float, Checked(Number(0.0, 3600.0, low_open=True))] = 1.0
    ram_fraction: Fraction = 0.5
    device_fraction: Fraction = 0.25
    cache_dir: Annotated[str, Checked(Text())] | None = None


class BatchScaling(FileModel):
    """The recipe's reference batch and how the learning rate follows another batch (docs/batch-scaling.md)."""

    reference_batch: PositiveInt
    reference_learning_rate: Annotated[float, Checked(Number(0.0, 1000.0, low_open=True))]
    lr_scaling: Annotated[str, Checked(Choice(LR_RULES, "learning-rate rule"))] = "none"
    warmup_epochs: Annotated[float, Checked(Number(0.0, 1e6))] = 0.0
    # a MONAI template's reference says where it comes from (``autotune.auto3dseg.reference``)
    source: str | None = None
    optimizer: str | None = None
    lr_rule_reason: str | None = None


class Normalization(FileModel):
    """``intensity_normalization``: ``zscore`` (per channel, over the foreground) or ``clip`` to a range."""

    mode: Annotated[str, Checked(Choice(("zscore", "clip"), "intensity_normalization mode"))] = "zscore"
    a_min: Annotated[float, Checked(Number())] | None = None
    a_max: Annotated[float, Checked(Number())] | None = None
    b_min: Annotated[float, Checked(Number())] = 0.0
    b_max: Annotated[float, Checked(Number())] = 1.0

    @model_validator(mode="after")
    def _clip_range(self) -> Normalization:
        if self.mode == "clip" and (self.a_min is None or self.a_max is None or self.a_min >= self.a_max):
            refuse_key("intensity_normalization", f"mode clip needs a_min below a_max, got a_min {self.a_min} and "
                       f"a_max {self.a_max}")
        return self


class BundleConfig(FileModel):
    """A bundle's config, checked (see the module docstring). ``bundle_root`` is the bundle's folder."""

    # what the bundle is
    algo: Annotated[str, Checked(Text())]
    bundle_root: str = ""
    template_version: Annotated[int, Checked(Integer(0, 1_000_000))] | None = None
    name: str | None = None
    modality: str | None = None
    class_names: list[str] | None = None
    fold: Annotated[int, Checked(Integer(0, 99))] = 0
    num_fold: Annotated[int, Checked(Integer(1, 100))] = 1
    datalist: str | None = None
    dataroot: str | None = None
    datastats: str | None = None
    # the data and the network
    input_channels: Annotated[int, Checked(Integer(1, 256))]
    output_classes: Annotated[int, Checked(Integer(1, 1024))]
    sigmoid: Switch = False
    network: Section
    loss: Section
    optimizer: Section
    lr_scheduler: Section | None = None
    roi_size: Annotated[list[int], Checked(Triple(Integer(1, 4096)))]
    resample_resolution: Annotated[list[float], Checked(Triple(Number(0.0, 1000.0, low_open=True)))]
    infer_volume_shape: Annotated[list[int], Checked(Triple(Integer(1, 65_536)))] | None = None
    intensity_normalization: Normalization = Field(default_factory=Normalization)
    crop_foreground: Switch = True
    pos_neg_ratio: Annotated[list[float], Checked(Items(Number(0.0, 1e6), 2, "positive to negative crops"))] = \
        Field(default_factory=lambda: [1.0, 1.0])
    # training's random transforms after the crop: flips and intensity jitter (standard), or those plus nnU-Net's
    # rotation, scaling, noise, blur, contrast, low resolution and gamma (nnunet); autotune.build
    augmentation: Annotated[str, Checked(Choice(AUGMENTATIONS, "augmentation"))] = "standard"
    # the batch, the sliding window and where validation lives (``autotune.tunables``)
    num_images_per_batch: PositiveInt
    num_crops_per_image: PositiveInt
    num_patches_per_iter: PositiveInt
    num_sw_batch_size: PositiveInt
    sw_input_on_cpu: Switch
    sw_overlap: Annotated[float, Checked(Number(0.0, 1.0, high_open=True))] = 0.5
    # the recipe
    amp: Switch
    cpu_bf16: Switch | None = None
    # may be left out (the optimizer section's ``lr`` then), but a ``learning_rate: null`` written is refused
    learning_rate: Annotated[float | None, Checked(Number(0.0, 1000.0, low_open=True))] = None
    lr_warmup_samples: Annotated[int, Checked(Integer(0, 2**62))] = 0
    lr_warmup_start_factor: Annotated[float, Checked(Number(0.0, 1.0, low_open=True))] = 1.0
    num_epochs: Annotated[int, Checked(Integer(1, 1_000_000))]
    num_epochs_per_validation: Annotated[int, Checked(Integer(1, 1_000_000))] = 1
    early_stop_patience: Annotated[int, Checked(Integer(0, 1_000_000))] | None = None
    seed: Annotated[int, Checked(Integer(0, 2**32 - 1))] = 0
    batch_scaling: BatchScaling | None = None
    # training's data
    cache_rate: Annotated[float, Checked(Number(0.0, 1.0))] = 1.0
    cache_on_device: Switch = True
    persistent_cache: Switch = False
    num_workers: Annotated[int, Checked(Integer(0, 1024))] = 2
    fast_training: FastTraining = Field(default_factory=FastTraining)
    # tuning
    tuning_supported: Switch = True
    tuning_ranges: dict[str, Annotated[list[int], Checked(Items(Integer(1, MAX_BATCH), 2, "low and high"))]] = \
        Field(default_factory=dict)
    tuning_validation_devices: list[Literal["device", "cpu"]] = Field(default_factory=lambda: ["device", "cpu"])
    tuning: Any = None  # the ``tuning:`` block: a ``TuningPlan`` once parsed
    # a MONAI template's view (``autotune.auto3dseg.view``)
    format: Literal["monai"] | None = None
    monai_template: str | None = None
    monai_template_version: str | None = None
    arch_code_sha256: str | None = None
    roi_size_valid: Annotated[list[int], Checked(Triple(Integer(1, 4096)))] | None = None
    sw_overlap_axes: Annotated[list[float], Checked(Triple(Number(0.0, 1.0, high_open=True)))] | None = None
    auto_scale_allowed: Switch | None = None
    batch_source: str | None = None
    channels_last: Switch = True
    model_channels_last: Switch | None = None
    spatial_dims: Annotated[int, Checked(Integer(2, 3))] | None = None
    loader_label_dtype: Annotated[str, Checked(Choice(("uint8", "int16", "int32", "int64", "float32"),
                                                       "label dtype"))] | None = None
    use_pretrain: Switch | None = None

    #: the value of a tunable registered after these fields were written (``autotune.tunables``), by view key
    extra_tunables: dict[str, Any] = Field(default_factory=dict)

    _view: Mapping[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _tunables_beyond_fields(cls, data: Any) -> Any:
        from autotune.tunables import TUNABLES

        if not isinstance(data, Mapping):
            return data
        more = {t.view_key: t for t in TUNABLES if t.view_key not in cls.model_fields and t.view_key in data}
        if not more:
            return data
        for key, tunable in more.items():
            check = Flag() if tunable.kind == "choice" else Integer(1, MAX_BATCH)
            try:
                check(data[key], "", Refused)
            except Refused as exc:
                refuse_key(key, str(exc))
        return {**{k: v for k, v in data.items() if k not in more}, "extra_tunables": {k: data[k] for k in more}}

    def tunable_value(self, key: str) -> Any:
        """What the view key ``key`` of a tunable holds (``autotune.tunables.Tunable.bundle_value``).

        Raises:
            ConfigError: a whole-number tunable's key the bundle does not hold.
        """
        if key in type(self).model_fields:
            return getattr(self, key)
        if key not in self.extra_tunables:
            from autotune.errors import ConfigError

            raise ConfigError(f"{self.bundle_root or 'bundle config'}: key {key!r} is missing; regenerate the "
                              "bundle with 'autotune generate'")
        return self.extra_tunables[key]

    @field_validator("tuning", mode="before")
    @classmethod
    def _tuning_plan(cls, block: Any, info: Any) -> Any:
        from autotune.bundles.plan import TuningPlan

        if block is None or isinstance(block, TuningPlan):
            return block
        where = (info.context or {}).get("where") or "bundle config"
        return TuningPlan.from_dict(block, f"{where}: tuning")

    @model_validator(mode="after")
    def _sizes_any_device_runs(self) -> BundleConfig:
        for key, shape in (("roi_size", self.roi_size), ("infer_volume_shape", self.infer_volume_shape)):
            if shape and math.prod(shape) > MAX_VOXELS:
                cause = ("it is derived from resample_resolution "
                         f"{self.resample_resolution} and the images' size: raise resample_resolution (coarser "
                         "spacing) and regenerate" if key == "infer_volume_shape" else "lower it")
                refuse_key(key, f"got {'x'.join(map(str, shape))} ({math.prod(shape):.3g} voxels); more than "
                                f"{MAX_VOXELS:.3g} voxels is beyond any device's memory; {cause}")
        return self

    @classmethod
    def parse(cls, view: Mapping[str, Any], where: str) -> BundleConfig:
        """The checked config of ``view`` (a family's plain view); ``where`` names the file in a refusal.

        Raises:
            ConfigError: one line naming ``where``, the key and what is allowed.
        """
        from autotune.checks import refuse_expressions, refuse_non_finite

        refuse_expressions(view, where)
        config = parse(cls, view, where, fix=_REGENERATE, context={"where": where})
        refuse_non_finite(view, where)  # in what the fields leave open (a constructor's args) too
        config._view = MappingProxyType(dict(view))
        return config

    @property
    def view(self) -> Mapping[str, Any]:
        """The plain view this config was parsed from (read-only): for the template families alone."""
        return self._view

    @property
    def plan(self) -> Any:
        """The ``tuning:`` block (``autotune.bundles.plan.TuningPlan``), None when the bundle was never tuned."""
        return self.tuning

    @cached_property
    def tuned(self) -> Any:
        """What the bundle trains and infers with (``autotune.bundles.tuned.TunedValues``).

        Raises:
            ConfigError: its loader batch is not a whole number of passes of ``num_patches_per_iter``.
        """
        from autotune.bundles.tuned import tuned_values

        return tuned_values(self)

    @property
    def validation_roi(self) -> list[int]:
        """The window validation slides (a MONAI template's ``roi_size_valid``, else the training patch)."""
        return list(self.roi_size_valid or self.roi_size)

    def with_values(self, **values: Any) -> BundleConfig:
        """This config with top-level keys of the view set to ``values``, checked again."""
        view = {**self._view, **{k: (v.as_dict() if hasattr(v, "as_dict") else v) for k, v in values.items()}}
        return BundleConfig.parse(view, str(self.bundle_root or "bundle config"))

    def as_view(self) -> dict[str, Any]:
        """The view as plain data (a probe request carries it to its child as JSON)."""
        from autotune.utils import plain_data

        view = dict(self._view)
        if view.get("tuning") is not None and self.tuning is not None:
            view["tuning"] = self.tuning.as_dict()
        return plain_data(view)
