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
from autotune.search.edge import find_max_feasible
from autotune.search.evaluate import Evaluator
from autotune.search.space import AlgoSpec
from autotune.search.sparse import MAX_PASSES, SparseCurve, passes_of
from autotune.search.strategy import distributions, run_fast

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
    from autotune.search.edge import largest_under

    asked: list[int] = []
    curve = SparseCurve(lambda m: asked.append(m) or 500 * MiB + 9 * MiB * m, cap=8)
    assert largest_under(curve, 1, 32, 10**12) == 32  # past the cap memory stops growing
    assert asked == [8]
