"""A bundle held against what it is given, before any compute: the images' channels and spatial dimensions
against the bundle's ``input_channels`` and ``roi_size``, the label values against its ``output_classes``.

A bundle is made for data of one shape: ``input_channels`` image channels, 3D volumes, labels
``0..output_classes-1`` (with ``sigmoid``: one channel per class, values 0 and 1). Given other data
(another dataset's datalist, a hand-edited config, a 2-channel image at ``infer``), the network
would fail deep inside a convolution or a one-hot encoding. Here each mismatch is one
``DataError`` line naming the file, the bundle key and both values:

- ``check_images_fit``: ``autotune infer``'s images (headers only);
- ``check_cases_fit``: ``autotune train``'s cases: images and labels (headers), and each label's
  values, taken from the analysis's per-case record (``datastats_cache.json``, by the digest of the
  files: one ``stat`` per unchanged file) or read from the label where the record has none;
- ``check_bundle_data``: at ``probe``, ``estimate`` and ``tune`` (which run no real data): the
  images of the bundle's datalist that are on this machine (headers) and the label values its
  ``datastats.yaml`` found.

Every file is opened through ``autotune.data.headers.open_image``, so a header's size is held
against what its file can yield here too.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.data.headers import open_image
from autotune.errors import DataError

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

__all__ = ["check_images_fit", "check_cases_fit", "check_bundle_data", "allowed_labels"]


@dataclass(frozen=True)
class _Made:
    """What a bundle is made for (its config's ``input_channels``, ``output_classes``, ``sigmoid`` and
    ``roi_size``), and ``where`` that config is, for messages."""

    channels: int
    classes: int
    sigmoid: bool
    roi: tuple[int, ...]
    where: str

    @classmethod
    def of(cls, config: BundleConfig, config_path: str | os.PathLike[str] | None) -> _Made:
        if config_path is not None:
            where = str(config_path)
        else:
            where = f"{config.bundle_root}'s config" if config.bundle_root else "the bundle config"
        return cls(config.input_channels, config.output_classes, config.sigmoid, tuple(config.roi_size), where)


def _files(item: Any) -> list[str]:
    return [str(p) for p in item] if isinstance(item, (list, tuple)) else [str(item)]


def _image_facts(files: Sequence[str], made: _Made) -> tuple[tuple[int, ...], int]:
    """(spatial shape, channels in all) of one case's image files, each a 3D volume or 4D with channels last.

    Raises:
        DataError: a file with another number of axes (the bundle's ``roi_size`` named).
    """
    roi = list(made.roi)
    shape: tuple[int, ...] = ()
    channels = 0
    for path in files:
        full = tuple(int(n) for n in open_image(path).shape)
        spatial = full[:3] if len(full) in (3, 4) else full
        if len(full) not in (3, 4):
            raise DataError(f"{path}: the image has {len(full)} axes (shape {'x'.join(map(str, full))}) but the "
                            f"bundle is {len(roi) or 3}D (roi_size {roi} in {made.where}); give 3D volumes (or 4D "
                            "with the channels last)")
        shape = shape or spatial
        channels += full[3] if len(full) == 4 else 1
    return shape, channels


def _refuse_channels(path: str, channels: int, made: _Made) -> None:
    expected = made.channels
    if channels != expected:
        raise DataError(f"{path}: the image has {channels} channel(s) but the bundle's input_channels is {expected} "
                        f"({made.where}); give images of {expected} channel(s), or a bundle generated from data like "
                        "these ('autotune generate')")


def check_images_fit(config: BundleConfig, items: Iterable[Any],
                     config_path: str | os.PathLike[str] | None = None) -> None:
    """Refuse images a bundle cannot take: not 3D (or 4D with the channels last), or with other channels than its
    ``input_channels``. ``items``: one path, or a list of one file per modality, per image.

    Raises:
        DataError: the first image at fault, with the bundle key and both values.
    """
    _check_images(items, _Made.of(config, config_path))


def _check_images(items: Iterable[Any], made: _Made) -> None:
    for item in items:
        files = _files(item)
        _shape, channels = _image_facts(files, made)
        _refuse_channels(files[0], channels, made)


def allowed_labels(config: BundleConfig) -> tuple[int, str]:
    """The largest label value a bundle takes, and the words that say why."""
    return _allowed_labels(config.output_classes, config.sigmoid)


def _allowed_labels(classes: int, sigmoid: bool) -> tuple[int, str]:
    if sigmoid:  # overlapping regions: class k is label value k (or a channel of its own)
        return classes, f"output_classes is {classes} (sigmoid: label values 0-{classes})"
    return classes - 1, f"output_classes is {classes} (label values 0-{classes - 1})"


def _refuse_labels(path: str, values: Iterable[int], made: _Made) -> None:
    highest, why = _allowed_labels(made.classes, made.sigmoid)
    beyond = sorted(int(v) for v in values if int(v) > highest or int(v) < 0)
    if beyond:
        raise DataError(f"{path}: the label holds the value {beyond[0]} but the bundle's {why} ({made.where}); give "
                        "labels of this bundle's classes, or a bundle generated from data like these "
                        "('autotune generate')")


def check_cases_fit(config: BundleConfig, cases: Sequence[Mapping[str, Any]],
                    config_path: str | os.PathLike[str] | None = None) -> None:
    """Refuse training cases a bundle cannot take: images as ``check_images_fit``, a label that is not a volume on
    its image's grid, or a label value beyond the bundle's classes.

    Raises:
        DataError: the first file at fault, with the bundle key and both values.
    """
    made = _Made.of(config, config_path)
    values = _label_values(config.datastats, cases)
    for case, found in zip(cases, values, strict=True):
        files = _files(case["image"])
        shape, channels = _image_facts(files, made)
        _refuse_channels(files[0], channels, made)
        label = str(case["label"])
        label_shape = tuple(int(n) for n in open_image(label).shape)
        if len(label_shape) not in (3, 4) or label_shape[:3] != shape:
            raise DataError(f"{label}: the label's shape {'x'.join(map(str, label_shape))} is not its image's "
                            f"{'x'.join(map(str, shape))} ({files[0]}); re-export the label on the image grid")
        _refuse_labels(label, found if found is not None else _read_label_values(label), made)


def _label_values(stats: str | None, cases: Sequence[Mapping[str, Any]]) -> list[tuple[int, ...] | None]:
    """Each case's label values as the analysis (its ``datastats.yaml`` at ``stats``) recorded them for files
    unchanged since (None where it has no record: the label is read)."""
    from autotune.data.analyze import cache_settings
    from autotune.data.case_cache import CASE_CACHE, CaseCache

    if not stats:
        return [None] * len(cases)
    cache = CaseCache.load(Path(str(stats)).parent / CASE_CACHE, cache_settings())
    found: list[tuple[int, ...] | None] = []
    for case in cases:
        entry = {"image": case["image"], "label": case["label"]}
        info = cache.info(cache.recorded_key(entry), entry)
        found.append(info.label_values if info is not None else None)
    return found


def _read_label_values(path: str) -> tuple[int, ...]:
    import numpy as np

    from autotune.data.headers import reason

    image = open_image(path)
    try:
        data = np.asanyarray(image.dataobj)
    except Exception as exc:  # noqa: BLE001 - nibabel raises many types for a bad file
        raise DataError(f"cannot read {path}: {reason(exc, path)}; re-export it") from exc
    if data.dtype.kind == "f":
        data = data[np.isfinite(data)]
    return tuple(int(v) for v in np.unique(data))


def check_bundle_data(config: BundleConfig, config_path: str | os.PathLike[str] | None = None) -> None:
    """For the stages that run no real data (``probe``, ``estimate``, ``tune``): the images of the bundle's
    datalist found on this machine (headers; a bundle tuned away from its data is not refused), and the label
    values its ``datastats.yaml`` records, against the bundle. Remembered per file state within a process.

    Raises:
        DataError: a mismatch (the file, the bundle key and both values).
    """
    _checked_data(_stamp(config.datalist or ""), _stamp(config.datastats or ""), config.dataroot or "",
                  _Made.of(config, config_path))


def _stamp(path: str) -> tuple[str, int, int]:
    try:
        stat = os.stat(path)
    except OSError:
        return path, -1, -1
    return path, stat.st_size, stat.st_mtime_ns


@functools.lru_cache(maxsize=64)
def _checked_data(datalist: tuple[str, int, int], stats: tuple[str, int, int], dataroot: str, made: _Made) -> None:
    from autotune.errors import AutotuneError
    from autotune.utils import read_json, read_yaml

    if datalist[1] >= 0:
        try:
            listed = read_json(datalist[0], DataError)
        except AutotuneError:
            listed = None  # training names what is wrong with it; a probe runs without it
        cases = listed.get("training") if isinstance(listed, dict) else None
        root = Path(dataroot or Path(datalist[0]).parent)
        for case in cases if isinstance(cases, list) else []:
            image = case.get("image") if isinstance(case, dict) else None
            files = [str(root / f) if not os.path.isabs(str(f)) else str(f) for f in _files(image)] if image else []
            if files and all(os.path.isfile(f) for f in files):
                _check_images([files], made)
    if stats[1] >= 0:
        try:
            data = read_yaml(stats[0], DataError)
            labels = data["stats_summary"]["label_stats"]["labels"]
        except (AutotuneError, KeyError, TypeError):
            return
        if isinstance(labels, list) and all(isinstance(v, int) for v in labels):
            _refuse_labels(f"{stats[0]} (label_stats)", labels, made)
