"""The ``tuning:`` block as one typed class: written and read through ``TuningPlan``, checked on load."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from probe_fixtures import shared_tiny_bundles

from autotune.bundles.config import load_bundle, update_bundle_config
from autotune.bundles.plan import PLAN_VERSION, TuningPlan, plan_of
from autotune.errors import ConfigError

RECORD = {
    "algo": "unet", "objective": "max-batch", "method": "measured", "probes": 3, "reused_points": 0,
    "trials": [0, 1], "infer_trials": [0], "estimator_passes": {"train": 1, "infer": 0},
    "edge_check": {"train": {"how": "probed"}}, "status": "tuned", "num_patches_per_iter": 2,
    "max_num_patches_per_iter": 9, "num_sw_batch_size": 27, "validation_device": "device",
    "sw_input_on_cpu": False, "train_trial": 1, "infer_trial": 0, "train_peak_bytes": 16_000_000,
    "peak_bytes": 51_000_000, "infer_peak_bytes": 51_000_000, "samples_per_s": 0.27,
    "sw_seconds_per_volume": 3.9, "handoff": {"rule": "goodput", "handed": 2, "largest_fit_trial": 0},
    "batch": {"searched_range": [1, 14]}, "study_name": "s", "infer_study_name": "s-infer",
    "storage": "sqlite:///x.db", "strategy": "fast", "memory_limit": 67_108_864, "margin": 0.1,
    "budget_bytes": 60_397_977, "device": "cpu", "device_name": "cpu", "device_total_memory": 25_000_000_000,
    "precision": "fp32", "wall_seconds": 68.5, "date": "2026-11-26T03:30:09+00:00", "key": {"algo": "unet"},
    "from_storage": False,
}


def test_a_record_round_trips_through_the_plan() -> None:
    plan = TuningPlan.from_record(RECORD, {"lr_scaling": "linear"})
    block = plan.as_dict()
    assert block["version"] == PLAN_VERSION and next(iter(block)) == "version"
    assert "from_storage" not in block and block["recipe"] == {"lr_scaling": "linear"}
    assert TuningPlan.from_dict(yaml.safe_load(yaml.safe_dump(block)), "tuning") == plan
    assert plan.largest_fit == 9 and plan.searched_top == 14 and plan.handoff_rule == "goodput"
    assert plan.tuned_on("cpu") and not plan.tuned_on("cuda:0")


def test_a_block_written_before_the_version_field_loads() -> None:
    old = {k: v for k, v in RECORD.items() if k != "from_storage"}
    plan = TuningPlan.from_dict(old, "tuning")
    assert plan.version == 1 and plan.num_patches_per_iter == 2


@pytest.mark.parametrize(("change", "message"), [
    ({"version": PLAN_VERSION + 1}, "newer autotune"),
    ({"num_patches_per_iter": 0}, "tuning.num_patches_per_iter: must be a positive integer"),
    ({"memory_limit": "64MiB"}, "tuning.memory_limit: must be a positive integer"),
    ({"method": "guessed"}, "tuning.method: must be measured or estimated"),
    ({"sw_input_on_cpu": "no"}, "tuning.sw_input_on_cpu: must be true or false"),
    ({"handoff": [1]}, "tuning.handoff: must be a mapping"),
    ({"num_patchs_per_iter": 2}, "num_patches_per_iter"),
])
def test_a_bad_block_is_named(change: dict, message: str) -> None:
    block = {k: v for k, v in RECORD.items() if k != "from_storage"} | change
    with pytest.raises(ConfigError, match=message):
        TuningPlan.from_dict(block, "tuning")


def test_a_missing_key_is_named() -> None:
    block = {k: v for k, v in RECORD.items() if k not in ("from_storage", "memory_limit")}
    with pytest.raises(ConfigError, match="key 'memory_limit' is missing"):
        TuningPlan.from_dict(block, "tuning")


def test_a_bundle_with_a_bad_block_is_refused_when_loaded(tmp_path: Path,
                                                         tmp_path_factory: pytest.TempPathFactory) -> None:
    """The block is checked when the bundle is loaded: one line naming the file and the key."""
    import shutil

    bundle = tmp_path / "unet_0"
    shutil.copytree(shared_tiny_bundles(tmp_path_factory, algos=("unet",))["unet"], bundle)
    assert load_bundle(bundle).plan is None
    update_bundle_config(bundle, {"tuning": TuningPlan.from_record(RECORD).as_dict()})
    loaded = load_bundle(bundle)
    assert loaded.plan is not None and loaded.plan.num_sw_batch_size == 27
    assert plan_of(loaded.config) == loaded.plan
    path = bundle / "configs" / "hyper_parameters.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["tuning"]["num_sw_batch_size"] = -1
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match=r"hyper_parameters.yaml: tuning.num_sw_batch_size: must be a positive"):
        load_bundle(bundle)
