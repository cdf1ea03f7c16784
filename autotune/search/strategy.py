"""Search strategies: ``fast`` (estimate, confirm, bisect only when wrong) and ``tpe`` (baseline).

``fast``: the largest N the estimator puts under the budget is found by bisection over
the estimator's answers (``autotune.search.edge``), then probed, then N+1 to confirm the
edge. Each real measurement corrects the device allowance (scale and offset of the
estimate), not the curve's shape; a prediction that misses twice falls back to bisection
on real probes. Then the sliding-window batch size the same way (inference-only probes:
training's peak is already known to fit), for the validation volume held on the device
first (fastest) and on the CPU only when nothing fits on the device. The choice among the
points that fit follows the objective (``autotune.search.objective``): the largest batch
(default), or with ``throughput`` one smaller candidate (N/2) races the largest.

``tpe``: Optuna's TPE over (patches per iteration, sw batch size, validation device)
with the specs' trial budget, as Auto3DSeg does, each trial probing both phases and
valued by the objective, subject to the memory constraint.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from autotune.search.edge import find_max_feasible
from autotune.search.evaluate import Evaluation, Evaluator
from autotune.search.objective import DEFAULT_OBJECTIVE, TIE_TOLERANCE, choose

__all__ = ["TIE_TOLERANCE", "find_max_feasible", "choose_best", "run_fast", "run_tpe", "SearchOutcome"]


def choose_best(evaluations: list[Evaluation], size_key: str, objective: str = DEFAULT_OBJECTIVE) -> Evaluation | None:
    """The chosen feasible point of one phase (see ``autotune.search.objective``; no repeats)."""
    return choose(evaluations, lambda e: e.point.get(size_key, 0), objective)


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
    objective: str = DEFAULT_OBJECTIVE,
    bound: float | None = None,
    bounded: dict[str, list[int]] | None = None,
) -> SearchOutcome:
    """The default strategy; see the module docstring. Models are ``autotune.search.edge.Curve``s.

    ``bound``: a calibration's stated over-prediction bound (``find_max_feasible``): the check one above
    the edge is settled without a probe where the estimate exceeds the budget by more; the points so
    settled go to ``bounded["train"]`` / ``bounded["infer"]``."""
    bounded = bounded if bounded is not None else {}
    budget = evaluator.budget_bytes
    lo, hi = spec.patches_range
    evaluations: list[Evaluation] = []

    def measured(point: dict[str, Any], phases: tuple[str, ...], repeat: int = 0) -> Evaluation:
        evaluation = evaluator.evaluate(point, phases, repeat=repeat)
        evaluations.append(evaluation)
        return evaluation

    def train(n: int, repeat: int = 0) -> Evaluation:
        return measured({"num_patches_per_iter": n}, ("train",), repeat)

    n_max, train_evals = find_max_feasible(train, lo, hi, train_model, budget, bound, bounded.setdefault("train", []))
    if n_max is None:
        return SearchOutcome(None, None, None, None, None, None, evaluations)
    if objective == "throughput" and max(lo, n_max // 2) < n_max:  # one smaller candidate to race the largest
        train_evals.append(train(max(lo, n_max // 2)))
    best_train = choose(train_evals, lambda e: e.point["num_patches_per_iter"], objective,
                        lambda e: train(e.point["num_patches_per_iter"], repeat=1))
    if best_train is None:
        return SearchOutcome(None, None, None, None, None, None, evaluations)
    n = int(best_train.point["num_patches_per_iter"])
    sw_lo, sw_hi = spec.sw_range
    for device in validation_devices:
        def evaluate_sw(m: int, device: str = device, repeat: int = 0) -> Evaluation:
            # the training peak at n is measured and fits; validation runs with the model,
            # gradients and optimizer state alive (the probe creates them), so the combined peak
            # is max(train, infer) and only the inference pass needs measuring
            point = {"num_patches_per_iter": n, "num_sw_batch_size": m, "validation_device": device}
            return measured(point, ("infer",), repeat)

        infer_model = infer_model_for(n, device)
        cap = getattr(infer_model, "cap", None)
        # past the number of windows a larger batch holds no more memory (and gains nothing)
        top = max(sw_lo, min(sw_hi, int(cap))) if cap else sw_hi
        m_max, sw_evals = find_max_feasible(evaluate_sw, sw_lo, top, infer_model, budget, bound,
                                            bounded.setdefault("infer", []))
        if m_max is None:
            continue
        if objective == "throughput" and max(sw_lo, m_max // 2) < m_max:
            sw_evals.append(evaluate_sw(max(sw_lo, m_max // 2)))
        best_sw = choose(sw_evals, lambda e: e.point["num_sw_batch_size"], objective,
                         lambda e, device=device: evaluate_sw(e.point["num_sw_batch_size"], device, repeat=1))
        if best_sw is not None:
            return SearchOutcome(
                n, n_max, int(best_sw.point["num_sw_batch_size"]), device, best_train, best_sw, evaluations
            )
    return SearchOutcome(n, n_max, None, None, best_train, None, evaluations)


def run_tpe(evaluator: Evaluator, spec: Any, validation_devices: tuple[str, ...], seed: int = 0,
            objective: str = DEFAULT_OBJECTIVE) -> SearchOutcome:
    """The Auto3DSeg-style baseline: ``spec.num_trials`` TPE trials, each probing both phases."""
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
    evaluator.wait_for_others()  # every worker chooses from the same trials
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
    best = choose(feasible, lambda e: (e.point["num_patches_per_iter"], e.point["num_sw_batch_size"]), objective,
                  lambda e: evaluator.evaluate(e.point, ("train", "infer"), repeat=1))
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
