"""The fast search on memory curves that bend, with noisy timings, killed and resumed.

A simulated device whose peak is not affine in N (as a full-size UNet's is not): the
search over the estimator's answers needs at most 2 real training probes when the
estimator is exact and at most 3 when the device adds an allowance it does not know;
the chosen values depend on memory alone, so a kill and a resume, and noisy timings,
give the undisturbed run's values.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
import pytest

from autotune.probe.memory_model import MemoryModel
from autotune.search.curves.edge import CorrectedCurve, correct, largest_under
from autotune.search.strategies.evaluate import Evaluator
from autotune.search.strategies.fast import run_fast
from autotune.search.strategies.objective import choose, metric_name
from autotune.search.strategies.outcome import distributions
from autotune.search.strategies.space import AlgoSpec

optuna.logging.set_verbosity(optuna.logging.WARNING)

@dataclass
class EstimatedCurve:
    """A curve that answers from a function, once per n (the estimator's answers, in these tests)."""

    estimate_fn: Callable[[int], float]
    cap: int | None = None
    known: dict[int, float] = field(default_factory=dict)

    def predict(self, n: int) -> float:
        if self.cap is not None:
            n = min(n, self.cap)
        if n not in self.known:
            self.known[n] = float(self.estimate_fn(n))
        return self.known[n]


MiB = 1024**2
SPEC = AlgoSpec(patches_range=(1, 64), sw_range=(1, 32))


class BentDevice:
    """peak(n) = base + a*n + b*n^2 (the slope at 60 is about 1.8x the slope at 1); throughput noisy."""

    measured = True

    def __init__(self, limit: int, scale: float = 1.0, offset: int = 0, seed: int = 0,
                 kill_at_call: int | None = None, speed: Any = None) -> None:
        self.limit, self.scale, self.offset = limit, scale, offset
        self.base, self.a, self.b = 300 * MiB, 20 * MiB, 0.14 * MiB
        self.sw_base, self.per_window = 200 * MiB, 9 * MiB
        self.rng = random.Random(seed)
        self.kill_at_call = kill_at_call
        self.speed = speed
        self.calls: list[tuple[dict, tuple]] = []

    def true_train(self, n: int) -> float:
        return self.base + self.a * n + self.b * n * n

    def true_infer(self, m: int) -> float:
        return self.base + self.sw_base + self.per_window * m + 0.05 * MiB * m * m

    def device_peak(self, raw: float) -> int:
        return int(raw * self.scale) + self.offset  # what the real device adds: an allowance

    def probe(self, point: dict, phases: tuple) -> dict[str, Any]:
        if self.kill_at_call is not None and len(self.calls) == self.kill_at_call:
            raise KeyboardInterrupt("simulated SIGKILL of the tuner")
        self.calls.append((dict(point), tuple(phases)))
        n = point["num_patches_per_iter"]
        raw = self.true_infer(point["num_sw_batch_size"]) if "infer" in phases else self.true_train(n)
        peak = self.device_peak(raw)
        if peak > self.limit:
            return {"status": "oom", "peak_bytes": self.limit}
        noise = self.rng.uniform(0.5, 1.5)  # a loaded, shared machine
        speed = self.speed(n) if self.speed else n / (0.5 + 0.1 * n)
        result = {"status": "ok", "peak_bytes": peak, "samples_per_s": speed * noise}
        if "infer" in phases:
            result["sw_seconds_per_volume"] = noise / point["num_sw_batch_size"] ** 0.5
        return result

    # the estimator: exact on the tensors (the raw curve), blind to the device allowance
    def train_curve(self) -> EstimatedCurve:
        return EstimatedCurve(self.true_train)

    def infer_curve(self, n: int, validation_device: str) -> EstimatedCurve:
        return EstimatedCurve(self.true_infer, cap=None)


_STORAGES: dict[str, optuna.storages.RDBStorage] = {}  # study name -> the storage it was opened on


def _study(tmp_path, name: str = "s") -> optuna.Study:
    _STORAGES[name] = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'studies.db'}")
    return optuna.create_study(storage=_STORAGES[name], study_name=name, direction="maximize", load_if_exists=True)


def _search(study: optuna.Study, device: BentDevice, budget: int, objective: str = "max-batch") -> Any:
    evaluator = Evaluator(study, device, budget, distributions(SPEC, ("device",)), objective=objective,
                          storage=_STORAGES[study.study_name])
    return run_fast(evaluator, SPEC, ("device",), device.train_curve(), device.infer_curve, objective)


def _true_max(peak: Any, budget: int, hi: int) -> int:
    return max(n for n in range(1, hi + 1) if peak(n) <= budget)


def _train_probes(device: BentDevice) -> list[int]:
    return [c[0]["num_patches_per_iter"] for c in device.calls if c[1] == ("train",)]


def test_the_simulated_curve_bends() -> None:
    device = BentDevice(10**12)
    slope_low = device.true_train(2) - device.true_train(1)
    slope_high = (device.true_train(64) - device.true_train(52)) / 12
    assert slope_high / slope_low > 1.7
    line = MemoryModel(device.true_train(1) - slope_low, slope_low)  # through the estimates at 1 and 2
    budget = int(device.true_train(40))
    assert abs(line.max_fitting(budget) - 40) >= 3, "a line through N = 1 and 2 misplaces the edge"


@pytest.mark.parametrize("limit_mib", [1024, 1536, 2048, 2600])
def test_exact_estimator_needs_two_training_probes_on_a_bent_curve(tmp_path, limit_mib: int) -> None:
    limit = limit_mib * MiB
    budget = int(limit * 0.9)
    device = BentDevice(limit)
    outcome = _search(_study(tmp_path), device, budget)
    n_true = _true_max(device.true_train, budget, 64)
    assert outcome.max_num_patches_per_iter == n_true == outcome.num_patches_per_iter
    probes = _train_probes(device)
    assert probes == ([n_true, n_true + 1] if n_true < 64 else [64]), probes
    m_true = _true_max(device.true_infer, budget, 32)
    assert outcome.num_sw_batch_size == m_true
    infer = [c for c in device.calls if c[1] == ("infer",)]
    assert len(infer) <= 2


# what is left of the allowance error after the defaults (CUDA: +10% and 256 MiB) are applied
@pytest.mark.parametrize(("scale", "offset_mib"), [(1.05, 0), (1.0, 180), (1.03, 64), (0.93, 40), (1.0, -100)])
def test_device_allowance_is_corrected_within_three_probes(tmp_path, scale: float, offset_mib: int) -> None:
    limit = 2048 * MiB
    budget = int(limit * 0.9)
    device = BentDevice(limit, scale=scale, offset=offset_mib * MiB)
    outcome = _search(_study(tmp_path), device, budget)
    n_true = _true_max(lambda n: device.device_peak(device.true_train(n)), budget, 64)
    assert outcome.max_num_patches_per_iter == n_true
    assert len(_train_probes(device)) <= 3, _train_probes(device)


def test_killed_and_resumed_search_gives_the_undisturbed_values(tmp_path) -> None:
    limit = 2048 * MiB
    budget = int(limit * 0.9)
    undisturbed = _search(_study(tmp_path, "undisturbed"), BentDevice(limit, seed=1), budget)
    # a second, undisturbed run on its own study, with other timing noise: the same answer
    other = _search(_study(tmp_path, "other"), BentDevice(limit, seed=2), budget)
    study = _study(tmp_path, "killed")
    with pytest.raises(KeyboardInterrupt):
        _search(study, BentDevice(limit, seed=3, kill_at_call=2), budget)  # killed at its third probe
    trials = study.get_trials()
    states = [t.state for t in trials]
    # the interrupted probe's trial is failed with the reason, not left RUNNING for a process that is gone
    assert states.count(optuna.trial.TrialState.COMPLETE) == 2 and optuna.trial.TrialState.RUNNING not in states
    [interrupted] = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert interrupted.user_attrs["fail_reason"].startswith("interrupted: KeyboardInterrupt")
    resumed_device = BentDevice(limit, seed=4)
    resumed = _search(_study(tmp_path, "killed"), resumed_device, budget)
    for outcome in (other, resumed):
        assert (outcome.num_patches_per_iter, outcome.num_sw_batch_size, outcome.validation_device) == (
            undisturbed.num_patches_per_iter, undisturbed.num_sw_batch_size, undisturbed.validation_device)
    assert _train_probes(resumed_device) == [], "the resumed run reads the two measured training points back"


def test_throughput_objective_needs_a_confirmed_advantage(tmp_path) -> None:
    limit = 2048 * MiB
    budget = int(limit * 0.9)

    class Flaky(BentDevice):
        """The smaller batch looks 3x faster once, then measures like the largest."""

        first = True

        def probe(self, point: dict, phases: tuple) -> dict[str, Any]:
            result = super().probe(point, phases)
            if phases == ("train",) and result["status"] == "ok":
                fast_once = self.first and point["num_patches_per_iter"] < 30
                result["samples_per_s"] = 30.0 if fast_once else 10.0
                self.first = self.first and not fast_once
            return result

    flaky = Flaky(limit)
    outcome = _search(_study(tmp_path, "flaky"), flaky, budget, "throughput")
    assert outcome.num_patches_per_iter == outcome.max_num_patches_per_iter, "noise did not survive the repeat"
    # a device where the smaller batch is truly 2x faster: it wins, after repeating both points
    fast_small = BentDevice(limit, speed=lambda n: 100.0 if n < 30 else 50.0)
    fast_small.rng = random.Random(0)
    fast_small.rng.uniform = lambda a, b: 1.0  # type: ignore[method-assign]
    outcome = _search(_study(tmp_path, "small"), fast_small, budget, "throughput")
    assert outcome.num_patches_per_iter == outcome.max_num_patches_per_iter // 2
    probes = _train_probes(fast_small)
    assert probes.count(outcome.num_patches_per_iter) == 2 and probes.count(outcome.max_num_patches_per_iter) == 2


def test_max_batch_ignores_timings() -> None:
    class E:
        def __init__(self, n: int, speed: float) -> None:
            self.point, self.phases, self.feasible = {"num_patches_per_iter": n}, ("train",), True
            self.result = {"samples_per_s": speed}

    evaluations = [E(4, 100.0), E(8, 1.0)]
    assert choose(evaluations, lambda e: e.point["num_patches_per_iter"], "max-batch").point["num_patches_per_iter"] == 8
    # throughput without a way to repeat a measurement never trusts one timing
    assert choose(evaluations, lambda e: e.point["num_patches_per_iter"], "throughput").point[
        "num_patches_per_iter"] == 8


def test_correction_fixes_scale_and_offset_not_shape() -> None:
    device = BentDevice(10**12)
    base = EstimatedCurve(device.true_train)
    measured = {n: int(1.1 * device.true_train(n) + 100 * MiB) for n in (20, 21)}
    fixed = correct(base, measured, 21)
    assert isinstance(fixed, CorrectedCurve)
    assert fixed.scale == pytest.approx(1.1, rel=1e-3) and fixed.offset == pytest.approx(100 * MiB, rel=1e-2)
    assert fixed.predict(60) == pytest.approx(1.1 * device.true_train(60) + 100 * MiB, rel=1e-3)
    asked: list[int] = []
    counting = EstimatedCurve(lambda n: asked.append(n) or device.true_train(n))
    edge = largest_under(counting, 1, 64, device.true_train(40))
    assert edge == 40 and len(set(asked)) <= 8, "bisection over the estimates, not a scan"


def test_objective_is_in_the_key_and_named_on_the_study(tmp_path) -> None:
    from config_fixtures import bundle_config

    from autotune.search.storage.study import make_key, open_storage, open_study

    cfg = bundle_config()
    info = {"device_name": "cpu", "device_total_memory": 8 * 1024**3}
    keys = {obj: make_key(cfg, info, 1024**3, "fast", obj) for obj in ("max-batch", "throughput")}
    assert keys["max-batch"].study_name != keys["throughput"].study_name
    assert keys["throughput"].as_dict()["objective"] == "throughput"
    study = open_study(open_storage(f"sqlite:///{tmp_path / 'k.db'}"), keys["throughput"],
                       metric=metric_name("throughput"))
    assert study.metric_names == [metric_name("throughput")]


def test_dashboard_story_names_the_objective_and_plots_each_phase(tmp_path) -> None:
    pytest.importorskip("optuna_dashboard")
    import json

    from optuna_dashboard import get_note

    from autotune.search.curves.key_curves import estimates_attr
    from autotune.search.dashboard.notes import tell_story

    limit = 2048 * MiB
    budget = int(limit * 0.9)
    study = _study(tmp_path)
    device = BentDevice(limit)
    outcome = _search(study, device, budget)
    study.set_user_attr(estimates_attr("train"), {str(n): int(device.true_train(n)) for n in (1, 32, 48, 56)})
    record = {"algo": "unet", "status": "tuned", "objective": "max-batch", "strategy": "fast",
              "memory_limit": limit, "budget_bytes": budget, "margin": 0.1, "peak_bytes": 1,
              "num_patches_per_iter": outcome.num_patches_per_iter,
              "max_num_patches_per_iter": outcome.max_num_patches_per_iter,
              "num_sw_batch_size": outcome.num_sw_batch_size, "validation_device": "device"}
    assert tell_story(study, record)
    note = get_note(study)
    assert "max-batch" in note and f"{outcome.num_patches_per_iter} patches per iteration" in note
    assert "Real train probes (2)" in note
    plots = {k: v for k, v in study._storage.get_study_system_attrs(study._study_id).items() if "autotune-" in k and "-memory" in k}
    assert any("train" in k for k in plots) and any("infer" in k for k in plots)
    train_plot = json.loads("".join(v for k, v in sorted(plots.items()) if "train" in k))
    names = [trace["name"] for trace in train_plot["data"]]
    assert names[:2] == ["estimate (no compute)", "probe: fits"] and "budget" in names
    budget_trace = next(trace for trace in train_plot["data"] if trace["name"] == "budget")
    assert budget_trace["y"][0] == pytest.approx(budget / MiB, rel=1e-4)


def test_note_names_the_best_trial_and_the_handoff(tmp_path) -> None:
    """Where the hand-off gives training less than the largest fit, the training study's note says that the
    best trial is the largest fit (with its trial) and why training gets another batch (with the trial that
    measured it)."""
    from autotune.search.dashboard.notes import story_note

    study = _study(tmp_path)
    record = {"algo": "unet", "status": "tuned", "objective": "max-batch", "strategy": "fast",
              "memory_limit": 64 * MiB, "budget_bytes": 57 * MiB, "margin": 0.1, "peak_bytes": 50 * MiB,
              "num_patches_per_iter": 2, "max_num_patches_per_iter": 13, "num_sw_batch_size": 27,
              "validation_device": "device", "train_trial": 1, "infer_trial": 0,
              "handoff": {"rule": "goodput", "handed": 2, "largest_fit_trial": 0,
                          "line": "samples/s at 2: 38.9, at 13: 62.8 -> hand over 2"}}
    note = story_note(study, record)
    assert "the best trial is the value written back** (trial #0: the largest fit, N = 13)" in note
    assert "Training gets **N = 2**, not the largest fit 13, by the hand-off rule (goodput): samples/s at 2" in note
    assert "(measured in trial #1)" in note
