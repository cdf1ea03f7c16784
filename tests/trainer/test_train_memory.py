"""The memory contract from tuning to training on the CPU: tune at L, train at L, compare the peaks."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from bundle_fixtures import copy_bundle, make_bundles

MiB = 1024**2
LIMIT = 40 * MiB  # by hand: the tiny UNet's edge falls inside [1, 8] patches per pass here


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny UNet bundle on 12 cases, tuned under LIMIT on the CPU (range given: no data cap)."""
    from autotune.data.synthetic import make_demo_dataset
    from autotune.stages import tune

    root = tmp_path_factory.mktemp("contract")
    data = make_demo_dataset(root / "data", cases=12, size=32, classes=2, seed=1)
    bundle = make_bundles(data, root / "work", algos="unet", num_fold=1)["unet_0"]
    # handoff largest: the contract is about the largest fit (the goodput rule may hand over the template's batch)
    [result] = tune([bundle], device="cpu", memory_limit=LIMIT, storage=f"sqlite:///{root}/s.db",
                            handoff="largest",
                            specs={"universal": {"range_num_images_per_batch": [1, 8],
                                                 "range_num_sw_batch_size": [1, 4]}})
    assert result["status"] == "tuned"
    return {"bundle": bundle, "result": result, "root": root}


def test_tuned_bundle_trains_under_its_limit_near_the_budget(tuned: dict, tmp_path: Path) -> None:
    from autotune.trainer.runner import train

    result = tuned["result"]
    assert 1 < result["num_patches_per_iter"] < 8  # the limit binds inside the range
    bundle = copy_bundle(tuned["bundle"], tmp_path / "unet_0")
    summary = train(bundle, device="cpu", epochs=2, val_every=1, progress=False)  # the tuned limit by default
    assert summary["memory_limit"] == LIMIT
    assert summary["epochs_run"] == 2
    peak = max(summary["train_peak_bytes"], summary["val_peak_bytes"])
    budget = result["budget_bytes"]
    assert 0.8 * budget <= peak <= budget, (peak, budget, result["peak_bytes"])
    assert summary["tuned_peak_bytes"] == result["peak_bytes"]


def test_training_below_the_tuned_peak_stops_with_exit_3_and_keeps_last_pt(
        tuned: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.cli import main

    bundle = copy_bundle(tuned["bundle"], tmp_path / "unet_0")
    assert main(["train", str(bundle), "--device", "cpu", "--epochs", "1", "--quiet"]) == 0
    last = bundle / "model_fold0" / "last.pt"
    before = hashlib.sha256(last.read_bytes()).hexdigest()
    capsys.readouterr()
    low = str(tuned["result"]["peak_bytes"] // 2)
    code = main(["train", str(bundle), "--device", "cpu", "--epochs", "2", "--resume", "--quiet", "--memory-limit", low])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3
    assert len([line for line in err if "error" in line]) == 1
    assert "out of memory in training of epoch 2" in err[-1] and "last.pt holds epoch 1" in err[-1]
    assert "autotune tune" in err[-1]
    assert hashlib.sha256(last.read_bytes()).hexdigest() == before
    import torch

    assert torch.load(last, weights_only=True)["epoch"] == 1


def test_another_limit_than_the_tuned_one_warns(tuned: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.bundles.config import load_bundle_config
    from autotune.trainer.memory import training_limit

    cfg = load_bundle_config(tuned["bundle"])
    assert training_limit(cfg, "cpu", None) == LIMIT
    capsys.readouterr()
    assert training_limit(cfg, "cpu", "1GiB") == 1024**3
    assert "tuned for 40.00 MiB" in capsys.readouterr().err
    assert training_limit(cfg, "cuda:0", None) is None
    assert "was tuned on cpu" in capsys.readouterr().err
