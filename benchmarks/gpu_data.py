"""The GPU check's data: the hippocampus set (carried) and its subsets; the synthetic CT set and the
bundles come from the package (``autotune.calibrate.data``, what ``autotune calibrate`` makes), named
here too for the check's sections.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from autotune.calibrate.data import copy_bundle, generate, make_ct_dataset

__all__ = ["make_ct_dataset", "make_heart_dataset", "dataset_problem", "hippocampus_subset", "generate", "copy_bundle"]


def dataset_problem(folder: Path) -> str | None:
    """One line saying what is wrong with a Decathlon folder (no dataset.json, a listed file missing),
    or None when every training image and label it lists is there."""
    index = folder / "dataset.json"
    if not index.is_file():
        return f"{folder}: no dataset.json (expected the Decathlon Task04_Hippocampus folder)"
    try:
        training = json.loads(index.read_text(encoding="utf-8")).get("training") or []
    except (OSError, ValueError, AttributeError) as exc:
        return f"{index}: not a readable Decathlon dataset.json ({exc})"
    if not training:
        return f"{index}: lists no training cases"
    for case in training:
        for key in ("image", "label"):
            path = folder / str(case.get(key, ""))
            if not path.is_file():
                return f"{index}: {key} {case.get(key)!r} is listed but {path} is missing"
    return None


def hippocampus_subset(source: Path, out: Path, cases: int) -> Path:
    """A Decathlon folder holding the first ``cases`` training cases of ``source`` (a dry run's set)."""
    index = json.loads((source / "dataset.json").read_text(encoding="utf-8"))
    shutil.rmtree(out, ignore_errors=True)
    training = index["training"][:cases]
    for case in training:
        for key in ("image", "label"):
            target = out / case[key]
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / case[key], target)
    subset = {**index, "training": training, "numTraining": len(training), "test": [], "numTest": 0}
    (out / "dataset.json").write_text(json.dumps(subset), encoding="utf-8")
    return out


def make_heart_dataset(out: Path, cases: int, in_plane: int, depths: Sequence[int], spacing: Sequence[float],
                       seed: int = 0) -> Path:
    """A Decathlon folder shaped as MSD Task02 (Heart, MRI): ``in_plane`` x ``in_plane`` x depth voxels (the
    depths cycled), one channel of float32 intensities, a binary label (an ellipsoid atrium). Made on the device
    (the GPU machine reaches no dataset); deterministic for a ``seed``."""
    import nibabel as nib
    import numpy as np

    (out / "imagesTr").mkdir(parents=True, exist_ok=True)
    (out / "labelsTr").mkdir(parents=True, exist_ok=True)
    affine = np.diag([*(float(s) for s in spacing), 1.0])
    training = []
    for index in range(cases):
        rng = np.random.default_rng([seed, index])
        shape = (int(in_plane), int(in_plane), int(depths[index % len(depths)]))
        x, y, z = (g.astype(np.float32) for g in np.ogrid[tuple(slice(0, s) for s in shape)])
        centre = [s * (0.5 + rng.uniform(-0.1, 0.1)) for s in shape]
        atrium = (((x - centre[0]) / (0.12 * shape[0])) ** 2 + ((y - centre[1]) / (0.1 * shape[1])) ** 2
                  + ((z - centre[2]) / (0.2 * shape[2])) ** 2) <= 1.0
        image = rng.normal(200.0, 30.0, shape).astype(np.float32)
        image[atrium] += 400.0
        name = f"la_{index:03d}.nii"
        nib.save(nib.Nifti1Image(image, affine), str(out / "imagesTr" / name))
        nib.save(nib.Nifti1Image(atrium.astype(np.uint8), affine), str(out / "labelsTr" / name))
        training.append({"image": f"./imagesTr/{name}", "label": f"./labelsTr/{name}"})
    (out / "dataset.json").write_text(json.dumps({
        "name": "synthetic-heart", "tensorImageSize": "3D", "modality": {"0": "MRI"},
        "labels": {"0": "background", "1": "left atrium"}, "numTraining": cases, "numTest": 0,
        "training": training, "test": [],
    }), encoding="utf-8")
    return out
