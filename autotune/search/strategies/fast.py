"""The ``fast`` strategy (and ``estimate``, the same search answered by the estimator alone).

The largest N the estimator puts under the budget is found by bisection over the estimator's
answers, then probed, then N+1 to confirm the edge (``autotune.search.strategies.edge_search``).
Then the sliding-window batch the same way, with inference-only probes (training's peak at N is
measured and fits, and validation runs with the model, gradients and optimizer state alive, so
the combined peak is max(train, infer)), for the validation volume held on the device first
(fastest) and on the CPU only when nothing fits on the device. The choice among the points that
fit follows the objective (``autotune.search.strategies.objective``): the largest batch (default),
or with ``throughput`` one smaller candidate (N/2) races the largest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from autotune.search.curves.bound import PROBE_EDGE_ENV, probe_edge_forced
from autotune.search.strategies.edge_search import find_max_feasible
from autotune.search.strategies.evaluate import Evaluation, Evaluator
from autotune.search.strategies.objective import DEFAULT_OBJECTIVE, choose
from autotune.search.strategies.outcome import SearchOutcome

__all__ = ["edge_check", "run_fast"]


class _Measured:
    """Evaluates points through ``evaluator`` and keeps every evaluation for the outcome."""

    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator
        self.evaluations: list[Evaluation] = []

    def point(self, point: dict[str, Any], phases: tuple[str, ...], repeat: int = 0) -> Evaluation:
        evaluation = self.evaluator.evaluate(point, phases, repeat=repeat)
        self.evaluations.append(evaluation)
        return evaluation

    def train(self, n: int, repeat: int = 0) -> Evaluation:
        return self.point({"num_patches_per_iter": n}, ("train",), repeat)

    def infer(self, n: int, device: str, m: int, repeat: int = 0) -> Evaluation:
        return self.point({"num_patches_per_iter": n, "num_sw_batch_size": m, "validation_device": device},
                          ("infer",), repeat)


def _largest_or_raced(evaluations: list[Evaluation], n_max: int, lo: int, objective: str, size: str,
                      evaluate: Callable[..., Evaluation]) -> Evaluation | None:
    """The chosen point among ``evaluations`` (with ``throughput``, N/2 races the largest fit N)."""
    if objective == "throughput" and max(lo, n_max // 2) < n_max:
        evaluations.append(evaluate(max(lo, n_max // 2)))
    return choose(evaluations, lambda e: e.point[size], objective,
                  lambda e: evaluate(e.point[size], repeat=1))


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
    """The fast search (see the module docstring); models are ``autotune.search.curves.edge.Curve``s.

    ``bound``: a calibration's stated over-prediction bound (``find_max_feasible``); the points it settles
    go to ``bounded["train"]`` / ``bounded["infer"]``."""
    bounded = bounded if bounded is not None else {}
    budget = evaluator.budget_bytes
    measured = _Measured(evaluator)
    lo, hi = spec.patches_range
    n_max, train_evals = find_max_feasible(measured.train, lo, hi, train_model, budget, bound,
                                           bounded.setdefault("train", []))
    best_train = None if n_max is None else _largest_or_raced(
        train_evals, n_max, lo, objective, "num_patches_per_iter", measured.train)
    if best_train is None:
        return SearchOutcome.nothing(measured.evaluations)
    n = int(best_train.point["num_patches_per_iter"])
    sw_lo, sw_hi = spec.sw_range
    for device in validation_devices:
        def evaluate_sw(m: int, repeat: int = 0, device: str = device) -> Evaluation:
            return measured.infer(n, device, m, repeat)

        infer_model = infer_model_for(n, device)
        cap = getattr(infer_model, "cap", None)
        top = max(sw_lo, min(sw_hi, int(cap))) if cap else sw_hi  # past the windows a batch holds no more
        m_max, sw_evals = find_max_feasible(evaluate_sw, sw_lo, top, infer_model, budget, bound,
                                            bounded.setdefault("infer", []))
        best_sw = None if m_max is None else _largest_or_raced(
            sw_evals, m_max, sw_lo, objective, "num_sw_batch_size", evaluate_sw)
        if best_sw is not None:
            return SearchOutcome.of_points(n_max, best_train, best_sw, measured.evaluations)
    return SearchOutcome.of_points(n_max, best_train, None, measured.evaluations)


def edge_check(measured: bool, stated: Mapping[str, Any] | None, bounded: Mapping[str, list[int]]) -> dict[str, Any]:
    """How N+1 was settled per phase: probed, or by a calibration's stated bound; and why."""
    if not measured:
        return {"how": "estimated", "reason": "estimates only: N and N+1 are estimates, no probe"}
    check: dict[str, Any] = {phase: ({"n": ns[0], "how": "bounded", **(stated or {})} if ns else {"how": "probed"})
                             for phase, ns in bounded.items()}
    if probe_edge_forced():
        check["reason"] = f"{PROBE_EDGE_ENV} set: N+1 probed"
    elif not stated:
        check["reason"] = "no calibration stating an error bound for this device: N+1 probed"
    return check
