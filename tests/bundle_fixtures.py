"""Helpers shared by the training, inference and MONAI-interface tests: tiny bundles made
from the demo data, private copies of them, and an oblique copy of an image."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np


def make_bundles(data: Path, work: Path, algos: str = "segresnet", num_fold: int = 2,
                 overrides: dict | None = None) -> dict[str, Path]:
    """Analyse ``data`` and generate tiny-preset bundles (with ``overrides`` on top of the preset's
    top-level keys); returns {identifier: folder}."""
    from autotune.bundles.templates import load_overrides
    from autotune.data.analyze import analyze
    from autotune.facade.bundlegen import BundleGen

    result = analyze(data, work, num_fold=num_fold, progress=False)
    gen = BundleGen(work, algos=algos, data_stats_filename=result.datastats, data_src_cfg_name=result.data_src)
    bundles = gen.generate(work, num_fold=num_fold, overrides={**load_overrides("tiny"), **(overrides or {})})
    return {b["identifier"]: Path(b["path"]) for b in bundles}


def copy_bundle(source: Path, dest: Path, **updates: object) -> Path:
    """A private copy of a bundle (its datalist stays shared), with config ``updates``."""
    from autotune.bundles.config import update_bundle_config

    bundle = Path(shutil.copytree(source, dest))
    if updates:
        update_bundle_config(bundle, updates)
    return bundle


def oblique_copy(source: Path, dest: Path) -> Path:
    """The same voxels with an anisotropic, flipped, shifted affine: resampling and orientation must be undone."""
    import nibabel as nib

    image = nib.load(source)
    affine = np.diag([-1.4, 0.8, 1.25, 1.0])
    affine[:3, 3] = [30.0, -12.0, 5.5]
    nib.save(nib.Nifti1Image(np.asarray(image.dataobj), affine), dest)
    return dest
