"""A small synthetic dataset in all three input forms, for demos and tests.

Each case is a noisy volume with a few spheres; every foreground class gets at least
one sphere and its own intensity. Shapes vary a little from case to case (as in real
data) and the spacing is 1 mm. The same arguments always give the same files.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from autotune.data.datalist import normalise_modality
from autotune.errors import InputError
from autotune.files import atomic_write_json, atomic_write_yaml, check_creatable, make_folder
from autotune.utils import expand_path

__all__ = ["make_demo_dataset"]

SHAPE_JITTER = 4  # each axis is size - 4 .. size + 4 voxels
MIN_SIZE = 16

# background, first-class, per-class step, noise sigma
_INTENSITY = {"MRI": (100.0, 300.0, 150.0, 20.0), "CT": (-100.0, 60.0, 80.0, 15.0)}


def make_demo_dataset(out: str | Path, cases: int = 8, size: int = 48, classes: int = 2, seed: int = 0,
                      modality: str = "MRI") -> Path:
    """Write a synthetic segmentation dataset under ``out``.

    Writes ``imagesTr/case_XXX.nii.gz`` (float32) and ``labelsTr/case_XXX.nii.gz`` (uint8, values
    0..classes), a Decathlon ``dataset.json``, an Auto3DSeg ``datalist.json`` (relative paths, no
    folds) and an ``input.yaml`` pointing at it.

    Args:
        out: Folder to write into (created if needed; demo files in it are replaced).
        cases: Number of cases, at least 1.
        size: Nominal edge length in voxels, at least 16; each axis varies by up to 4 either way.
        classes: Number of foreground classes, at least 1.
        seed: Seed; the same arguments give the same files.
        modality: ``"MRI"`` or ``"CT"`` (sets the intensity range).

    Returns:
        The dataset folder, absolute.

    Raises:
        InputError: An argument is out of range or ``out`` is not a folder.
    """
    import nibabel as nib

    _check_int("cases", cases, 1)
    _check_int("size", size, MIN_SIZE)
    _check_int("classes", classes, 1)
    _check_int("seed", seed, 0)
    modality = normalise_modality(modality, "make_demo_dataset")
    out = Path(os.path.abspath(expand_path(out, InputError, "demo dataset folder", "an absolute path")))
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a folder; give a folder for the demo dataset")
    check_creatable(out, "the demo dataset folder", InputError)
    make_folder(out, "the demo dataset folder")
    (out / "imagesTr").mkdir(parents=True, exist_ok=True)
    (out / "labelsTr").mkdir(parents=True, exist_ok=True)

    training = []
    for index in range(cases):
        rng = np.random.default_rng([seed, index])
        image, label = _make_case(rng, size, classes, modality)
        name = f"case_{index:03d}.nii.gz"
        _save(nib, image, out / "imagesTr" / name)
        _save(nib, label, out / "labelsTr" / name)
        training.append({"image": f"./imagesTr/{name}", "label": f"./labelsTr/{name}"})

    _write_lists(out, training, size, classes, modality)
    return out


def _write_lists(out: Path, training: list[dict[str, str]], size: int, classes: int, modality: str) -> None:
    """Write the three ways of listing the cases: Decathlon dataset.json, Auto3DSeg datalist.json, input.yaml."""
    cases = len(training)
    class_names = [f"class{value}" for value in range(1, classes + 1)]
    atomic_write_json(out / "dataset.json", {
        "name": "demo",
        "description": f"synthetic spheres: {cases} cases, about {size}^3 voxels, {classes} foreground classes",
        "tensorImageSize": "3D",
        "modality": {"0": modality},
        "labels": {"0": "background", **{str(value): name for value, name in enumerate(class_names, start=1)}},
        "numTraining": cases,
        "numTest": 0,
        "training": training,
        "test": [],
    })
    atomic_write_json(out / "datalist.json", {
        "training": [{"image": e["image"][2:], "label": e["label"][2:]} for e in training],
        "testing": [],
    })
    atomic_write_yaml(out / "input.yaml", {
        "name": "demo",
        "modality": modality,
        "datalist": "datalist.json",
        "dataroot": ".",
        "class_names": class_names,
    })


def _make_case(rng: np.random.Generator, size: int, classes: int, modality: str) -> tuple[np.ndarray, np.ndarray]:
    shape = tuple(int(size + rng.integers(-SHAPE_JITTER, SHAPE_JITTER + 1)) for _ in range(3))
    label = np.zeros(shape, dtype=np.uint8)
    grid = np.ogrid[: shape[0], : shape[1], : shape[2]]
    rad_max = max(3, size // 6)
    rad_min = max(2, size // 10)
    num_objs = max(4, 2 * classes)
    for obj in range(num_objs):
        radius = int(rng.integers(rad_min, rad_max + 1))
        centre = [int(rng.integers(radius, edge - radius)) for edge in shape]
        inside = sum((axis - c) ** 2 for axis, c in zip(grid, centre, strict=True)) <= radius**2
        label[inside] = obj % classes + 1  # every class gets a sphere
    background, first, step, noise = _INTENSITY[modality]
    levels = np.array([background] + [first + step * c for c in range(classes)], dtype=np.float32)
    image = levels[label] + rng.normal(0.0, noise, size=shape).astype(np.float32)
    return image.astype(np.float32), label


def _save(nib: object, data: np.ndarray, path: Path) -> None:
    """Save a NIfTI with 1 mm spacing, atomically (temp name in the same folder, then rename)."""
    image = nib.Nifti1Image(data, np.eye(4))  # type: ignore[attr-defined]
    image.header.set_xyzt_units("mm")
    tmp = path.with_name(f".{path.name[: -len('.nii.gz')]}.tmp.nii.gz")
    try:
        nib.save(image, str(tmp))  # type: ignore[attr-defined]
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"{name} is {value!r}; it must be an integer of at least {minimum}")
