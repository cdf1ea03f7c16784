"""The ``tpe`` strategy: the MONAI Auto3DSeg baseline.

Optuna's TPE over (patches per iteration, sliding-window batch, validation device) with the
specs' trial budget, as Auto3DSeg does, each trial probing both phases and valued by the
objective, subject to the memory constraint. The answer comes from every trial of the study,
including those of an earlier run and of other workers sharing it.
"""

from __future__ import annotations

from autotune.search.strategies.evaluate import Evaluation, Evaluator
from autotune.search.strategies.objective import DEFAULT_OBJECTIVE, choose
from autotune.search.strategies.outcome import SearchOutcome
from autotune.tunables import TUNABLES

__all__ = ["run_tpe"]

_POINT = tuple(t.name for t in TUNABLES)


def _ask_until_budget(evaluator: Evaluator, num_trials: int) -> list[Evaluation]:
    """Ask and evaluate TPE points until the study holds ``num_trials`` (workers share one budget)."""
    from optuna.trial import TrialState

    study = evaluator.study
    counted = (TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING)
    evaluations: list[Evaluation] = []
    while len(study.get_trials(deepcopy=False, states=counted)) < num_trials:
        trial = study.ask(evaluator.distributions)
        point = {name: trial.params[name] for name in _POINT}
        evaluations.append(evaluator.evaluate(point, ("train", "infer"), trial=trial))
    return evaluations


def run_tpe(evaluator: Evaluator, spec: object, validation_devices: tuple[str, ...], seed: int = 0,
            objective: str = DEFAULT_OBJECTIVE) -> SearchOutcome:
    """``spec.num_trials`` TPE trials, each probing both phases; the chosen point of all the study's trials."""
    from optuna.trial import TrialState

    evaluations = _ask_until_budget(evaluator, int(spec.num_trials))  # type: ignore[attr-defined]
    evaluator.wait_for_others()  # every worker chooses from the same trials
    trials = evaluator.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    feasible = [e for e in (Evaluation.from_trial(t, {k: t.params[k] for k in _POINT}, ("train", "infer"))
                            for t in trials if "num_sw_batch_size" in t.params) if e.feasible]
    if not feasible:
        return SearchOutcome.nothing(evaluations)
    best = choose(feasible, lambda e: (e.point["num_patches_per_iter"], e.point["num_sw_batch_size"]), objective,
                  lambda e: evaluator.evaluate(e.point, ("train", "infer"), repeat=1))
    n_max = max(e.point["num_patches_per_iter"] for e in feasible)
    return SearchOutcome.of_points(int(n_max), best, best, evaluations)  # every tunable from the chosen point
