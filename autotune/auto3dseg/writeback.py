"""Write tuned values into a MONAI bundle's own keys, and its provenance beside them.

``update_bundle`` takes the plain keys autotune's write-back and ``verify`` produce
(``num_patches_per_iter``, ``num_images_per_batch``, ``num_crops_per_image``, ``num_sw_batch_size``,
``sw_input_on_cpu``, ``learning_rate``, ``tuning``) and writes them where the template reads them:

- DiNTS: ``training#num_patches_per_iter``, ``training#num_images_per_batch``,
  ``training#num_crops_per_image``, ``training#num_sw_batch_size``, ``training#sw_input_on_cpu``, and
  ``training#learning_rate`` where it changed; ``training#auto_scale_allowed: false`` so that
  ``train.py``'s ``pre_operation`` does not overwrite them from its memory formula.
- SwinUNETR (``autotune.auto3dseg.swinunetr``): the same keys at the top level, ``num_sw_batch_size`` as a
  plain value in place of the template's ``$@num_patches_per_iter``, and ``auto_scale_allowed: false``.
- SegResNet: the step batch as the template's own auto-scaling lays it out (crop mode ``ratio``:
  ``num_crops_per_image`` crops of one image, ``batch_size: 1``; else ``batch_size`` images of one crop),
  a ``sliding_inferrer`` (``SlidingWindowInfererAdapt``, the tuned ``sw_batch_size``, stitched on the
  CPU when validation was tuned there), ``learning_rate`` where it changed, and ``auto_scale_allowed:
  false`` so that ``auto_adjust_network_settings`` (batch from GPU GiB / 16) and ``train()`` leave them.
- SegResNet2D: SegResNet's keys, the inferrer as ``Segmenter2D`` makes it (overlap per axis, no cached
  weight map).

Only plain values are written; MONAI's ``$``/``@`` expressions stay as they are (the file is read with
``yaml.safe_load`` and written back in MONAI's own layout, atomically). The ``tuning:`` record goes to
``<bundle>/autotune/tuning.yaml``: MONAI's ``train.py`` reads every file in ``configs/``, not this one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from autotune.auto3dseg.recognise import identify, monai_bundle_root
from autotune.auto3dseg.view import TUNING_RELPATH, load_view
from autotune.errors import ConfigError
from autotune.files import atomic_write_yaml
from autotune.utils import read_yaml

__all__ = ["update_bundle", "template_updates", "HYPER_PARAMETERS"]

HYPER_PARAMETERS = Path("configs") / "hyper_parameters.yaml"


def _set(data: dict[str, Any], dotted: str, value: Any, where: Path) -> None:
    """Set ``a#b#c`` in nested mappings; a missing or non-mapping parent is an error naming the key."""
    *parents, leaf = dotted.split("#")
    node = data
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: key {dotted!r} has no mapping {part!r} to write into; regenerate the bundle")
    node[leaf] = value


def _segmenter_updates(view: Mapping[str, Any], updates: Mapping[str, Any], raw: Mapping[str, Any], overlap: Any,
                       cache_weights: bool) -> dict[str, Any]:
    """SegResNet's Segmenter (and Segmenter2D): the step batch laid out as ``train()`` lays out its own, and the
    sliding inferrer it makes with ``overlap`` (per axis for the 2D one) and ``cache_weights``."""
    out: dict[str, Any] = {}
    if "num_images_per_batch" in updates or "num_patches_per_iter" in updates:
        crops = int(updates.get("num_crops_per_image", view["num_crops_per_image"]))
        images = int(updates.get("num_images_per_batch") or updates["num_patches_per_iter"])
        patches = images * crops  # one optimizer step per loader batch
        ratio = str(raw.get("crop_mode", "ratio")) == "ratio"
        out.update(num_crops_per_image=patches if ratio else 1, batch_size=1 if ratio else patches,
                   auto_scale_allowed=False)
        if raw.get("num_steps_per_image") not in (None, 1):
            out["num_steps_per_image"] = 1
    if "num_sw_batch_size" in updates or "sw_input_on_cpu" in updates:
        inferrer: dict[str, Any] = {
            "_target_": "SlidingWindowInfererAdapt", "roi_size": list(view["roi_size_valid"]),
            "sw_batch_size": int(updates.get("num_sw_batch_size", view["num_sw_batch_size"])),
            "overlap": overlap, "mode": "gaussian", "cache_roi_weight_map": cache_weights, "progress": False,
        }
        if updates.get("sw_input_on_cpu", view["sw_input_on_cpu"]):
            inferrer["device"] = "cpu"
        out["sliding_inferrer"] = inferrer
    if "learning_rate" in updates and float(updates["learning_rate"]) != float(view["learning_rate"]):
        out["learning_rate"] = float(updates["learning_rate"])
    return out


def _train_py_updates(view: Mapping[str, Any], updates: Mapping[str, Any], prefix: str, tie_sw: bool) -> dict[str, Any]:
    """DiNTS's and SwinUNETR's ``train.py``: its loader and pass keys as they are, under ``prefix``; ``tie_sw``: the
    template ties ``num_sw_batch_size`` to ``num_patches_per_iter`` by expression, so it is written with the batch."""
    out: dict[str, Any] = {}
    for key in ("num_patches_per_iter", "num_images_per_batch", "num_crops_per_image"):
        if key in updates:
            out[prefix + key] = int(updates[key])
    if "num_sw_batch_size" in updates or (tie_sw and out):
        out[prefix + "num_sw_batch_size"] = int(updates.get("num_sw_batch_size", view["num_sw_batch_size"]))
    if "sw_input_on_cpu" in updates:
        out[prefix + "sw_input_on_cpu"] = bool(updates["sw_input_on_cpu"])
    if "learning_rate" in updates and float(updates["learning_rate"]) != float(view["learning_rate"]):
        out[prefix + "learning_rate"] = float(updates["learning_rate"])
    if out:
        out[prefix + "auto_scale_allowed"] = False
    return out


Updater = Callable[[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]], dict[str, Any]]
#: template -> its ``hyper_parameters.yaml`` keys (``a#b``) for autotune's updates
_UPDATERS: dict[str, Updater] = {
    "segresnet": lambda view, updates, raw: _segmenter_updates(view, updates, raw, float(view["sw_overlap"]), True),
    "segresnet2d": lambda view, updates, raw: _segmenter_updates(  # Segmenter2D's: overlap per axis, no cache
        view, updates, raw, [float(v) for v in view["sw_overlap_axes"]], False),
    "dints": lambda view, updates, raw: _train_py_updates(view, updates, "training#", tie_sw=False),
    "swinunetr": lambda view, updates, raw: _train_py_updates(view, updates, "", tie_sw=True),
}


def template_updates(view: Mapping[str, Any], updates: Mapping[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    """``hyper_parameters.yaml`` key (``a#b``) -> plain value for autotune's ``updates`` of this template.

    Warm-up keys (``lr_warmup_*``) have no key in MONAI's templates; they stay in the ``tuning:`` record.
    """
    updater = _UPDATERS.get(view["monai_template"])
    if updater is None:
        raise ConfigError(f"{view['bundle_root']}: autotune does not tune MONAI's {view['monai_template']} template")
    return updater(view, updates, raw)


def update_bundle(bundle: str | os.PathLike[str], updates: Mapping[str, Any]) -> dict[str, Any]:
    """Write ``updates`` into a MONAI bundle (see the module docstring); returns its view read back through
    MONAI's ``ConfigParser``.

    Raises:
        ConfigError: not a known MONAI bundle, or a key to write has no place in its config.
    """
    root = monai_bundle_root(bundle)
    if root is None:
        raise ConfigError(f"{bundle}: not a bundle generated by MONAI's BundleGen")
    identify(root)
    view = load_view(root)
    path = root / HYPER_PARAMETERS
    raw = read_yaml(path, ConfigError)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    edits = template_updates(view, {k: v for k, v in updates.items() if k != "tuning"}, raw)
    if edits:
        for key, value in edits.items():
            _set(raw, key, value, path)
        atomic_write_yaml(path, raw)
    if "tuning" in updates:
        atomic_write_yaml(root / TUNING_RELPATH, dict(updates["tuning"]))
    return load_view(root)
