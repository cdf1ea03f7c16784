"""MONAI's bundles go through the goodput hand-off: the template's stated batch is the reference, the probes'
samples/s decide, the learning rate follows the template's optimizer, written into MONAI's own keys.

Synthetic measurements stand in for the probes (the slow tier tunes the same bundles with real ones)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from autotune.bundles.config import BundleConfig, load_bundle, load_bundle_config
from autotune.bundles.result import TuningResult
from autotune.search.driver.writeback import write_bundle
from autotune.search.handoff import apply_handoff
from autotune.tunables import Point, ValidationDevice

STATED = {"segresnet": (1, 0.0002, "sqrt"), "dints": (1, 0.2, "linear")}  # batch, lr, rule: AdamW, SGD


def _measured(n: int, samples_per_s: float, trial: int) -> Any:
    """A training evaluation as the search's evaluator returns it."""
    result = {"samples_per_s": samples_per_s, "step_seconds_spread": 0.0, "train_peak_bytes": 1000 * n,
              "peak_bytes": 1000 * n}
    return SimpleNamespace(result=result, feasible=True, trial_number=trial)


def _tuned(n: int) -> TuningResult:
    """The result of a search whose largest fit is ``n`` (before the hand-off)."""
    point = Point.of(num_patches_per_iter=n, num_sw_batch_size=2, validation_device=ValidationDevice.DEVICE)
    return TuningResult("tuned", point, max_num_patches_per_iter=n, train_peak_bytes=1000 * n, peak_bytes=1000 * n,
                        provenance={"algo": "x", "train_trial": 7, "memory_limit": 2**30, "device": "cpu",
                                    "method": "measured"})


def _hand_off(cfg: BundleConfig, n: int, speed_at_n: float, speed_at_ref: float,
              handoff: str = "goodput") -> tuple[TuningResult, list[int]]:
    asked: list[int] = []

    def measure(batch: int) -> Any:
        asked.append(batch)
        return _measured(batch, speed_at_ref, 3)

    result = apply_handoff(_tuned(n), cfg, _measured(n, speed_at_n, 7), measure, handoff, lambda line: None)
    return result, asked


@pytest.mark.parametrize("template", ["segresnet", "dints"])
def test_the_templates_stated_batch_and_its_optimizers_rule_are_the_reference(bundles: dict[str, Path],
                                                                                template: str) -> None:
    block = load_bundle_config(bundles[template]).batch_scaling
    assert (block.reference_batch, block.reference_learning_rate, block.lr_scaling) == STATED[template]
    assert block.warmup_epochs == 0 and "as generated" in block.source
    assert ("num_crops_per_image 1" in block.source) and block.optimizer in ("AdamW", "SGD")


@pytest.mark.parametrize("template", ["segresnet", "dints"])
def test_batch_1_is_handed_1_unless_the_probes_measure_a_larger_batch_faster(bundles: dict[str, Path],
                                                                             template: str) -> None:
    cfg = load_bundle_config(bundles[template])
    # 4 patches fit; per-sample efficiency sqrt(1/4) = 0.5 for either rule: 4 must run > 2.2x the samples/s of 1
    slower, asked = _hand_off(cfg, 4, speed_at_n=20.0, speed_at_ref=10.0)  # 2x: speed-up 1.0
    assert asked == [1] and slower.num_patches_per_iter == 1 and slower.handoff["handed"] == 1
    assert slower.handoff["speedup"] == pytest.approx(1.0) and slower.max_num_patches_per_iter == 4
    assert slower.train_trial == 3 and slower.samples_per_s == 10.0  # the reference probe describes it
    assert (slower.num_sw_batch_size, slower.validation_device) == (2, ValidationDevice.DEVICE)  # kept
    faster, _ = _hand_off(cfg, 4, speed_at_n=25.0, speed_at_ref=10.0)  # 2.5x: speed-up 1.25 > 1.1
    assert faster.num_patches_per_iter == 4 and faster.handoff["handed"] == 4
    assert f"({STATED[template][2]} lr rule)" in faster.handoff["line"]
    largest, none_asked = _hand_off(cfg, 4, speed_at_n=11.0, speed_at_ref=10.0, handoff="largest")
    assert largest.num_patches_per_iter == 4 and none_asked == []


def _write(bundle: Path, result: TuningResult) -> dict[str, Any]:
    return write_bundle(str(bundle), load_bundle(bundle), result, True, lambda line: None)


def test_the_learning_rate_follows_the_rule_into_monais_own_keys(bundles: dict[str, Path]) -> None:
    seg, dints = load_bundle_config(bundles["segresnet"]), load_bundle_config(bundles["dints"])
    seg_record, _ = _hand_off(seg, 4, speed_at_n=40.0, speed_at_ref=10.0)
    dints_record, _ = _hand_off(dints, 4, speed_at_n=40.0, speed_at_ref=10.0)
    _write(bundles["segresnet"], seg_record)
    _write(bundles["dints"], dints_record)
    written = yaml.safe_load((bundles["segresnet"] / "configs" / "hyper_parameters.yaml").read_text())
    assert written["learning_rate"] == pytest.approx(0.0002 * math.sqrt(4))  # AdamW: sqrt
    assert (written["num_crops_per_image"], written["batch_size"], written["auto_scale_allowed"]) == (4, 1, False)
    training = yaml.safe_load((bundles["dints"] / "configs" / "hyper_parameters.yaml").read_text())["training"]
    assert training["learning_rate"] == pytest.approx(0.2 * 4) and training["num_patches_per_iter"] == 4  # SGD
    provenance = yaml.safe_load((bundles["segresnet"] / "autotune" / "tuning.yaml").read_text())
    assert provenance["handoff"]["handed"] == 4 and provenance["recipe"]["lr_scaling"] == "sqrt"
    assert provenance["recipe"]["learning_rate"] == {"before": 0.0002, "after": pytest.approx(0.0004)}
    # the configs now say 4 patches at 4e-4; a second tuning still takes the template's 1 at 2e-4
    again = load_bundle_config(bundles["segresnet"])
    assert again.num_patches_per_iter == 4 and again.batch_scaling.reference_batch == 1
    assert again.batch_scaling.reference_learning_rate == 0.0002
    back_to_one, _ = _hand_off(again, 4, speed_at_n=10.0, speed_at_ref=10.0)
    _write(bundles["segresnet"], back_to_one)
    written = yaml.safe_load((bundles["segresnet"] / "configs" / "hyper_parameters.yaml").read_text())
    assert (written["learning_rate"], written["num_crops_per_image"], written["batch_size"]) == (0.0002, 1, 1)


def test_handoff_largest_keeps_the_largest_fit_and_the_templates_learning_rate(bundles: dict[str, Path]) -> None:
    cfg = load_bundle_config(bundles["dints"])
    record, _ = _hand_off(cfg, 6, speed_at_n=1.0, speed_at_ref=10.0, handoff="largest")
    result = _write(bundles["dints"], record)
    training = yaml.safe_load((bundles["dints"] / "configs" / "hyper_parameters.yaml").read_text())["training"]
    assert training["num_patches_per_iter"] == 6 and training["learning_rate"] == 0.2
    assert training["auto_scale_allowed"] is False
    assert result["tuning"]["recipe"]["lr_scaling"] == "none" and "--handoff largest" in result["tuning"]["recipe"]["reason"]


def test_a_bundle_tuned_before_the_reference_was_recorded_says_so(bundles: dict[str, Path]) -> None:
    from autotune.auto3dseg.writeback import update_bundle

    old_plan = {"num_patches_per_iter": 5, "num_sw_batch_size": 2, "memory_limit": 2**30, "device": "cpu"}
    update_bundle(bundles["segresnet"], {"num_patches_per_iter": 5, "tuning": old_plan})
    cfg = load_bundle_config(bundles["segresnet"])
    assert cfg.batch_scaling is None  # its configs hold 5, not the template's batch
    result, asked = _hand_off(cfg, 5, speed_at_n=1.0, speed_at_ref=10.0)
    assert asked == [] and result.num_patches_per_iter == 5
    assert "regenerate the bundle" in result.handoff["line"]


def test_an_out_of_memory_line_names_the_batch_the_configs_state(bundles: dict[str, Path]) -> None:
    """The ``tuning:`` record is provenance: a launch that ran out of memory names the batch MONAI's configs hold
    (what ``train.py`` ran), not the one the record says was tuned."""
    from autotune.auto3dseg.oom import oom_outcome
    from autotune.auto3dseg.writeback import update_bundle

    tuned = {"num_patches_per_iter": 5, "num_sw_batch_size": 2, "memory_limit": 2**30, "device": "cpu"}
    update_bundle(bundles["segresnet"], {"num_patches_per_iter": 3, "tuning": tuned})
    record: dict[str, Any] = {"phase_failed": "train", "peak_bytes": 2**31}
    line = oom_outcome(bundles["segresnet"] / "scripts" / "train.py", record, 2**30, "cpu")
    assert "with 3 patches per step" in line and record["failed_point"]["num_patches_per_iter"] == 3
    assert record["failed_point"]["study"]["recorded"] is False  # a measured plan's key only
