"""The search strategies against a simulated device: exact, wrong and missing estimates,
failures, resume. Real probes are exercised in test_tune.py."""

from __future__ import annotations

from typing import Any

import optuna
import pytest

from autotune.probe.memory_model import MemoryModel
from autotune.search.strategies.edge_search import find_max_feasible
from autotune.search.strategies.evaluate import Evaluator
from autotune.search.strategies.fast import run_fast
from autotune.search.strategies.outcome import distributions
from autotune.search.strategies.space import AlgoSpec
from autotune.search.strategies.tpe import run_tpe

optuna.logging.set_verbosity(optuna.logging.WARNING)

MiB = 1024**2


class SimulatedDevice:
    """peak(n, m) = base + per_patch*n (+ sw cost for m); throughput rises then flattens."""

    measured = True

    def __init__(self, limit: int, est_error: float = 0.0, estimator: bool = True, faults: dict | None = None):
        self.limit = limit
        self.base, self.per_patch = 100 * MiB, 37 * MiB
        self.sw_base, self.per_window = 60 * MiB, 11 * MiB
        self.est_error = est_error
        self.estimator = estimator
        self.faults = dict(faults or {})
        self.calls: list[tuple[dict, tuple]] = []

    def train_peak(self, n: int) -> int:
        return self.base + self.per_patch * n

    def peak(self, point: dict, phases: tuple) -> int:
        peak = self.train_peak(point["num_patches_per_iter"])
        if "infer" in phases:
            on_cpu = point.get("validation_device") == "cpu"
            sw = self.base + self.sw_base * (0 if on_cpu else 1) + self.per_window * point["num_sw_batch_size"]
            peak = max(peak, sw)
        return peak

    def probe(self, point: dict, phases: tuple) -> dict[str, Any]:
        self.calls.append((dict(point), tuple(phases)))
        fault = self.faults.get(point.get("num_patches_per_iter"))
        if fault and "infer" not in phases:
            return {"status": fault, "error_type": "Injected", "signal": 9 if fault == "killed" else None}
        peak = self.peak(point, phases)
        if peak > self.limit:
            return {"status": "oom", "peak_bytes": self.limit}
        n = point["num_patches_per_iter"]
        result = {"status": "ok", "peak_bytes": peak, "train_peak_bytes": self.train_peak(n),
                  "samples_per_s": n / (0.5 + 0.1 * n)}
        if "infer" in phases:
            result["sw_seconds_per_volume"] = 1.0 / (point["num_sw_batch_size"] ** 0.5)
        return result

    def memory_model(self, phase: str, point: dict) -> MemoryModel | None:
        if not self.estimator:
            return None
        k = 1.0 + self.est_error
        if phase == "train":
            return MemoryModel(self.base * k, self.per_patch * k)
        on_cpu = point.get("validation_device") == "cpu"
        return MemoryModel((self.base + self.sw_base * (0 if on_cpu else 1)) * k, self.per_window * k)


def _storage(tmp_path) -> optuna.storages.RDBStorage:
    return optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'studies.db'}")


def _study(tmp_path, name: str = "s") -> optuna.Study:
    return optuna.create_study(storage=_storage(tmp_path), study_name=name, direction="maximize", load_if_exists=True)


def _true_max(device: SimulatedDevice, budget: int, hi: int) -> int:
    return max(n for n in range(1, hi + 1) if device.train_peak(n) <= budget)


SPEC = AlgoSpec(patches_range=(1, 64), sw_range=(1, 64))


def _evaluator(tmp_path, device: Any, budget: int, spec: AlgoSpec = SPEC, devices: tuple[str, ...] = ("device",),
               study: optuna.Study | None = None) -> Evaluator:
    """An evaluator on ``study`` (default: a fresh one in ``tmp_path``) over ``spec``'s space."""
    study = study if study is not None else _study(tmp_path)
    return Evaluator(study, device, budget, distributions(spec, devices), storage=_storage(tmp_path))


@pytest.mark.parametrize("est_error", [0.0, 0.004, -0.2, 0.25, 1.5])
def test_fast_finds_true_maximum(tmp_path, est_error: float) -> None:
    limit = 2048 * MiB
    budget = int(limit * 0.9)
    device = SimulatedDevice(limit, est_error=est_error)
    evaluator = _evaluator(tmp_path, device, budget)
    outcome = run_fast(evaluator, SPEC, ("device",), device.memory_model("train", {}),
                       lambda n, vd: device.memory_model("infer", {"validation_device": vd}))
    assert outcome.max_num_patches_per_iter == _true_max(device, budget, 64)
    train_probes = [c for c in device.calls if c[1] == ("train",)]
    if est_error == 0.0:
        assert len(train_probes) == 2  # the prediction, then one above it
    # sliding-window: the largest m whose peak fits, with the training batch fixed
    n = outcome.num_patches_per_iter
    true_m = max(m for m in range(1, 65) if device.peak(
        {"num_patches_per_iter": n, "num_sw_batch_size": m, "validation_device": "device"}, ("train", "infer")) <= budget)
    assert outcome.num_sw_batch_size == true_m
    assert outcome.validation_device == "device"


def test_fast_without_estimator_bisects(tmp_path) -> None:
    limit = 1500 * MiB
    device = SimulatedDevice(limit, estimator=False)
    budget = int(limit * 0.9)
    evaluator = _evaluator(tmp_path, device, budget)
    best, evals = find_max_feasible(
        lambda n: evaluator.evaluate({"num_patches_per_iter": n}, ("train",)), 1, 64, None, budget)
    assert best == _true_max(device, budget, 64)
    assert len(evals) <= 12


def test_range_cap_needs_one_probe(tmp_path) -> None:
    device = SimulatedDevice(64 * 1024 * MiB)
    spec = AlgoSpec(patches_range=(1, 8), sw_range=(1, 4))
    evaluator = _evaluator(tmp_path, device, 10**12, spec=spec)
    best, evals = find_max_feasible(
        lambda n: evaluator.evaluate({"num_patches_per_iter": n}, ("train",)), 1, 8,
        device.memory_model("train", {}), 10**12)
    assert best == 8 and len(evals) == 1


def test_nothing_fits_is_reported(tmp_path) -> None:
    device = SimulatedDevice(120 * MiB)
    evaluator = _evaluator(tmp_path, device, 100 * MiB)
    outcome = run_fast(evaluator, SPEC, ("device",), device.memory_model("train", {}), lambda n, vd: None)
    assert outcome.num_patches_per_iter is None


def test_validation_falls_back_to_cpu_when_device_cannot_hold_volume(tmp_path) -> None:
    limit = 300 * MiB
    device = SimulatedDevice(limit)
    device.sw_base = 200 * MiB  # the volume itself does not fit on the device
    budget = int(limit * 0.9)
    evaluator = _evaluator(tmp_path, device, budget, devices=("device", "cpu"))
    outcome = run_fast(evaluator, SPEC, ("device", "cpu"), device.memory_model("train", {}),
                       lambda n, vd: device.memory_model("infer", {"validation_device": vd}))
    assert outcome.validation_device == "cpu"
    assert outcome.num_sw_batch_size is not None and outcome.num_sw_batch_size >= 1


def test_trials_record_states_and_constraints(tmp_path) -> None:
    limit = 2048 * MiB
    budget = int(limit * 0.9)
    device = SimulatedDevice(limit, est_error=0.3)  # over-estimate: forces an oom and a bisection
    study = _study(tmp_path)
    evaluator = _evaluator(tmp_path, device, budget, study=study)
    run_fast(evaluator, SPEC, ("device",), device.memory_model("train", {}), lambda n, vd: None)
    trials = study.get_trials()
    assert trials, "every evaluated point is a trial"
    for t in trials:
        assert t.state == optuna.trial.TrialState.COMPLETE
        assert "memory" in t.constraints
        assert t.user_attrs["status"] in ("ok", "oom")
        feasible = t.constraints["memory"] <= 0
        assert feasible == (t.user_attrs["status"] == "ok" and t.user_attrs["peak_bytes"] <= budget)
    assert any(t.constraints["memory"] > 0 for t in trials)


def test_failed_probe_is_fail_trial_retried_once(tmp_path) -> None:
    limit = 2048 * MiB
    budget = int(limit * 0.9)
    device = SimulatedDevice(limit)
    true_max = _true_max(device, budget, 64)
    device.faults = {true_max + 1: "killed"}  # the confirming probe above the edge crashes
    study = _study(tmp_path)
    evaluator = _evaluator(tmp_path, device, budget, study=study)
    outcome = run_fast(evaluator, SPEC, ("device",), device.memory_model("train", {}), lambda n, vd: None)
    assert outcome.max_num_patches_per_iter == true_max
    failed = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.FAIL]
    assert len(failed) == 2, "a crashed point is retried once, then taken as not fitting"
    assert all("signal 9" in t.user_attrs["fail_reason"] for t in failed)
    # a rerun answers the crashed point from the study: it failed twice, it is not probed again
    calls = len(device.calls)
    again = _evaluator(tmp_path, device, budget, study=study).evaluate(
        {"num_patches_per_iter": true_max + 1}, ("train",))
    assert not again.feasible and again.reused
    assert len(device.calls) == calls


def test_resume_reuses_measured_points(tmp_path) -> None:
    limit = 2048 * MiB
    budget = int(limit * 0.9)
    device = SimulatedDevice(limit, est_error=-0.2)
    first = run_fast(_evaluator(tmp_path, device, budget), SPEC,
                     ("device",), device.memory_model("train", {}), lambda n, vd: None)
    calls = len(device.calls)
    again = run_fast(_evaluator(tmp_path, device, budget), SPEC,
                     ("device",), device.memory_model("train", {}), lambda n, vd: None)
    assert len(device.calls) == calls, "a rerun on the same study probes nothing new"
    assert again.num_patches_per_iter == first.num_patches_per_iter
    assert again.num_sw_batch_size == first.num_sw_batch_size


def test_tpe_baseline_uses_its_budget_and_picks_a_feasible_point(tmp_path) -> None:
    limit = 2048 * MiB
    budget = int(limit * 0.9)
    device = SimulatedDevice(limit)
    spec = AlgoSpec(num_trials=12, patches_range=(1, 64), sw_range=(1, 64))
    study = optuna.create_study(storage=_storage(tmp_path), direction="maximize",
                                sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=6))
    evaluator = _evaluator(tmp_path, device, budget, spec=spec, study=study)
    outcome = run_tpe(evaluator, spec, ("device",))
    assert len(study.get_trials()) == 12
    if outcome.num_patches_per_iter is not None:
        point = {"num_patches_per_iter": outcome.num_patches_per_iter,
                 "num_sw_batch_size": outcome.num_sw_batch_size, "validation_device": "device"}
        assert device.peak(point, ("train", "infer")) <= budget


def test_flat_memory_does_not_walk_one_step_at_a_time(tmp_path) -> None:
    """When the training peak dominates, the sw batch barely changes the peak; the search must
    not probe every value (it did once: 57 probes)."""
    limit = 2048 * MiB
    budget = int(limit * 0.9)
    device = SimulatedDevice(limit)
    device.per_window = 1  # flat: the sliding window never sets the peak
    device.sw_base = 0
    evaluator = _evaluator(tmp_path, device, budget)
    # an estimator that wrongly believes each window costs 11 MiB on top of the training peak
    wrong = MemoryModel(device.train_peak(40), 11 * MiB)
    best, evals = find_max_feasible(
        lambda m: evaluator.evaluate({"num_patches_per_iter": 40, "num_sw_batch_size": m, "validation_device": "device"},
                                     ("train", "infer")), 1, 64, wrong, budget)
    assert best == 64
    assert len(evals) <= 8


def test_window_cap_limits_the_sliding_window_range(tmp_path) -> None:
    limit = 2048 * MiB
    device = SimulatedDevice(limit)
    evaluator = _evaluator(tmp_path, device, int(limit * 0.9))
    capped = MemoryModel(device.base + device.sw_base, device.per_window, cap=6)
    outcome = run_fast(evaluator, SPEC, ("device",), device.memory_model("train", {}), lambda n, vd: capped)
    assert outcome.num_sw_batch_size == 6, "no batch larger than the number of windows"


@pytest.mark.parametrize("objective", ["max-batch", "throughput"])
def test_best_trial_of_each_phase_study_is_the_answer(tmp_path, objective: str) -> None:
    """Points between the budget and the limit run ("ok") but do not fit; they store 0, so each study's best
    trial as optuna-dashboard reads it (``storage.get_best_trial``, constraints ignored) is the answer. Training
    and inference trials go to separate studies (one unit each). Throughput rises with the batch here, so the
    fastest point that fits is also the chosen one."""
    limit = 2048 * MiB
    budget = int(limit * 0.9)
    device = SimulatedDevice(limit)
    storage = _storage(tmp_path)
    train_study, infer_study = _study(tmp_path, "train"), _study(tmp_path, "train-infer")
    evaluator = Evaluator(train_study, device, budget, distributions(SPEC, ("device",)), storage=storage,
                          objective=objective, infer_study=infer_study)
    outcome = run_fast(evaluator, SPEC, ("device",), device.memory_model("train", {}),
                       lambda n, vd: device.memory_model("infer", {"validation_device": vd}), objective)
    train_trials, infer_trials = train_study.get_trials(), infer_study.get_trials()
    assert {tuple(t.user_attrs["phases"]) for t in train_trials} == {("train",)}
    assert {tuple(t.user_attrs["phases"]) for t in infer_trials} == {("infer",)}
    ran_but_over = [t for t in train_trials if t.user_attrs["status"] == "ok" and t.constraints["memory"] > 0]
    assert ran_but_over, "the simulated limit must leave a point that runs above the budget"
    assert all(t.value == 0 and t.user_attrs["verdict"] == "does not fit" for t in ran_but_over)
    best_train = storage.get_best_trial(storage.get_study_id_from_name("train"))
    best_infer = storage.get_best_trial(storage.get_study_id_from_name("train-infer"))
    assert best_train.number == outcome.train.trial_number
    assert best_train.params["num_patches_per_iter"] == outcome.num_patches_per_iter
    assert best_infer.number == outcome.infer.trial_number
    assert best_infer.params["num_sw_batch_size"] == outcome.num_sw_batch_size
    assert evaluator.infer_trial_numbers == [t.number for t in infer_trials]


def test_tpe_joint_study_best_trial_is_the_answer(tmp_path) -> None:
    """A tpe study's trials size both phases; its value orders them by N, then by the sw batch, so the best
    trial the dashboard shows is the point written back (not the first trial at the largest N)."""
    limit = 2048 * MiB
    budget = int(limit * 0.9)
    device = SimulatedDevice(limit)
    spec = AlgoSpec(num_trials=30, patches_range=(1, 12), sw_range=(1, 64))
    storage = _storage(tmp_path)
    study = optuna.create_study(storage=storage, study_name="joint", direction="maximize",
                                sampler=optuna.samplers.TPESampler(seed=1, n_startup_trials=10))
    evaluator = _evaluator(tmp_path, device, budget, spec=spec, study=study)
    outcome = run_tpe(evaluator, spec, ("device",))
    best = storage.get_best_trial(storage.get_study_id_from_name("joint"))
    assert (best.params["num_patches_per_iter"], best.params["num_sw_batch_size"]) == (
        outcome.num_patches_per_iter, outcome.num_sw_batch_size)
    at_largest_n = [t for t in study.get_trials() if t.params.get("num_patches_per_iter") == outcome.num_patches_per_iter
                    and t.user_attrs.get("verdict") == "fits"]
    assert best.params["num_sw_batch_size"] == max(t.params["num_sw_batch_size"] for t in at_largest_n)
