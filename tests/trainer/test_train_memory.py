"""The memory contract from tuning to training on the CPU: tune at L, train at L, compare the peaks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bundle_fixtures import copy_bundle, make_bundles

from autotune.bundles.config import load_bundle_config

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


def test_training_at_60_percent_of_the_tuned_peak_steps_down_and_ends_with_exit_0(
        tuned: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.cli import main

    bundle = copy_bundle(tuned["bundle"], tmp_path / "unet_0")
    low = str(int(0.6 * tuned["result"]["peak_bytes"]))  # the tuned batch cannot fit whole
    assert main(["train", str(bundle), "--device", "cpu", "--epochs", "1", "--quiet", "--memory-limit", low]) == 0
    err = capsys.readouterr().err
    assert "memory: out of memory in training pass of" in err
    summary = json.loads((bundle / "model_fold0" / "train_summary.json").read_text())
    assert summary["micro_batches"] > 1 and summary["best_metric"] is not None
    assert summary["memory_fallbacks"][0]["peak_bytes"] > int(low)
    training_oom = load_bundle_config(bundle).plan.training_oom
    assert training_oom.memory_limit == int(low) and training_oom.micro_batches == summary["micro_batches"]
    assert training_oom.study.recorded is False  # another limit than the key's: not a point of its study


def _fail_first_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first training pass run whole runs out of memory (as a card fuller than the probe's would)."""
    import torch

    import autotune.step as step

    train_step, calls = step.train_step, [0]

    def failing(*args: object, **kwargs: object) -> object:
        calls[0] += 1
        if calls[0] == 1:
            raise torch.OutOfMemoryError("fake: out of memory")
        return train_step(*args, **kwargs)

    monkeypatch.setattr(step, "train_step", failing)


def test_an_oom_under_the_tuned_limit_goes_to_the_study_and_the_next_run_and_tune(
        tuned: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import optuna

    from autotune.stages import tune
    from autotune.trainer.runner import train

    bundle = copy_bundle(tuned["bundle"], tmp_path / "unet_0")
    n = tuned["result"]["num_patches_per_iter"]
    with pytest.MonkeyPatch.context() as patch:
        _fail_first_pass(patch)
        summary = train(bundle, device="cpu", epochs=1, progress=False)  # under the tuned limit
    assert summary["micro_batches"] == 2 and summary["memory_limit"] == LIMIT
    record = load_bundle_config(bundle).plan.training_oom
    assert record.num_patches_per_iter == n and record.study.recorded is True
    study = optuna.load_study(study_name=tuned["result"]["study_name"], storage=f"sqlite:///{tuned['root']}/s.db")
    [point] = [t for t in study.get_trials() if t.user_attrs.get("kind") == "training"]
    assert point.number == record.study.trial and point.params == {"num_patches_per_iter": n}
    assert point.user_attrs["verdict"] == "does not fit" and point.constraints["memory"] > 0
    assert study.user_attrs["training_oom"][0]["num_patches_per_iter"] == n
    capsys.readouterr()
    again = train(bundle, device="cpu", epochs=1, progress=False)  # a fresh run starts split: no OOM paid twice
    assert again["micro_batches"] == 2 and again["memory_fallbacks"] == []
    assert "memory: starting in 2 micro-batches" in capsys.readouterr().err
    [result] = tune([bundle], device="cpu", memory_limit=LIMIT, storage=f"sqlite:///{tuned['root']}/s.db",
                    handoff="largest", specs={"universal": {"range_num_images_per_batch": [1, 8],
                                                            "range_num_sw_batch_size": [1, 4]}})
    out = capsys.readouterr()
    assert f"searched again: training ran out of memory at {n} patches per pass" in out.out + out.err
    assert result["status"] == "tuned" and result["num_patches_per_iter"] < n
    assert load_bundle_config(bundle).plan.training_oom is None  # the new answer starts unsplit


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
