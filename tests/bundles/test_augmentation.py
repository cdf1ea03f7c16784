"""``augmentation: nnunet``: nnU-Net's spatial and intensity set after the crop, on top of the standard flips and
jitter; any other name is refused where the value is read."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autotune.bundles.config import load_bundle_config
from autotune.errors import ConfigError


def _draws(config, case: dict, seed: int, n: int) -> list[dict]:
    from autotune.build import build_transforms

    xform = build_transforms(config, "train")
    xform.set_random_state(seed=seed)
    out = []
    for _ in range(n):
        out.extend(xform(dict(case)))  # one list of crops per case
    return out


def test_nnunet_augmentation_changes_patches_and_keeps_labels(small_demo_bundles: dict[str, Path]) -> None:
    standard = load_bundle_config(small_demo_bundles["segresnet_0"])
    nnunet = standard.model_copy(update={"augmentation": "nnunet"})
    item = json.loads(Path(standard.datalist).read_text())["training"][0]
    case = {"image": item["image"], "label": item["label"]}
    plain, augmented = _draws(standard, case, 3, 8), _draws(nnunet, case, 3, 8)
    classes = set(range(standard.output_classes))
    changed = 0
    for a, b in zip(plain, augmented, strict=True):
        assert tuple(b["image"].shape[1:]) == tuple(standard.roi_size) == tuple(b["label"].shape[1:])
        assert np.isfinite(np.asarray(b["image"])).all()
        assert set(np.unique(np.asarray(b["label"])).astype(int)) <= classes  # nearest, zero padding: no new label
        changed += not np.allclose(np.asarray(a["image"]), np.asarray(b["image"]))
    # the crop and flips draw the same numbers in both; the nnU-Net set fires in about 4 draws of 5
    assert changed >= 2, f"only {changed} of {len(plain)} patches changed by the nnU-Net set"


def test_an_unknown_augmentation_is_refused_in_one_line() -> None:
    from autotune.bundles.schema import check_config_values

    check_config_values({"augmentation": "nnunet"}, "overrides")
    with pytest.raises(ConfigError, match=r"augmentation.*heavy|heavy.*augmentation") as err:
        check_config_values({"augmentation": "heavy"}, "overrides")
    assert "\n" not in str(err.value) and "standard" in str(err.value)
