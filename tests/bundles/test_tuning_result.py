"""A key's tuning result is one typed object (``autotune.bundles.result.TuningResult``) with one serialisation: the
study keeps its record, the summary shows it, the ``tuning:`` block is that record; a stored result and a block
written by an earlier autotune (the validation device held twice) still read."""

from __future__ import annotations

import pytest
import yaml

from autotune.bundles.plan import TuningPlan
from autotune.bundles.result import TuningResult
from autotune.tunables import Point, ValidationDevice

PROVENANCE = {"algo": "unet", "objective": "max-batch", "method": "measured", "strategy": "fast", "train_trial": 1,
              "infer_trial": 0, "memory_limit": 67_108_864, "device": "cuda:0", "study_name": "s",
              "handoff": {"rule": "goodput", "handed": 2}, "batch": {"searched_range": [1, 14]}}


def _result() -> TuningResult:
    point = Point.of(num_patches_per_iter=2, num_sw_batch_size=27, validation_device=ValidationDevice.CPU)
    return TuningResult("tuned", point, max_num_patches_per_iter=9, peak_bytes=51_000_000,
                        train_peak_bytes=16_000_000, infer_peak_bytes=51_000_000, samples_per_s=0.27,
                        sw_seconds_per_volume=3.9, provenance=PROVENANCE)


def test_a_result_round_trips_through_its_record_and_is_the_plan() -> None:
    result = _result()
    record = result.as_record()
    assert record["validation_device"] == "cpu" and type(record["validation_device"]) is str
    assert "sw_input_on_cpu" not in record  # the validation device once
    assert yaml.safe_load(yaml.safe_dump(record)) == record  # plain data: the study, the summary, the file
    assert TuningResult.from_record(record) == result
    assert (result.num_patches_per_iter, result.num_sw_batch_size, result.validation_device) == \
        (2, 27, ValidationDevice.CPU)
    assert result.handoff_rule == "goodput" and result.train_trial == 1 and result.algo == "unet"
    plan = TuningPlan.from_result(result, {"lr_scaling": "sqrt"})
    assert plan == TuningPlan.from_record(record, {"lr_scaling": "sqrt"})
    assert (plan.num_patches_per_iter, plan.validation_device, plan.largest_fit) == (2, ValidationDevice.CPU, 9)
    assert "sw_input_on_cpu" not in plan.as_dict() and plan.recipe == {"lr_scaling": "sqrt"}


def test_replace_puts_each_change_where_it_belongs() -> None:
    result = _result().replace(num_patches_per_iter=4, train_trial=3, peak_bytes=1, from_storage=True)
    assert result.num_patches_per_iter == 4 and result.point.num_sw_batch_size == 27  # a tunable: the point
    assert result.train_trial == 3 and result.provenance["study_name"] == "s"  # the rest: the provenance
    assert result.peak_bytes == 1 and result.from_storage
    with pytest.raises(TypeError):
        result.provenance["algo"] = "dints"  # type: ignore[index]


def test_a_result_not_tuned_says_why() -> None:
    infeasible = TuningResult("infeasible", reason="even 1 patch does not fit", provenance={"algo": "dints"})
    record = infeasible.as_record()
    assert record == {"status": "infeasible", "reason": "even 1 patch does not fit", "algo": "dints",
                      "from_storage": False}
    assert not infeasible.tuned and infeasible.num_patches_per_iter is None and infeasible.validation_device is None
    assert TuningResult.from_record(record) == infeasible
    with pytest.raises(ValueError, match="status must be one of"):
        TuningResult("fitted")


@pytest.mark.parametrize(("flag", "held"), [(True, ValidationDevice.CPU), (False, ValidationDevice.DEVICE)])
def test_a_result_stored_by_an_earlier_autotune_reads_its_flag(flag: bool, held: ValidationDevice) -> None:
    """An earlier autotune stored ``sw_input_on_cpu`` beside ``validation_device``, or (older) the flag alone."""
    both = {**_result().as_record(), "validation_device": held.value, "sw_input_on_cpu": flag}
    assert TuningResult.from_record(both).validation_device is held
    alone = {k: v for k, v in both.items() if k != "validation_device"}
    read = TuningResult.from_record(alone)
    assert read.validation_device is held and "sw_input_on_cpu" not in read.as_record()
    block = {k: v for k, v in alone.items() if k != "from_storage"}
    assert TuningPlan.from_dict(block, "tuning").validation_device is held  # a block of that time
