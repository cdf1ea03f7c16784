"""Tuning that survives faults: a TPE study whose probe child is made to run out of memory,
segfault, raise and hang past its timeout at chosen trials. The study finishes, every trial
has the right state and reason, and the tuned result is the best measured feasible point.

The trials are chosen by enqueuing them (Optuna's ``enqueue_trial``: TPE asks waiting
trials first), so the fault plan is exact. The faults fire as the child starts (rules with
no ``phase``), so a faulted trial costs a Python start-up, not a model build. The study is
run twice: first with a generous probe timeout (trials 0-6), then resumed with a short one
(trials 7-8), so the hanging child is killed after a few seconds while the clean probes of
the first run never risk a timeout on a loaded machine.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from probe_fixtures import limit_for_patches, one_window_unet

from autotune.bundles.config import load_bundle_config
from autotune.device import device_info
from autotune.search.storage.study import make_key, open_storage, open_study
from autotune.search.strategies.registry import strategy_named
from autotune.stages import tune

MARGIN = 0.10
# (num_patches_per_iter, num_sw_batch_size) of trials 0..8, and what happens at each
PLAN = [
    ((1, 1), "ok"),
    ((2, 1), "oom"),  # injected torch.OutOfMemoryError: COMPLETE, memory constraint violated
    ((3, 2), "ok"),
    ((4, 1), "killed"),  # SIGSEGV
    ((3, 1), "error"),  # ValueError raised in the child
    ((4, 1), "killed"),  # the same point crashes once more
    ((4, 1), "skipped"),  # failed twice: taken as infeasible, not probed a third time
    ((2, 2), "timeout"),  # second run: hangs past the 4 s timeout
    ((3, 2), "reused"),  # second run: a measured point asked again is answered from the study
]
FIRST_RUN = 7
FAULTS = ",".join([
    "oom@num_patches_per_iter=2&num_sw_batch_size=1",
    "segfault@num_patches_per_iter=4",
    "raise@num_patches_per_iter=3&num_sw_batch_size=1",
    "hang@num_patches_per_iter=2&num_sw_batch_size=2",
])
SPACE = {"range_num_images_per_batch": [1, 5], "range_num_sw_batch_size": [1, 2]}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return one_window_unet(tmp_path_factory, "faults")


@pytest.fixture(scope="module")
def limit(bundle: Path) -> int:
    return limit_for_patches(bundle, 3.5, MARGIN)  # at most 3 patches fit


@pytest.fixture(scope="module")
def study_run(bundle: Path, limit: int, tmp_path_factory: pytest.TempPathFactory) -> dict:
    storage = f"sqlite:///{tmp_path_factory.mktemp('fault_study') / 'faults.db'}"
    tpe = strategy_named("tpe")
    key = make_key(load_bundle_config(bundle), device_info("cpu"), limit, tpe.key_name, joint=tpe.joint)
    study = open_study(open_storage(storage), key, phase=tpe.phase)
    for (n, m), _ in PLAN:
        study.enqueue_trial({"num_patches_per_iter": n, "num_sw_batch_size": m, "validation_device": "device"})
    common = dict(device="cpu", memory_limit=limit, storage=storage, strategy="tpe", margin=MARGIN,
                  probe_env={"AUTOTUNE_PROBE_FAULT": FAULTS}, progress=None)
    first = tune([bundle], {"universal": {**SPACE, "num_trials": FIRST_RUN}}, timeout=240,
                         write_back=False, **common)[0]
    second = tune([bundle], {"universal": {**SPACE, "num_trials": len(PLAN)}}, timeout=4, **common)[0]
    trials = optuna.load_study(study_name=key.study_name, storage=storage).get_trials()
    return {"first": first, "second": second, "trials": trials, "study_name": key.study_name}


def _point(trial: optuna.trial.FrozenTrial) -> tuple[int, int]:
    return trial.params["num_patches_per_iter"], trial.params["num_sw_batch_size"]


def test_every_trial_has_the_planned_point_state_and_reason(study_run: dict) -> None:
    trials = study_run["trials"]
    assert [t.number for t in trials] == list(range(len(PLAN))), "no trial lost, none added"
    states = optuna.trial.TrialState
    for trial, (point, outcome) in zip(trials, PLAN, strict=True):
        attrs = trial.user_attrs
        assert _point(trial) == point
        assert attrs["point_id"].endswith(f"num_patches_per_iter={point[0]},num_sw_batch_size={point[1]},"
                                          "validation_device=device")
        where = f"trial {trial.number} {point} {outcome}: {trial.state.name} {attrs}"
        if outcome in ("ok", "reused"):
            assert trial.state == states.COMPLETE and attrs["status"] == "ok", where
            assert trial.constraints["memory"] <= 0 and trial.value and trial.value > 0, where
            assert "fail_reason" not in attrs, where
        elif outcome == "oom":  # an OOM is a result (the sampler learns where memory ends), not a failure
            assert trial.state == states.COMPLETE and attrs["status"] == "oom", where
            assert trial.constraints["memory"] > 0 and trial.value == 0.0, where
            assert attrs["error_type"] == "OutOfMemoryError" and "fail_reason" not in attrs, where
        else:
            assert trial.state == states.FAIL and attrs["status"] == outcome, where
            assert not trial.constraints, where
    reason = {t.number: t.user_attrs.get("fail_reason", "") for t in trials}
    assert reason[3] == reason[5] == "killed: signal 11 (SIGSEGV)"
    assert trials[3].user_attrs["signal"] == 11
    assert reason[4].startswith("error: ValueError") and "injected fault: raise" in reason[4]
    assert reason[6] == ("skipped: this point failed 2 times (trials #3, #5); taken as infeasible, "
                         "not probed again")
    assert trials[6].user_attrs["reused_trial"] == 5
    assert reason[7].startswith("timeout: no result after ") and reason[7].endswith("the probe was killed")
    assert 4.0 <= float(reason[7].split("after ")[1].split(" s")[0]) < 30.0
    # the point asked again in the second run was not probed again: same measurement, linked to it
    assert trials[8].user_attrs["reused_trial"] == 2 and trials[8].value == trials[2].value
    assert trials[8].user_attrs["peak_bytes"] == trials[2].user_attrs["peak_bytes"]


def test_study_finishes_and_counts_probes(study_run: dict) -> None:
    first, second = study_run["first"], study_run["second"]
    assert first["status"] == second["status"] == "tuned"
    assert first["study_name"] == second["study_name"] == study_run["study_name"]
    assert first["trials"] == list(range(FIRST_RUN)) and second["trials"] == [7, 8]
    assert first["probes"] == 6, "a child for trials 0-5; none for the point that failed twice"
    assert second["probes"] == 1, "only the hanging point ran a child; the measured one was reused"


def test_tuned_result_is_the_best_measured_feasible_point(study_run: dict, bundle: Path) -> None:
    trials = study_run["trials"]
    feasible = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and t.user_attrs["status"] == "ok"
                and t.constraints["memory"] <= 0 and "reused_trial" not in t.user_attrs]
    assert sorted(_point(t) for t in feasible) == [(1, 1), (3, 2)], "faulted points never count as feasible"
    # the default objective (max-batch): the largest feasible batch, whatever the timings
    expected = max(feasible, key=_point)
    for result in (study_run["first"], study_run["second"]):
        assert (result["num_patches_per_iter"], result["num_sw_batch_size"]) == _point(expected)
        assert result["max_num_patches_per_iter"] == 3
        assert result["validation_device"] == "device" and result["sw_input_on_cpu"] is False
        assert result["peak_bytes"] <= result["budget_bytes"]
    cfg = load_bundle_config(bundle)  # only the second run wrote back
    assert (cfg.num_patches_per_iter, cfg.num_sw_batch_size) == _point(expected)
    assert cfg.plan.trials == [7, 8] and cfg.plan.study_name == study_run["study_name"]
