"""At most three estimator passes per curve, the answer still exact; the N+1 probe skipped only
under a calibration that states its error bound.

The simulated device of ``test_search_edge`` (peak not affine in N), with the estimator
counted: a ``SparseCurve`` spends at most ``MAX_PASSES`` estimates per phase, the search
still ends on N that fits and N+1 that does not, and a loader batch of lcm(N, crops)
patches (a step an affine fit in N cannot see) is read exactly.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.probe.calibration import stated_bound
from autotune.search.curves.sparse import MAX_PASSES, SparseCurve, passes_of
from autotune.search.strategies.edge_search import find_max_feasible
from autotune.search.strategies.evaluate import Evaluator
from autotune.search.strategies.fast import run_fast
from autotune.search.strategies.outcome import distributions
from autotune.search.strategies.space import AlgoSpec

optuna.logging.set_verbosity(optuna.logging.WARNING)

MiB = 1024**2
SPEC = AlgoSpec(patches_range=(1, 64), sw_range=(1, 32))


class Device:
    """peak(n) = base + a*n + b*n^2 + two loader batches of lcm(n, crops) patches; the estimator is exact."""

    measured = True

    def __init__(self, crops: int = 1, scale: float = 1.0, patch: float = 0.1 * MiB, bend: float = 0.14) -> None:
        # patch: bytes of one loader-batch patch (image + label); small enough that peak grows with n
        self.crops, self.scale, self.patch, self.bend = crops, scale, patch, bend
        self.calls: list[tuple[dict, tuple]] = []
        self.asked: dict[str, list[int]] = {"train": [], "infer": []}

    def loader(self, n: int) -> float:
        return 2.0 * math.lcm(n, self.crops) * self.patch

    def true_train(self, n: int) -> float:
        return 300 * MiB + 20 * MiB * n + self.bend * MiB * n * n + self.loader(n)

    def true_infer(self, m: int) -> float:
        return 500 * MiB + 9 * MiB * m + 0.05 * MiB * m * m

    def budget_ok(self, raw: float, budget: int) -> bool:
        return raw * self.scale <= budget

    def probe(self, point: dict, phases: tuple) -> dict[str, Any]:
        self.calls.append((dict(point), tuple(phases)))
        raw = self.true_infer(point["num_sw_batch_size"]) if "infer" in phases else \
            self.true_train(point["num_patches_per_iter"])
        peak = int(raw * self.scale)
        if peak > self.limit:
            return {"status": "oom", "peak_bytes": self.limit}
        return {"status": "ok", "peak_bytes": peak, "samples_per_s": 1.0, "sw_seconds_per_volume": 1.0}

    def train_curve(self) -> SparseCurve:
        return SparseCurve(lambda n: self.asked["train"].append(n) or self.true_train(n), step_bytes=self.loader)

    def infer_curve(self, n: int, validation_device: str) -> SparseCurve:
        return SparseCurve(lambda m: self.asked["infer"].append(m) or self.true_infer(m), cap=None)


def _search(tmp_path: Path, device: Device, budget: int, bound: float | None = None) -> tuple[Any, Any, dict]:
    device.limit = budget
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'studies.db'}")
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    evaluator = Evaluator(study, device, budget, distributions(SPEC, ("device",)), storage=storage)
    curves: list[Any] = []

    def infer_for(n: int, vd: str) -> Any:
        curves.append(device.infer_curve(n, vd))
        return curves[-1]

    train = device.train_curve()
    bounded: dict[str, list[int]] = {}
    outcome = run_fast(evaluator, SPEC, ("device",), train, infer_for, bound=bound, bounded=bounded)
    passes = {"train": passes_of(train), "infer": sum(passes_of(c) for c in curves)}
    return outcome, passes, bounded


def _true_max(peak: Any, budget: int, hi: int) -> int:
    return max(n for n in range(1, hi + 1) if peak(n) <= budget)


def _train_probes(device: Device) -> list[int]:
    return [c[0]["num_patches_per_iter"] for c in device.calls if c[1] == ("train",)]


@pytest.mark.parametrize("crops", [1, 2])
@pytest.mark.parametrize("budget_mib", [700, 1100, 1600, 2300, 3400])
def test_at_most_three_estimator_passes_per_phase_and_the_edge_exact(tmp_path, crops: int, budget_mib: int) -> None:
    device = Device(crops)
    budget = budget_mib * MiB
    outcome, passes, bounded = _search(tmp_path, device, budget)
    assert passes["train"] <= MAX_PASSES and passes["infer"] <= MAX_PASSES, passes
    assert len(device.asked["train"]) == passes["train"] and len(device.asked["infer"]) == passes["infer"]
    n_true = _true_max(device.true_train, budget, 64)
    assert outcome.max_num_patches_per_iter == n_true
    probes = _train_probes(device)
    assert n_true in probes and (n_true == 64 or n_true + 1 in probes), probes  # N fits, N+1 does not: probed
    assert len(probes) <= 4, probes
    assert bounded == {"train": [], "infer": []}  # no bound given: nothing settled without a probe
    assert outcome.num_sw_batch_size == _true_max(device.true_infer, budget, 32)


def test_the_loader_step_is_read_exactly_between_estimates() -> None:
    device = Device(crops=4, patch=3 * MiB)
    curve = SparseCurve(device.true_train, step_bytes=device.loader)
    for n in (1, 32, 64):
        curve.spend(n)
    # a line through N = 1, 32 and 64 in N alone misses the lcm(N, 4) step; the interpolation of the rest does not
    for n in (2, 3, 5, 6):
        rest_error = abs(curve.predict(n) - device.true_train(n))
        assert rest_error < 0.2 * 20 * MiB * n, (n, rest_error / MiB)
    assert curve.passes == 3
    curve.predict(17)
    assert curve.passes == 3  # no pass left: read off the curve


def test_a_stated_bound_settles_n_plus_one_without_a_probe(tmp_path) -> None:
    # an affine rest: the two locating passes put the first probe on the edge, the kept pass reads N+1
    device = Device(bend=0.0)
    budget = int(device.true_train(20) + 2 * MiB)  # N = 20 fits, N + 1 is over by far more than 0.1%
    outcome, passes, bounded = _search(tmp_path, device, budget, bound=0.001)
    assert outcome.max_num_patches_per_iter == 20
    probes = _train_probes(device)
    assert 20 in probes and 21 not in probes, probes
    assert bounded["train"] == [21]
    assert passes["train"] <= MAX_PASSES and 21 in device.asked["train"]  # settled by an estimate


def test_without_a_bound_or_with_a_loose_one_n_plus_one_is_probed(tmp_path) -> None:
    for bound in (None, 0.5):  # 0.5: the estimate at 21 is not over the budget by 50%
        device = Device()
        budget = int(device.true_train(20) + 2 * MiB)
        (tmp_path / str(bound)).mkdir()
        outcome, _, bounded = _search(tmp_path / str(bound), device, budget, bound=bound)
        assert outcome.max_num_patches_per_iter == 20
        assert 21 in _train_probes(device)
        assert bounded["train"] == []


def test_find_max_feasible_probes_the_check_when_no_pass_is_left() -> None:
    device = Device()
    device.limit = budget = int(device.true_train(20) + 2 * MiB)
    curve = SparseCurve(device.true_train, step_bytes=device.loader, max_passes=0, known={1: device.true_train(1),
                                                                                         64: device.true_train(64)})
    asked: list[int] = []

    class Ev:
        def __init__(self, n: int) -> None:
            self.status = "ok" if device.true_train(n) <= budget else "oom"
            self.feasible, self.failed = self.status == "ok", False
            self.peak_bytes = int(device.true_train(n))

    bounded: list[int] = []
    n_max, _ = find_max_feasible(lambda n: asked.append(n) or Ev(n), 1, 64, curve, budget, 0.001, bounded)
    assert n_max == 20 and 21 in asked and bounded == []  # the bound holds for estimates, not interpolations


def test_stated_bound_needs_a_calibration_that_states_it(tmp_path) -> None:
    allowance = {"context_bytes": 0, "cudnn_workspace_bytes": 0, "allocator_slack_fraction": 0.1}
    with_fit = tmp_path / "a"
    with_fit.mkdir()
    (with_fit / "x.json").write_text(json.dumps({"gpu_name": "NVIDIA H100 80GB HBM3", "allowance": allowance,
                                                 "fit": {"max_over_prediction": 0.04, "points": 5}}))
    without = tmp_path / "b"
    without.mkdir()
    (without / "x.json").write_text(json.dumps({"gpu_name": "NVIDIA H100 80GB HBM3", "allowance": allowance}))
    found = stated_bound("NVIDIA H100 80GB HBM3", [with_fit])
    assert found is not None and found["bound"] == 0.04 and found["calibration"] == "x.json"
    assert stated_bound("NVIDIA H100 80GB HBM3", [without]) is None
    assert stated_bound("NVIDIA A100 40GB", [with_fit]) is None
    assert stated_bound(None, [with_fit]) is None


def test_one_pass_when_the_top_fits() -> None:
    from autotune.search.curves.edge import largest_under

    asked: list[int] = []
    curve = SparseCurve(lambda m: asked.append(m) or 500 * MiB + 9 * MiB * m, cap=8)
    assert largest_under(curve, 1, 32, 10**12) == 32  # past the cap memory stops growing
    assert asked == [8]


def test_a_bound_the_probe_at_n_contradicts_is_not_applied_above_it() -> None:
    # the device peaks 10% under the estimate: a bound of 0.1% is wrong here, and the probe at N shows it
    device = Device(bend=0.0, scale=0.9)
    budget = int(0.9 * device.true_train(20) + 2 * MiB)

    class Exact:  # the estimator's answer at every n (a replayed trace)
        cap = None

        def predict(self, n: int) -> float:
            return device.true_train(n)

    class Ev:
        def __init__(self, n: int) -> None:
            self.peak_bytes = int(0.9 * device.true_train(n))
            self.status = "ok"
            self.feasible, self.failed = self.peak_bytes <= budget, False

    asked: list[int] = []
    bounded: list[int] = []
    n_max, _ = find_max_feasible(lambda n: asked.append(n) or Ev(n), 1, 64, Exact(), budget, 0.001, bounded)
    assert n_max == _true_max(lambda m: 0.9 * device.true_train(m), budget, 64)
    assert n_max + 1 in asked and bounded == []
    # where the probe at N agrees with the bound, N+1 is settled from the estimate
    asked.clear()
    exact_budget = int(device.true_train(20) + 2 * MiB)

    class Agrees(Ev):
        def __init__(self, n: int) -> None:
            self.peak_bytes = int(device.true_train(n))
            self.status = "ok"
            self.feasible, self.failed = self.peak_bytes <= exact_budget, False

    n_max, _ = find_max_feasible(lambda n: asked.append(n) or Agrees(n), 1, 64, Exact(), exact_budget, 0.001, bounded)
    assert n_max == 20 and asked == [20] and bounded == [21]


class _Prober:
    """A prober whose estimator is ``Device``'s: one trace for training (with the sliding window's top folded
    in), point estimates for inference; every estimator pass counted."""

    measured = True

    def __init__(self, device: Device) -> None:
        self.device, self.passes = device, 0

    def config(self) -> Any:  # 96^3 in 32^3 windows at overlap 0.5: 125 windows
        from config_fixtures import bundle_config

        return bundle_config(roi_size=[32, 32, 32], infer_volume_shape=[96, 96, 96], sw_overlap=0.5)

    def training_replay(self, infer_point: dict | None) -> tuple[Any, int | None]:
        self.passes += 1

        class Exact:
            cap = None

            def predict(_, n: int) -> float:  # noqa: N805
                return self.device.true_train(n)

            def as_dict(_, lo: int, hi: int) -> dict[int, int]:  # noqa: N805
                return {n: int(self.device.true_train(n)) for n in range(lo, hi + 1)}

        infer = int(self.device.true_infer(infer_point["num_sw_batch_size"])) if infer_point else None
        assert infer_point is None or infer_point["num_sw_batch_size"] == 32  # the top of the range, under the cap
        return Exact(), infer

    def memory_curve(self, phase: str, point: dict, known: dict, on_estimate: Any, max_passes: int) -> Any:
        def estimate(m: int) -> float:
            self.passes += 1
            on_estimate(m, int(self.device.true_infer(m)))
            return float(int(self.device.true_infer(m)))

        return SparseCurve(estimate, 125, {int(k): float(v) for k, v in known.items()}, None, max_passes)


@pytest.mark.parametrize("budget_mib", [700, 900, 2000])
def test_at_most_three_estimator_passes_per_key(tmp_path, budget_mib: int) -> None:
    from autotune.search.curves.key_curves import search_curves

    device = Device()
    device.limit = budget = budget_mib * MiB
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'studies.db'}")
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    evaluator = Evaluator(study, device, budget, distributions(SPEC, ("device",)), storage=storage)
    prober = _Prober(device)
    curves = search_curves(study, prober, SPEC.patches_range, SPEC.sw_range, "device")
    outcome = run_fast(evaluator, SPEC, ("device",), curves.train, curves.infer_for)
    assert prober.passes == sum(curves.passes().values()) <= MAX_PASSES, curves.passes()
    assert curves.passes()["train"] == 1
    assert outcome.max_num_patches_per_iter == _true_max(device.true_train, budget, 64)
    assert outcome.num_sw_batch_size == _true_max(device.true_infer, budget, 32)
    if device.true_infer(32) <= budget:  # the top fits: the training trace's folded estimate was all
        assert prober.passes == 1
    # a resumed search reads the training curve from the study: no trace again
    again = _Prober(device)
    resumed = search_curves(study, again, SPEC.patches_range, SPEC.sw_range, "device")
    run_fast(Evaluator(study, device, budget, distributions(SPEC, ("device",)), storage=storage), SPEC, ("device",),
             resumed.train, resumed.infer_for)
    assert resumed.passes()["train"] == 0 and again.passes <= MAX_PASSES - 1


def test_the_bound_is_checked_at_n_only_against_an_estimate() -> None:
    from autotune.search.curves.bound import bound_held as _bound_held

    curve = SparseCurve(lambda m: 100.0 * m, known={1: 100.0, 10: 1000.0}, max_passes=0)
    assert _bound_held(curve, 1000, 10, 0.0) and not _bound_held(curve, 999, 10, 0.0)  # an estimate: checked
    assert _bound_held(curve, 1, 5, 0.0)  # read between estimates: nothing to check against, the bound stands
    assert not _bound_held(curve, None, 10, 0.5)  # no measurement at n: no bound
