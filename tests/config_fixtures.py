"""A small bundle config, checked as a loaded one is (``autotune.bundles.model.BundleConfig``), for the tests of
functions that read a few of its fields and need no bundle folder."""

from __future__ import annotations

from typing import Any

#: the keys every bundle config holds, at tiny values (a 32^3 UNet, one patch per step)
TINY_VIEW: dict[str, Any] = {
    "algo": "unet", "input_channels": 1, "output_classes": 2,
    "network": {"name": "UNet", "args": {"channels": [8, 16], "strides": [2]}},
    "loss": {"name": "DiceCELoss", "args": {}}, "optimizer": {"name": "AdamW", "args": {"lr": 0.001}},
    "roi_size": [32, 32, 32], "resample_resolution": [1.0, 1.0, 1.0],
    "num_images_per_batch": 1, "num_crops_per_image": 1, "num_patches_per_iter": 1, "num_sw_batch_size": 1,
    "sw_input_on_cpu": False, "amp": False, "num_epochs": 1,
}


def bundle_config(**keys: Any) -> Any:
    """``TINY_VIEW`` with ``keys`` set, checked into a ``BundleConfig``."""
    from autotune.bundles.model import BundleConfig

    return BundleConfig.parse({**TINY_VIEW, **keys}, "test bundle config")
