"""Search strategies: ``fast`` (estimate, confirm, bisect only when wrong) and ``tpe`` (baseline).

``fast``: two estimator passes give ``peak(N) = a + b*N``; the largest N under the
budget is probed, then N+1 to confirm the edge. Each real measurement corrects the
model (one point shifts its intercept, two fix its slope); a prediction that misses
twice falls back to bisection. Then the sliding-window batch size the same way (inference-only
probes: training's peak is already known to fit), for
the validation volume held on the device first (fastest) and on the CPU only when
nothing fits on the device. Among the points that fit, the highest throughput wins;
throughputs within ``TIE_TOLERANCE`` (10%) count as a tie and go to the larger batch.

``tpe``: Optuna's TPE over (patches per iteration, sw batch size, validation device)
with the specs' trial budget, as Auto3DSeg does, each trial probing both phases; the
objective is measured samples/s, subject to the memory constraint.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from autotune.search.evaluate import Evaluation, Evaluator

__all__ = ["TIE_TOLERANCE", "LinearModel", "find_max_feasible", "choose_best", "run_fast", "run_tpe", "SearchOutcome"]

TIE_TOLERANCE = 0.10  # timings closer than this are noise on a shared machine: prefer the larger batch


@dataclass
class LinearModel:
    """``peak(n) = intercept + slope * n`` in bytes; ``cap``: n past which memory stops growing
    (a sliding-window batch larger than the number of windows)."""

    intercept: float
    slope: float
    cap: int | None = None

    def predict(self, n: int) -> float:
        return self.intercept + self.slope * n

    def max_fitting(self, budget: float) -> int:
        if self.slope <= 0:
            return 10**9 if self.intercept <= budget else 0
        return int((budget - self.intercept) // self.slope)


def _as_linear(model: Any) -> LinearModel | None:
    if model is None:
        return None
    cap = getattr(model, "cap", None) or getattr(model, "n_cap", None)
    return LinearModel(float(model.intercept), float(model.slope), int(cap) if cap else None)


def _corrected(model: LinearModel | None, measured: dict[int, int]) -> LinearModel | None:
    """Correct an estimated model with real peaks: two points fix it, one shifts it."""
    if len(measured) >= 2:
        (n1, p1), (n2, p2) = sorted(measured.items())[-2:]
        slope = (p2 - p1) / (n2 - n1)
        if slope <= 0:  # measured flat: the batch is not what sets the peak here
            return LinearModel(float(max(p1, p2)), 0.0)
        return LinearModel(p2 - slope * n2, slope)
    if measured and model is not None:
        n, peak = max(measured.items())
        return LinearModel(peak - model.slope * n, model.slope)
    return model


def find_max_feasible(
    evaluate: Callable[[int], Evaluation],
    lo: int,
    hi: int,
    model: LinearModel | None,
    budget: int,
) -> tuple[int | None, list[Evaluation]]:
    """The largest n in [lo, hi] that fits, with as few evaluations as the model allows.

    The model's predicted maximum is probed first, then one above it. Each measurement
    corrects the model (one point shifts it, two fix its slope, a flat pair makes it flat);
    after two predictions that measurements contradict, it bisects (doubling while
    nothing above is known to fail), so a wrong model costs O(log range) probes.

    Returns:
        (largest feasible n or None when even ``lo`` does not fit, evaluations made)
    """
    lo_ok, hi_bad = lo - 1, hi + 1
    measured: dict[int, int] = {}
    evaluations: list[Evaluation] = []
    misses = 0
    current = model

    def predicted_edge(m: LinearModel | None) -> int | None:
        return None if m is None else min(max(m.max_fitting(budget), lo - 1), hi)

    while lo_ok + 1 < hi_bad:
        edge = predicted_edge(current)
        if misses >= 2 or edge is None:
            # bisection; doubling while nothing above is known to fail
            n = (lo_ok + hi_bad) // 2 if hi_bad <= hi else min(hi, max(lo, 2 * max(lo_ok, 1)))
            n = n if lo_ok < n < hi_bad else lo_ok + 1
        elif lo_ok < edge < hi_bad:
            n = edge  # the predicted maximum
        elif edge <= lo_ok:
            n = lo_ok + 1  # the model says lo_ok is the edge: confirm one above
        else:
            n = hi_bad - 1
        evaluation = evaluate(n)
        evaluations.append(evaluation)
        if evaluation.failed:  # a crash says nothing about memory: try the point once more
            evaluation = evaluate(n)
            evaluations.append(evaluation)
        if evaluation.feasible:
            lo_ok = n
        else:
            hi_bad = n
        # a miss: the measurement contradicts the prediction it was made with
        if edge is not None and ((evaluation.feasible and n > edge) or (not evaluation.feasible and n <= edge)):
            misses += 1
        if evaluation.status == "ok" and evaluation.peak_bytes:
            measured[n] = int(evaluation.peak_bytes)
        current = _corrected(model, measured)
    return (lo_ok if lo_ok >= lo else None), evaluations


def choose_best(evaluations: list[Evaluation], size_key: str) -> Evaluation | None:
    """Highest throughput among feasible points; within ``TIE_TOLERANCE``, the larger batch."""
    feasible = [e for e in evaluations if e.feasible]
    if not feasible:
        return None
    top = max(e.value for e in feasible)
    near = [e for e in feasible if e.value >= top * (1 - TIE_TOLERANCE)]
    return max(near, key=lambda e: (e.point.get(size_key, 0), e.value))


@dataclass
class SearchOutcome:
    """What a strategy found."""

    num_patches_per_iter: int | None
    max_num_patches_per_iter: int | None
    num_sw_batch_size: int | None
    validation_device: str | None
    train: Evaluation | None
    infer: Evaluation | None
    evaluations: list[Evaluation]


def run_fast(
    evaluator: Evaluator,
    spec: Any,
    validation_devices: tuple[str, ...],
    train_model: Any,
    infer_model_for: Callable[[int, str], Any],
) -> SearchOutcome:
    """The default strategy; see the module docstring."""
    budget = evaluator.budget_bytes
    lo, hi = spec.patches_range
    n_max, train_evals = find_max_feasible(
        lambda n: evaluator.evaluate({"num_patches_per_iter": n}, ("train",)), lo, hi, _as_linear(train_model), budget
    )
    evaluations = list(train_evals)
    best_train = choose_best(train_evals, "num_patches_per_iter")
    if n_max is None or best_train is None:
        return SearchOutcome(None, None, None, None, None, None, evaluations)
    n = int(best_train.point["num_patches_per_iter"])
    sw_lo, sw_hi = spec.sw_range
    for device in validation_devices:
        def evaluate_sw(m: int, device: str = device) -> Evaluation:
            # the training peak at n is measured and fits; validation runs with the model,
            # gradients and optimizer state alive (the probe creates them), so the combined peak
            # is max(train, infer) and only the inference pass needs measuring
            point = {"num_patches_per_iter": n, "num_sw_batch_size": m, "validation_device": device}
            return evaluator.evaluate(point, ("infer",))

        infer_model = _as_linear(infer_model_for(n, device))
        # past the number of windows a larger batch holds no more memory (and gains nothing)
        top = max(sw_lo, min(sw_hi, infer_model.cap)) if infer_model is not None and infer_model.cap else sw_hi
        m_max, sw_evals = find_max_feasible(evaluate_sw, sw_lo, top, infer_model, budget)
        evaluations += sw_evals
        best_sw = choose_best(sw_evals, "num_sw_batch_size")
        if m_max is not None and best_sw is not None:
            return SearchOutcome(
                n, n_max, int(best_sw.point["num_sw_batch_size"]), device, best_train, best_sw, evaluations
            )
    return SearchOutcome(n, n_max, None, None, best_train, None, evaluations)


def run_tpe(evaluator: Evaluator, spec: Any, validation_devices: tuple[str, ...], seed: int = 0) -> SearchOutcome:
    """The Auto3DSeg-style baseline: ``spec.num_trials`` TPE trials, each probing both phases."""
    import time

    from optuna.trial import TrialState

    study = evaluator.study
    finished = (TrialState.COMPLETE, TrialState.FAIL)
    evaluations: list[Evaluation] = []
    # count the study's trials on every pass: workers sharing the study share one budget
    while len(study.get_trials(deepcopy=False, states=(*finished, TrialState.RUNNING))) < spec.num_trials:
        trial = study.ask(evaluator.distributions)
        point = {
            "num_patches_per_iter": trial.params["num_patches_per_iter"],
            "num_sw_batch_size": trial.params["num_sw_batch_size"],
            "validation_device": trial.params["validation_device"],
        }
        evaluations.append(evaluator.evaluate(point, ("train", "infer"), trial=trial))
    # every worker chooses from the same trials: wait until none is running (a dead worker's
    # trial goes FAIL through its heartbeat or the stale sweep)
    from autotune.search.study import UNCLAIMED_AFTER, fail_stale_trials

    deadline = time.monotonic() + 2 * UNCLAIMED_AFTER
    while (
        evaluator.claims is not None
        and time.monotonic() < deadline
        and study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    ):
        fail_stale_trials(study)
        time.sleep(1.0)
    # the answer comes from every trial of the study, including those of an earlier run
    all_evals = [
        Evaluation(
            point={k: t.params[k] for k in ("num_patches_per_iter", "num_sw_batch_size", "validation_device")},
            phases=("train", "infer"),
            status=str(t.user_attrs.get("status")),
            feasible=t.user_attrs.get("status") == "ok" and all(v <= 0 for v in t.constraints.values()),
            peak_bytes=t.user_attrs.get("peak_bytes"),
            value=float(t.value or 0.0),
            trial_number=t.number,
            reused=False,
            result=dict(t.user_attrs),
        )
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if "num_sw_batch_size" in t.params
    ]
    feasible = [e for e in all_evals if e.feasible]
    if not feasible:
        return SearchOutcome(None, None, None, None, None, None, evaluations)
    top = max(e.value for e in feasible)
    near = [e for e in feasible if e.value >= top * (1 - TIE_TOLERANCE)]
    best = max(near, key=lambda e: (e.point["num_patches_per_iter"], e.point["num_sw_batch_size"], e.value))
    n_max = max(e.point["num_patches_per_iter"] for e in feasible)
    return SearchOutcome(
        int(best.point["num_patches_per_iter"]),
        int(n_max),
        int(best.point["num_sw_batch_size"]),
        str(best.point["validation_device"]),
        best,
        best,
        evaluations,
    )


def distributions(spec: Any, validation_devices: tuple[str, ...]) -> Mapping[str, Any]:
    """Optuna distributions of the search space (for trials and the dashboard)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    return {
        "num_patches_per_iter": IntDistribution(*spec.patches_range),
        "num_sw_batch_size": IntDistribution(*spec.sw_range),
        "validation_device": CategoricalDistribution(list(validation_devices)),
    }
