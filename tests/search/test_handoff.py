"""The goodput hand-off wired into the tuner: real probes on a tiny UNet whose largest fit (3) is
above the template's batch (2); the verdict in the tuning block, and ``--handoff largest``."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
from bundle_fixtures import copy_bundle
from probe_fixtures import limit_for_patches

import autotune.search.handoff as goodput
from autotune.bundles.config import load_bundle_config
from autotune.bundles.scaling import scaled_learning_rate
from autotune.cli import main
from autotune.stages import tune, verify

MARGIN = 0.10
RANGE = ["1", "64"]  # explicit: the demo set's training-set cap (2) would stop the search at the reference batch


@pytest.fixture(scope="module")
def setup(demo_bundles_one_fold: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("handoff")
    bundle = copy_bundle(demo_bundles_one_fold["unet_0"], root / "work" / "unet_0")
    limit = limit_for_patches(bundle, 3.5, MARGIN)  # at most 3 patches fit; the template's batch is 2
    return {"bundle": bundle, "limit": limit, "storage": f"sqlite:///{root / 'studies.db'}", "root": root}


def test_goodput_hands_over_the_reference_batch_with_the_tuned_sw_batch(
        setup: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = copy_bundle(setup["bundle"], tmp_path / "unet_0")
    monkeypatch.setattr(goodput, "DEFAULT_NOISE", 1e6)  # no measured speed-up passes this margin
    lines: list[str] = []
    [result] = tune([bundle], {"universal": {"range_num_images_per_batch": [1, 64]}}, device="cpu",
                            memory_limit=setup["limit"], storage=f"sqlite:///{tmp_path / 's.db'}", margin=MARGIN,
                            progress=lines.append)  # its own storage: the module's keeps unpatched verdicts
    cfg = load_bundle_config(bundle)
    scaling, block = cfg.batch_scaling, cfg.plan
    ref = scaling.reference_batch
    largest = block.batch["largest_fit_in_range"]
    assert largest > ref, "the limit must leave room above the template's batch"
    assert result["num_patches_per_iter"] == cfg.num_patches_per_iter == ref
    assert cfg.learning_rate == pytest.approx(scaling.reference_learning_rate) and cfg.lr_warmup_samples == 0
    assert cfg.num_sw_batch_size == block.num_sw_batch_size >= 1
    verdict = block.handoff
    assert verdict["rule"] == "goodput" and verdict["handed"] == ref and verdict["batch"] == largest
    assert verdict["line"].startswith(f"samples/s at {ref}: ") and f", at {largest}: " in verdict["line"]
    assert f"per-sample efficiency {math.sqrt(ref / largest):.3g} ({scaling.lr_scaling} lr rule)" in verdict["line"]
    assert verdict["line"].endswith(f"-> hand over {ref}")
    assert block.batch["handed_to_training"] == ref and "goodput rule" in block.batch["reason"]
    assert block.max_num_patches_per_iter == largest
    assert block.train_peak_bytes <= block.budget_bytes and block.samples_per_s > 0
    assert any(line.endswith(verdict["line"]) for line in lines)  # said as well as written
    # verify checks the handed batch and the largest fit's edge, not the handed batch's
    report = verify(bundle, device="cpu", retune=False)
    assert report["holds"] and report["num_patches_per_iter"] == ref
    assert report["one_above"]["num_patches_per_iter"] == largest + 1


@pytest.fixture(scope="module")
def goodput_run(setup: dict) -> dict:
    """The default hand-off on a copy, on the module's storage (its points serve the later tunes)."""
    bundle = copy_bundle(setup["bundle"], setup["root"] / "goodput" / "unet_0")
    [result] = tune([bundle], {"universal": {"range_num_images_per_batch": [1, 64]}}, device="cpu",
                            memory_limit=setup["limit"], storage=setup["storage"], margin=MARGIN, progress=None)
    return {"bundle": bundle, "result": result}


def test_goodput_verdict_follows_the_measured_speed_up(setup: dict, goodput_run: dict) -> None:
    bundle, result = goodput_run["bundle"], goodput_run["result"]
    verdict = result["handoff"]
    assert verdict["rule"] == "goodput" and verdict["reference_trial"] is not None
    # the margin is the two probes' timing spread (added), at least the default noise
    study = optuna.load_study(study_name=result["study_name"], storage=setup["storage"])
    spread = {t.params["num_patches_per_iter"]: t.user_attrs["step_seconds_spread"] for t in study.trials
              if t.user_attrs.get("phases") == ["train"] and t.user_attrs.get("status") == "ok"}
    noise = spread[verdict["batch"]] + spread[verdict["reference_batch"]]
    assert verdict["margin"] == pytest.approx(max(goodput.DEFAULT_NOISE, noise))
    wins = verdict["speedup"] > 1 + verdict["margin"]
    assert verdict["handed"] == (verdict["batch"] if wins else verdict["reference_batch"])
    assert load_bundle_config(bundle).num_patches_per_iter == verdict["handed"]


def test_handoff_largest_restores_the_largest_fit(setup: dict, goodput_run: dict, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    bundle = copy_bundle(setup["bundle"], tmp_path / "unet_0")
    code = main(["tune", str(bundle), "--device", "cpu", "--memory-limit", str(setup["limit"]), "--storage",
                 setup["storage"], "--quiet", "--range-num-images-per-batch", *RANGE, "--handoff", "largest"])
    out, err = capsys.readouterr()
    assert code == 0, err
    cfg = load_bundle_config(bundle)
    block, scaling = cfg.plan, cfg.batch_scaling
    largest = block.batch["largest_fit_in_range"]
    assert cfg.num_patches_per_iter == largest == block.max_num_patches_per_iter > scaling.reference_batch
    assert block.handoff["rule"] == "largest"
    assert f"hand-off: {block.handoff['line']}" in out  # the table's note says which rule handed over
    assert block.probes == 0, "the goodput run's points are read back from the study; no reference probe"
    assert cfg.learning_rate == pytest.approx(scaled_learning_rate(
        scaling.reference_learning_rate, scaling.reference_batch, largest, scaling.lr_scaling))


def test_bad_handoff_is_one_line_exit_2(setup: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["tune", str(setup["bundle"]), "--quiet", "--storage", f"sqlite:///{tmp_path / 'x.db'}",
                 "--handoff", "fastest"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "fastest" in err and "Traceback" not in err
