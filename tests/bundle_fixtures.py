"""Helpers shared by the training, inference and MONAI-interface tests: tiny bundles made
from the demo data, private copies of them, an oblique copy of an image, and a checked config with no
bundle behind it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

#: the least a bundle config holds (``autotune.bundles.model.BundleConfig``): a tiny UNet's
_LEAST_CONFIG: dict[str, object] = {
    "algo": "unet", "input_channels": 1, "output_classes": 2, "roi_size": [32, 32, 32],
    "resample_resolution": [1.0, 1.0, 1.0], "network": {"name": "UNet", "args": {
        "channels": [4, 8], "strides": [2], "num_res_units": 0}},
    "loss": {"name": "DiceCELoss", "args": {"to_onehot_y": True, "softmax": True}},
    "optimizer": {"name": "SGD", "args": {}}, "num_images_per_batch": 1, "num_crops_per_image": 1,
    "num_patches_per_iter": 1, "num_sw_batch_size": 1, "sw_input_on_cpu": False, "amp": False, "num_epochs": 1,
}


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


def least_config(**values: object) -> object:
    """A checked ``BundleConfig`` of a tiny UNet with no bundle or data behind it, with ``values`` set on top (for
    the functions that read a config and nothing else)."""
    from autotune.bundles.model import BundleConfig

    return BundleConfig.parse({**_LEAST_CONFIG, **values}, "test config")


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
