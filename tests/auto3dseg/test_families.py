"""The template families (``autotune.families``): a bundle's family reads, writes and names how it trains, for
autotune's own bundles and MONAI's alike; nothing else tells them apart."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.errors import ConfigError
from autotune.tunables import TUNABLES, bundle_values


def _holds(raw: Any, dotted: str) -> bool:
    node = raw
    for part in dotted.split("#"):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_each_bundle_has_one_family_and_its_view_names_it(bundles: dict[str, Path], demo_bundles: dict) -> None:
    from autotune.bundles.config import load_bundle_config
    from autotune.families import family_for, family_of
    from autotune.families.monai import MonaiTemplates
    from autotune.families.own import OwnTemplates

    own = next(iter(demo_bundles.values()))
    assert isinstance(family_of(own), OwnTemplates) and isinstance(family_for(load_bundle_config(own)), OwnTemplates)
    assert family_of(own).calibrated_as(load_bundle_config(own)) == load_bundle_config(own).algo
    for root in bundles.values():
        view = load_bundle_config(root)
        assert isinstance(family_of(root), MonaiTemplates) and isinstance(family_for(view), MonaiTemplates)
        assert family_for(view).calibrated_as(view) is None  # no calibration covers MONAI's templates
    assert set(family_of(own).tunable_keys(load_bundle_config(own))) == {t.name for t in TUNABLES}


@pytest.mark.parametrize("template", ["segresnet", "dints"])
def test_tuned_values_go_to_the_keys_of_the_key_table_and_read_back(bundles: dict[str, Path], template: str) -> None:
    from autotune.bundles.config import load_bundle_config, update_bundle_config
    from autotune.families import family_of

    root = bundles[template]
    family = family_of(root)
    keys = family.tunable_keys(load_bundle_config(root))
    assert set(keys) == {t.name for t in TUNABLES}
    record = {"num_patches_per_iter": 3, "num_sw_batch_size": 5, "sw_input_on_cpu": True}
    view = update_bundle_config(root, {"num_patches_per_iter": 3, "num_images_per_batch": 3, "num_crops_per_image": 1,
                                       "num_sw_batch_size": 5, "sw_input_on_cpu": True})
    assert bundle_values(view) == {"num_patches_per_iter": 3, "num_sw_batch_size": 5, "validation_device": "cpu"}
    assert record["num_patches_per_iter"] == view.num_patches_per_iter
    raw = yaml.safe_load((root / "configs" / "hyper_parameters.yaml").read_text())
    for name, where in keys.items():
        assert any(_holds(raw, key) for key in where), (template, name, where)


def test_training_asks_the_family_and_refuses_a_bundle_trained_by_its_own_script(bundles: dict[str, Path],
                                                                                 demo_bundles: dict) -> None:
    from autotune.families import family_of
    from autotune.trainer.runner import train

    root = bundles["segresnet"]
    command = family_of(root).training_command(root, "8GiB")
    assert command[:4] == [sys.executable, "-m", "autotune.launch", "--memory-limit=8GiB"]
    assert command[4:6] == ["--", str(root.resolve() / "scripts" / "train.py")]
    with pytest.raises(ConfigError) as info:
        train(root, device="cpu", epochs=1)
    assert "\n" not in str(info.value) and "-m autotune.launch -- " in str(info.value)
    own = next(iter(demo_bundles.values()))
    assert family_of(own).training_command(own)[1:4] == ["-m", "autotune", "train"]
