"""Per-case checks of the image and label files, with nibabel, before any statistics are computed.

Each problem raises ``DataError`` naming the file and saying what to do. What is
accepted on purpose (real datasets have these): uint8 or float images, float
labels that hold whole numbers, shapes that vary from case to case, 4D images
whose last axis holds the channels. Each ``CaseInfo`` also records the label values
present and the orientation, so that ``autotune.data.integrity`` can check the dataset
as a whole without reading a file again (and ``autotune.data.case_cache`` can keep it for
files that have not changed).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.data.classes import DeclaredClasses, declared_classes, refuse_undeclared
from autotune.data.headers import image_shape, open_image, reason
from autotune.data.source import DataSource
from autotune.errors import DataError
from autotune.utils import bars_enabled

__all__ = ["CaseInfo", "check_cases", "check_case"]

AFFINE_ATOL = 1e-3  # mm; scanners and converters round affines differently
_LOOP_VALUES = 16  # below this label maximum, one comparison per value is faster than np.unique


@dataclass
class CaseInfo:
    """What one checked training case holds.

    Attributes:
        image: Absolute image paths (one per modality file).
        label: Absolute label path.
        shape: Spatial shape in voxels.
        spacing: Voxel size in mm, from the image header.
        channels: Image channels in all (files times channels per file).
        label_values: The label values present in the label, ascending (0 included when present).
        orientation: Axis codes of the image (nibabel ``aff2axcodes``, e.g. ``"RAS"``; ``?`` for an
            axis the affine leaves undefined).
    """

    image: list[str]
    label: str
    shape: tuple[int, int, int]
    spacing: tuple[float, float, float]
    channels: int
    label_values: tuple[int, ...] = ()
    orientation: str = ""


def check_cases(source: DataSource, progress: bool = True, known: Mapping[int, CaseInfo] | None = None
                ) -> list[CaseInfo]:
    """Check every training case of ``source`` (see ``check_case``) and that all have the same channels.

    Label values are checked against the classes the dataset declares (``labels``, or
    ``class_names`` without ``sigmoid``; see ``classes.declared_classes``).

    Args:
        source: The data source to check.
        progress: Show a tqdm bar on stderr.
        known: Cases already checked, by index in ``source.training`` (files unchanged since): their
            files are not read again; their label values are still held against the declared classes.

    Returns:
        One ``CaseInfo`` per training case, in datalist order.

    Raises:
        DataError: A file is missing, unreadable or inconsistent; the message names it.
        InputError: ``labels`` and ``class_names`` disagree.
    """
    from tqdm import tqdm

    declared = declared_classes(source)
    known = known or {}
    infos: list[CaseInfo] = []
    for index, entry in enumerate(tqdm(source.training, desc="checking cases", unit="case", file=sys.stderr,
                                       disable=not bars_enabled(progress), leave=False)):
        info = known.get(index)
        if info is None:
            info = check_case(entry, declared=declared)
        elif declared is not None:
            refuse_undeclared(info.label, info.label_values, declared)
        if infos and info.channels != infos[0].channels:
            raise DataError(f"{info.image[0]}: image has {info.channels} channel(s) but {infos[0].image[0]} has "
                            f"{infos[0].channels}; every case needs the same channels")
        infos.append(info)
    return infos


def check_case(entry: dict[str, Any], known_labels: list[int] | None = None,
               declared: DeclaredClasses | None = None) -> CaseInfo:
    """Check one ``{"image", "label"}`` case: readable, 3D, finite and not blank images, aligned, integer labels.

    Args:
        entry: A training entry with absolute paths.
        known_labels: Label values the dataset declares; a label holding another value is an error.
        declared: The same with where they are declared (wins over ``known_labels``).

    Returns:
        What the case holds.

    Raises:
        DataError: The first problem found, naming the file.
    """
    import nibabel as nib

    images = entry["image"] if isinstance(entry["image"], list) else [entry["image"]]
    label_path = entry["label"]
    first, shape, channels = _check_images(images)
    label = open_image(label_path)
    _check_label_grid(label, label_path, images[0], shape, first.affine)
    values = _check_label_values(_read(label, label_path), label_path)
    if declared is None and known_labels:
        declared = DeclaredClasses(values=tuple(sorted(known_labels)), names={},
                                   where=f"is not among the dataset's labels {sorted(known_labels)}",
                                   fix="fix the label or the labels list")
    if declared is not None:
        refuse_undeclared(label_path, values, declared)
    zooms = first.header.get_zooms()
    spacing = (float(zooms[0]), float(zooms[1]), float(zooms[2]))
    codes = nib.aff2axcodes(first.affine)
    return CaseInfo(image=list(images), label=label_path, shape=shape, spacing=spacing, channels=channels,
                    label_values=values, orientation="".join(code or "?" for code in codes))


def _check_images(images: list[str]) -> tuple[Any, tuple[int, int, int], int]:
    """Open and read a case's image files (one per modality); all must share one grid.

    Returns the first image (its header and affine describe the case), the spatial shape and the
    channels in all.
    """
    first = open_image(images[0])
    shape, channels = image_shape(first, images[0])
    _check_image_values(_read(first, images[0]), images[0])
    for path in images[1:]:
        image = open_image(path)
        other_shape, other_channels = image_shape(image, path)
        if other_shape != shape:
            raise DataError(f"{path}: image shape {other_shape} differs from {images[0]} {shape}; all modality "
                            "files of a case must share one grid")
        if not np.allclose(image.affine, first.affine, atol=AFFINE_ATOL):
            raise DataError(f"{path}: image does not align with {images[0]} (affines differ); resample it onto "
                            "one grid")
        _check_image_values(_read(image, path), path)
        channels += other_channels
    return first, shape, channels


def _check_label_grid(label: Any, label_path: str, image_path: str, shape: tuple[int, int, int],
                      affine: Any) -> None:
    """Refuse a label that is not a 3D volume on its image's grid (same shape and affine)."""
    label_shape = tuple(int(n) for n in label.shape)
    if len(label_shape) == 4 and label_shape[3] == 1:
        label_shape = label_shape[:3]
    if len(label_shape) != 3:
        raise DataError(f"{label_path}: label has shape {tuple(label.shape)}; a label must be a 3D volume of class "
                        "indices")
    if label_shape != shape:
        raise DataError(f"{label_path}: label shape {label_shape} differs from image {image_path} shape {shape}; "
                        "re-export the label on the image grid")
    if not np.allclose(label.affine, affine, atol=AFFINE_ATOL):
        difference = float(np.max(np.abs(np.asarray(label.affine) - np.asarray(affine))))
        raise DataError(f"{label_path}: the label does not align with image {image_path} (affines differ by up to "
                        f"{difference:.3g}); resample the label onto the image grid")


def _read(image: Any, path: str) -> np.ndarray:
    """Read the voxel data (which catches truncated gzip streams), without float64 conversion."""
    try:
        return np.asanyarray(image.dataobj)
    except Exception as exc:
        raise DataError(f"cannot read {path}: {reason(exc, path)}; re-export or remove it from the datalist") from exc


def _check_image_values(data: np.ndarray, path: str) -> None:
    """Refuse an image whose voxels cannot be trained on, from the array already read for the checks (no second
    read): a non-numeric or complex data type, NaN or infinite voxels (counted), or one value in every voxel.

    Raises:
        DataError: naming the case's image file and, for non-finite voxels, how many of how many.
    """
    if data.dtype.kind not in "iufb":
        raise DataError(f"{path}: image data type {data.dtype} is not real numbers; save the image as integers or "
                        "floats")
    if data.size == 0:
        raise DataError(f"{path}: image is empty; re-export it")
    if data.dtype.kind == "f":
        bad = int(data.size - np.count_nonzero(np.isfinite(data)))
        if bad:
            raise DataError(f"{path}: image holds {bad} non-finite voxel(s) (NaN or infinite) of {data.size}; fix "
                            "them (e.g. set them to the background value) or remove the case")
    low, high = data.min(), data.max()
    if low == high:
        raise DataError(f"{path}: image holds the one value {float(low):g} in every voxel (a blank export?); "
                        "re-export it or remove the case")


def _check_label_values(data: np.ndarray, path: str) -> tuple[int, ...]:
    """Refuse NaN, fractional, negative or non-numeric labels; return the values present, ascending."""
    if data.dtype.kind == "f":
        if not np.all(np.isfinite(data)):
            raise DataError(f"{path}: label holds NaN or infinite values; labels must be class indices 0, 1, 2, ...")
        fractional = data != np.round(data)
        if np.any(fractional):
            example = float(data[fractional].flat[0])
            raise DataError(f"{path}: label holds non-integer values (e.g. {example:g}); labels must be class "
                            "indices 0, 1, 2, ... (was the label resampled with linear interpolation?)")
    elif data.dtype.kind not in "iub":
        raise DataError(f"{path}: label data type {data.dtype} is not numeric; save labels as integers")
    if data.size == 0:
        raise DataError(f"{path}: label is empty; re-export it")
    low, high = float(data.min()), float(data.max())
    if low < 0:
        raise DataError(f"{path}: label holds the negative value {low:g}; labels must be class indices 0, 1, 2, ...")
    if high < _LOOP_VALUES:
        return tuple(value for value in range(int(high) + 1) if np.any(data == value))
    return tuple(int(value) for value in np.unique(data))
