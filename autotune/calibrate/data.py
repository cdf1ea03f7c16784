"""The calibration's data: a synthetic CT set made on the spot and the full-size bundles generated for it.

The set is written as uncompressed NIfTI (a calibration spends its minutes on the GPU, not on gzip):
CT-sized cases (512 x 512 x 120 voxels at 0.8 x 0.8 x 2.5 mm by default) as a sliding window
sees an abdominal scan; the templates' training crops are their full ROI. Deterministic for a seed,
so a CPU can make the same set again and re-estimate the same points (``benchmarks/gpu_install.py``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["CT_SHAPE", "CT_SPACING", "make_ct_dataset", "generate", "copy_bundle", "shape_for_card"]

CT_SHAPE = (512, 512, 120)
CT_SPACING = (0.8, 0.8, 2.5)
_REFERENCE_CARD = 140 * 1024**3  # the card the default shape's points were chosen for (the H200's 139.8 GiB)


def shape_for_card(total_memory: int | None) -> tuple[int, int, int]:
    """The CT shape for a card: the default on a card of at least the H200's memory, else its sides shrunk by
    the cube root of the memory ratio (to multiples of 16), so the templates' ROIs, and their peaks, shrink too."""
    if not total_memory or total_memory >= _REFERENCE_CARD:
        return CT_SHAPE
    factor = (float(total_memory) / _REFERENCE_CARD) ** (1 / 3)
    return tuple(max(64, int(round(side * factor / 16)) * 16) for side in CT_SHAPE)  # type: ignore[return-value]


def make_ct_dataset(out: Path, cases: int, shape: Sequence[int], spacing: Sequence[float], seed: int = 0) -> Path:
    """A CT-like Decathlon folder: int16 HU volumes (air, a body ellipse, two organs), uint8 labels 0-2.

    Deterministic for a given ``seed``."""
    import nibabel as nib
    import numpy as np

    shape = tuple(int(s) for s in shape)
    (out / "imagesTr").mkdir(parents=True, exist_ok=True)
    (out / "labelsTr").mkdir(parents=True, exist_ok=True)
    affine = np.diag([*(float(s) for s in spacing), 1.0])
    training = []
    x, y, z = (g.astype(np.float32) for g in np.ogrid[tuple(slice(0, s) for s in shape)])
    cx, cy = shape[0] / 2, shape[1] / 2
    body = ((x - cx) / (0.42 * shape[0])) ** 2 + ((y - cy) / (0.32 * shape[1])) ** 2 <= 1.0
    for index in range(cases):
        rng = np.random.default_rng([seed, index])
        image = np.full(shape, -1000, dtype=np.int16)
        image[np.broadcast_to(body, shape)] = 40
        label = np.zeros(shape, dtype=np.uint8)
        for value, hu in ((1, 120), (2, 250)):
            centre = [c * (0.5 + rng.uniform(-0.15, 0.15)) * 2 for c in (cx, cy, shape[2] / 2)]
            radius = [0.1 * shape[0], 0.1 * shape[1], 0.25 * shape[2]]
            organ = sum(((g - c) / r) ** 2 for g, c, r in zip((x, y, z), centre, radius, strict=True)) <= 1.0
            label[organ] = value
            image[organ] = hu
        image = (image + rng.normal(0, 15, shape).astype(np.float32)).astype(np.int16)
        name = f"ct_{index:03d}.nii"
        nib.save(nib.Nifti1Image(image, affine), str(out / "imagesTr" / name))
        nib.save(nib.Nifti1Image(label, affine), str(out / "labelsTr" / name))
        training.append({"image": f"./imagesTr/{name}", "label": f"./labelsTr/{name}"})
    (out / "dataset.json").write_text(json.dumps({
        "name": "synthetic-ct", "tensorImageSize": "3D", "modality": {"0": "CT"},
        "labels": {"0": "background", "1": "organ1", "2": "organ2"},
        "numTraining": cases, "numTest": 0, "training": training, "test": [],
    }), encoding="utf-8")
    return out


def generate(work: Path, source: Path, algos: Sequence[str], tiny: bool) -> dict[str, Path]:
    """Analyse ``source`` into ``work`` and generate one fold of bundles; returns algo -> bundle folder.

    ``tiny`` applies the tiny preset (dry runs); otherwise the full-size templates."""
    from autotune.bundles.templates import load_overrides
    from autotune.data import analyze
    from autotune.facade.bundlegen import BundleGen

    res = analyze(str(source), str(work), num_fold=1, progress=False)
    gen = BundleGen(str(work), algos=list(algos), data_stats_filename=res.datastats, data_src_cfg_name=res.data_src)
    kwargs: dict[str, Any] = {"overrides": load_overrides("tiny")} if tiny else {}
    gen.generate(str(work), num_fold=1, **kwargs)
    return {algo: work / f"{algo}_0" for algo in algos}


def copy_bundle(bundle: Path, name: str) -> Path:
    """A copy of ``bundle`` beside it named ``name`` (its own tuning and model folder), replacing an old one."""
    target = bundle.parent / name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(bundle, target, ignore=shutil.ignore_patterns("model_fold*"))  # bundle_root follows the folder
    return target
