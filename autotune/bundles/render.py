"""Fill a template's ``auto`` values from ``datastats.yaml`` into a bundle config.

The rules (all per axis, in voxels at the training spacing):
- ``resample_resolution``: the dataset's median spacing (unless the template fixes it);
- ``roi_size``: the median image size at that spacing, rounded up to the network's
  divisor and clamped to the template's ``roi.min``/``roi.max``;
- ``infer_volume_shape``: the 99.5th-percentile image size at that spacing (what the
  sliding-window probe runs over);
- intensity: CT clips to the foreground 0.5-99.5 percentiles and scales to [0, 1];
  MRI uses z-score normalisation over non-zero voxels, per channel;
- ``input_channels`` from the image channels, ``output_classes`` from the labels.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

from autotune.errors import ConfigError

__all__ = ["stat", "xyz_stat", "render_config", "deep_merge"]


def stat(datastats: Mapping[str, Any], dotted: str, source: str = "datastats.yaml") -> Any:
    """Look up ``stats_summary`` key ``a.b.c``; a missing key raises ConfigError naming it."""
    node: Any = datastats.get("stats_summary") if isinstance(datastats, Mapping) else None
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise ConfigError(
                f"{source}: key 'stats_summary#{dotted.replace('.', '#')}' is missing; re-run 'autotune analyze --force'"
            )
        node = node[part]
    return node


def xyz_stat(value: Any, key: str, source: str) -> list[float]:
    """A per-axis statistic; multi-channel stats nest one list per channel (take the first)."""
    if isinstance(value, list) and value and isinstance(value[0], list):
        value = value[0]
    if not (isinstance(value, list) and len(value) >= 3 and all(isinstance(v, (int, float)) for v in value[:3])):
        raise ConfigError(f"{source}: key 'stats_summary#{key}' must be three numbers, got {value!r}")
    return [float(v) for v in value[:3]]


def deep_merge(base: dict[str, Any], updates: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``updates`` into a copy of ``base``; nested mappings merge, other values replace."""
    merged = copy.deepcopy(base)
    for key, value in updates.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _round_roi(size: list[float], divisor: int, lo: list[int], hi: list[int]) -> list[int]:
    roi = []
    for axis, voxels in enumerate(size):
        value = int(math.ceil(voxels / divisor)) * divisor
        low = int(math.ceil(lo[axis] / divisor)) * divisor
        high = max(low, int(hi[axis]) // divisor * divisor)
        roi.append(int(min(max(value, low), high)))
    return roi


def _output_classes(labels: list[int], sigmoid: bool) -> int:
    foreground = [v for v in labels if v != 0]
    if sigmoid:
        return max(1, len(foreground))
    return int(max(labels)) + 1 if labels else 2


def _follow_overrides(cfg: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    """An overridden learning rate or batch is the new baseline, unless ``batch_scaling`` is overridden too."""
    block = cfg.get("batch_scaling")
    given = overrides.get("batch_scaling") if isinstance(overrides.get("batch_scaling"), Mapping) else {}
    if not isinstance(block, dict):
        return
    for key, ref in (("learning_rate", "reference_learning_rate"), ("num_patches_per_iter", "reference_batch")):
        if key in overrides and ref not in given:
            block[ref] = cfg[key]


def _dataset_facts(datastats: Mapping[str, Any], src: str) -> dict[str, Any]:
    """The statistics the rules read: median spacing and shape, 99.5th-percentile size in mm, channels, labels.

    Raises:
        ConfigError: one is missing or malformed (naming the key).
    """
    facts = {
        "spacing_median": xyz_stat(stat(datastats, "image_stats.spacing.median", src), "image_stats#spacing#median", src),
        "shape_median": xyz_stat(stat(datastats, "image_stats.shape.median", src), "image_stats#shape#median", src),
        "sizemm_p995": xyz_stat(stat(datastats, "image_stats.sizemm.percentile_99_5", src),
                                "image_stats#sizemm#percentile_99_5", src),
        "channels": stat(datastats, "image_stats.channels.max", src),
        "labels": stat(datastats, "label_stats.labels", src),
    }
    labels = facts["labels"]
    if not isinstance(labels, list) or not all(isinstance(v, int) for v in labels):
        raise ConfigError(f"{src}: key 'stats_summary#label_stats#labels' must be a list of integers")
    return facts


def _normalization(setting: Any, modality: str, datastats: Mapping[str, Any], src: str) -> Any:
    """The template's intensity normalisation, or for ``auto``: CT clips to the foreground's 0.5-99.5
    percentiles and scales to [0, 1], anything else is z-scored."""
    if setting != "auto":
        return setting
    if modality == "CT":
        lo = float(stat(datastats, "image_foreground_stats.intensity.percentile_00_5", src))
        hi = float(stat(datastats, "image_foreground_stats.intensity.percentile_99_5", src))
        return {"mode": "clip", "a_min": lo, "a_max": hi, "b_min": 0.0, "b_max": 1.0}
    return {"mode": "zscore"}


def _volume_shape(size_mm: list[float], resolution: list[float]) -> list[int]:
    """The voxels of ``size_mm`` at ``resolution`` (the volume the sliding window runs over)."""
    return [int(math.ceil(size_mm[i] / resolution[i])) for i in range(3)]


def _resolution(value: Any) -> list[float]:
    """An overridden ``resample_resolution``: three positive numbers (mm per voxel).

    Raises:
        ConfigError: anything else.
    """
    if not (isinstance(value, list) and len(value) == 3
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in value)):
        raise ConfigError(f"resample_resolution must be three positive numbers (mm per voxel), got {value!r}")
    return [float(v) for v in value]


def _template_parts(template: Mapping[str, Any]) -> dict[str, Any]:
    """What a bundle copies from its template as it is: network, loss, optimizer, schedule, tuning support."""
    return {
        "network": copy.deepcopy(template["network"]),
        "loss": copy.deepcopy(template["loss"]),
        "optimizer": copy.deepcopy(template["optimizer"]),
        "lr_scheduler": copy.deepcopy(template.get("lr_scheduler") or {"name": "none"}),
    }


def _tuning_support(template: Mapping[str, Any]) -> dict[str, Any]:
    """The template's tuning support: whether it tunes, the ranges, the validation devices tried."""
    return {
        "tuning_supported": bool((template.get("tuning") or {}).get("supported", False)),
        "tuning_ranges": copy.deepcopy((template.get("tuning") or {}).get("ranges", {})),
        "tuning_validation_devices": list((template.get("tuning") or {}).get("validation_devices", ["device", "cpu"])),
    }


def _set_roi(cfg: dict[str, Any], roi_rule: Mapping[str, Any], size_at_res: list[float]) -> None:
    """Fill an ``auto`` roi from the median size at the training spacing, or check a given one
    against the network's divisor.

    Raises:
        ConfigError: a given roi is not three positive integers, each a multiple of the divisor.
    """
    from autotune.bundles.network import roi_divisor

    divisor = roi_divisor(cfg)
    if cfg.get("roi_size") in (None, "auto"):
        cfg["roi_size"] = _round_roi(size_at_res, divisor, list(roi_rule["min"]), list(roi_rule["max"]))
        return
    roi = cfg["roi_size"]
    if not (isinstance(roi, list) and len(roi) == 3 and all(isinstance(v, int) and v > 0 for v in roi)):
        raise ConfigError(f"roi_size must be three positive integers, got {roi!r}")
    if any(v % divisor for v in roi):
        raise ConfigError(
            f"roi_size {roi} does not suit {cfg['network']['name']}: each size must be a multiple of {divisor}"
        )


def _fit_depth(cfg: dict[str, Any], roi_rule: Mapping[str, Any], size_at_res: list[float]) -> None:
    """With the template's ``roi.min_bottleneck`` and an ``auto`` roi: drop the network's deepest down-sampling
    while the roi it would get leaves an axis under ``min_bottleneck`` voxels at the bottleneck (nnU-Net's rule:
    a small volume gets fewer poolings, not a roi padded up to a larger multiple). The hippocampus's median
    36x50x36 voxels: UNet's four strides of 2 would pad it to a 48x64x48 roi (3 voxels deep at the bottleneck);
    three give 40x56x40 (5), and a fast epoch 1.5x as quick (BENCHMARKS.md, "A good Dice sooner")."""
    from autotune.bundles.network import network_named, roi_divisor

    least = roi_rule.get("min_bottleneck")
    if least is not None and (isinstance(least, bool) or not isinstance(least, int) or least < 1):
        raise ConfigError(f"template key 'roi.min_bottleneck' must be a positive integer (voxels), got {least!r}")
    kind = network_named(cfg["network"]["name"])
    if not least or kind.shallower is None or cfg.get("roi_size") not in (None, "auto"):
        return
    while True:
        divisor = roi_divisor(cfg)
        roi = _round_roi(size_at_res, divisor, list(roi_rule["min"]), list(roi_rule["max"]))
        if min(roi) // divisor >= int(least):
            return
        args = kind.shallower(dict(cfg["network"].get("args") or {}))
        if args is None:
            return
        cfg["network"] = {**cfg["network"], "args": args}


def render_config(
    template: Mapping[str, Any],
    datastats: Mapping[str, Any],
    data_src: Mapping[str, Any],
    fold: int,
    num_fold: int,
    overrides: Mapping[str, Any] | None = None,
    datastats_path: str = "datastats.yaml",
) -> dict[str, Any]:
    """Return the bundle config for one fold: the template's values with ``auto`` filled in.

    ``overrides`` (plain data) is merged last, before the roi is re-rounded, so a
    test or a user can shrink the network or fix the roi.

    Raises:
        ConfigError: a statistic the rules need is missing or malformed.
    """
    from autotune.bundles.scaling import batch_scaling_of

    training = dict(template["training"])
    modality = str(data_src.get("modality", "MRI")).upper()
    facts = _dataset_facts(datastats, datastats_path)
    spacing = facts["spacing_median"]
    resolution = training.get("resample_resolution", "auto")
    resolution = [round(v, 4) for v in spacing] if resolution == "auto" else [float(v) for v in resolution]
    sigmoid = bool(data_src.get("sigmoid", False))
    cfg: dict[str, Any] = {
        "algo": template["name"], "template_version": template["version"], "fold": int(fold),
        "num_fold": int(num_fold), "name": data_src.get("name", ""), "modality": modality,
        "datalist": data_src.get("datalist"), "dataroot": data_src.get("dataroot"), "datastats": datastats_path,
        "class_names": data_src.get("class_names"), "sigmoid": sigmoid, "input_channels": int(facts["channels"]),
        "output_classes": _output_classes(facts["labels"], sigmoid),
        **_template_parts(template),
        **{k: v for k, v in training.items() if k not in ("roi_size", "resample_resolution", "intensity_normalization")},
        "roi_size": training.get("roi_size"),
        "resample_resolution": resolution,
        "intensity_normalization": _normalization(training.get("intensity_normalization", "auto"), modality,
                                                  datastats, datastats_path),
        "infer_volume_shape": _volume_shape(facts["sizemm_p995"], resolution),
        **_tuning_support(template),
    }
    if template.get("batch_scaling") is not None:
        cfg["batch_scaling"] = copy.deepcopy(template["batch_scaling"])
    if overrides:
        cfg = deep_merge(cfg, overrides)
        _follow_overrides(cfg, overrides)
        if "resample_resolution" in overrides:  # the sizes measured at the template's spacing follow the new one
            resolution = _resolution(cfg["resample_resolution"])
            if "infer_volume_shape" not in overrides:
                cfg["infer_volume_shape"] = _volume_shape(facts["sizemm_p995"], resolution)
    size_at_res = [facts["shape_median"][i] * spacing[i] / resolution[i] for i in range(3)]
    if "network" not in (overrides or {}):  # a network the user gives is theirs
        _fit_depth(cfg, template["roi"], size_at_res)
    _set_roi(cfg, template["roi"], size_at_res)
    batch_scaling_of(cfg)  # a malformed block fails at generation, not at tuning
    cfg["infer_volume_shape"] = [max(int(a), int(b)) for a, b in zip(cfg["infer_volume_shape"], cfg["roi_size"], strict=True)]
    _refuse_beyond_any_device(cfg, "infer_volume_shape" in (overrides or {}))
    return cfg


def _refuse_beyond_any_device(cfg: Mapping[str, Any], volume_given: bool) -> None:
    """Refuse a validation volume no device could hold, naming the key it comes from (``resample_resolution``
    with the images' size, unless ``infer_volume_shape`` was given itself).

    Raises:
        ConfigError: one line naming the key, the volume and what to do.
    """
    from autotune.bundles.model import MAX_VOXELS

    shape = [int(v) for v in cfg["infer_volume_shape"]]
    voxels = math.prod(shape)
    if voxels <= MAX_VOXELS:
        return
    size = f"{'x'.join(map(str, shape))} ({voxels:.3g} voxels, more than the {MAX_VOXELS:.3g} any device holds)"
    if volume_given:
        raise ConfigError(f"key 'infer_volume_shape': a validation volume of {size}; give a smaller one")
    raise ConfigError(f"key 'resample_resolution': {cfg['resample_resolution']} makes the validation volume of the "
                      f"images' 99.5th-percentile size {size}; give a coarser spacing (larger values), or leave it "
                      "to the data ('auto')")
