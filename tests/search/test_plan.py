"""Plans for a GPU you do not have: estimator-only tuning, the catalogue, and verify."""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna
import pytest
from probe_fixtures import shared_tiny_bundles

from autotune.bundles.config import load_bundle_config, update_bundle_config
from autotune.cli import main
from autotune.errors import SpecError
from autotune.search.driver.targets import CATALOGUE, resolve_target
from autotune.stages import tune, verify

MARGIN = 0.10


@pytest.fixture()
def bundle(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Path:
    src = shared_tiny_bundles(tmp_path_factory, algos=("unet",))["unet"]
    return Path(shutil.copytree(src, tmp_path / "unet_0"))


def _limit(bundle: Path, patches: float) -> int:
    from autotune.probe.estimate import fit_memory_model

    model = fit_memory_model(bundle, phase="train", device="cpu")
    return int((model.intercept + patches * model.slope) / (1 - MARGIN))


def test_cpu_plan_is_estimated_then_verified_as_measured(bundle: Path, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'plan.db'}"
    limit = _limit(bundle, 3.5)
    plan = tune([bundle], device="cpu", memory_limit=limit, storage=storage, strategy="estimate",
                        margin=MARGIN, progress=None)[0]
    assert plan["status"] == "tuned" and plan["method"] == "estimated" and plan["probes"] == 0
    trials = optuna.load_study(study_name=plan["study_name"], storage=storage).get_trials()
    assert trials and all(t.user_attrs["kind"] == "estimate" and t.user_attrs["measured"] is False for t in trials)
    cfg = load_bundle_config(bundle)
    assert cfg.plan.method == "estimated"
    report = verify(bundle, device="cpu", storage=storage, retune=False)
    assert report["holds"], report
    assert report["estimate_error"] is not None and report["estimate_error"] <= 0.05
    after = load_bundle_config(bundle)
    assert after.plan.method == "measured"
    assert after.plan.verified["measured_peak_bytes"] <= after.plan.budget_bytes
    assert after.num_patches_per_iter == plan["num_patches_per_iter"]


def test_a_wrong_plan_is_retuned(bundle: Path, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'plan.db'}"
    limit = _limit(bundle, 3.5)
    plan = tune([bundle], device="cpu", memory_limit=limit, storage=storage, strategy="estimate",
                        margin=MARGIN, progress=None)[0]
    cfg = load_bundle_config(bundle)
    # spoil the plan: two patches more than fit
    update_bundle_config(bundle, {"num_patches_per_iter": cfg.num_patches_per_iter + 2,
                                  "num_images_per_batch": cfg.num_patches_per_iter + 2})
    report = verify(bundle, device="cpu", storage=storage)
    assert not report["holds"]
    assert report["retuned"]["status"] == "tuned"
    assert load_bundle_config(bundle).num_patches_per_iter == plan["num_patches_per_iter"]
    assert load_bundle_config(bundle).plan.method == "measured"


def test_plan_for_a_catalogue_gpu_without_one(bundle: Path, tmp_path: Path) -> None:
    target = resolve_target("estimate", "a100-80gb", None, "cpu")
    assert target["memory"] == CATALOGUE["a100-80gb"][1]
    result = tune([bundle], storage=f"sqlite:///{tmp_path / 'a100.db'}", strategy="estimate", target_gpu="a100-80gb",
                          progress=None)[0]
    assert result["status"] == "tuned" and result["method"] == "estimated" and result["probes"] == 0
    tuning = load_bundle_config(bundle).plan
    assert tuning.target["catalogue"] == "a100-80gb" and tuning.device_name == "NVIDIA A100 80GB"
    assert tuning.allowances["context_bytes"] > 0 and tuning.allowances_validated_on_gpu is False
    assert tuning.budget_bytes == int(target["memory"] * 0.9) - tuning.allowances["context_bytes"]
    # 80 GB holds the tiny network's whole range: the plan is the top of the searched (capped) range,
    # and the estimate says what memory would hold past the template's whole range
    whole_top = load_bundle_config(bundle).tuning_ranges["num_patches_per_iter"][1]
    assert result["num_patches_per_iter"] == tuning.batch["searched_range"][1]
    assert tuning.batch["predicted_largest_fit"] > whole_top
    assert "memory would hold" in tuning.batch["reason"] and "not probed" in tuning.batch["reason"]


def test_target_memory_and_errors() -> None:
    target = resolve_target("estimate", None, "12GiB", "cpu")
    assert target["memory"] == 12 * 1024**3
    with pytest.raises(SpecError, match="--strategy estimate"):
        resolve_target("fast", "t4", None, "cpu")
    with pytest.raises(SpecError, match="not both"):
        resolve_target("estimate", "t4", "12GiB", "cpu")
    with pytest.raises(SpecError, match="h100-80gb"):
        resolve_target("estimate", "h100", None, "cpu")


def test_verify_untuned_bundle_exit_2(bundle: Path, capsys) -> None:
    code = main(["verify", str(bundle)])
    err = capsys.readouterr().err
    assert code == 2 and "no tuning block" in err and "Traceback" not in err
