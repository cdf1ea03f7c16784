"""The shipped search strategies, and the names the command line gives them, resolved here once.

- ``fast`` (``FastStrategy()``): bisection over the key's estimated curves, then probes at the edge
  (``autotune.search.strategies.fast``). One worker claims the key; the others wait for its
  stored result. Its goodput hand-off probe is timed (``autotune.search.handoff``).
- ``estimate`` (``FastStrategy(estimates_only=True)``): ``fast`` answered by the estimator alone: no probe, and
  the only strategy that plans for a GPU that is not here (``--target-gpu``).
- ``tpe`` (``TpeStrategy()``): MONAI Auto3DSeg's baseline (``autotune.search.strategies.tpe``): Optuna's TPE, its
  study shared point by point among the workers, one trial sizing both phases.

Each is a ``Strategy`` (``autotune.search.strategies.base``, the interface the search driver asks). ``tune`` takes
an object (``strategy=FastStrategy()``, or one's own subclass) or one of these names (``strategy_of``: the one
place a name becomes its object). No module outside this one compares a strategy's name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from autotune.errors import SpecError
from autotune.search.strategies.base import EdgeBound, KeyRun, Searched, Strategy
from autotune.search.strategies.space import AlgoSpec
from autotune.utils import look_up_option

if TYPE_CHECKING:  # pragma: no cover
    import optuna

__all__ = ["EdgeBound", "KeyRun", "Searched", "Strategy", "FastStrategy", "TpeStrategy", "STRATEGIES",
           "strategy_named", "strategy_of"]


@dataclass(frozen=True)
class FastStrategy(Strategy):
    """Bisection over the estimated curves, probes at the edge (``autotune.search.strategies.fast``);
    ``estimates_only``: every point answered by the estimator (``--strategy estimate``)."""

    estimates_only: bool = False
    name: ClassVar[str] = "fast"
    times_handoff: ClassVar[bool] = True

    def run(self, key: KeyRun) -> Searched:
        from autotune.search.curves.key_curves import search_curves
        from autotune.search.strategies.fast import edge_check, run_fast

        curves = search_curves(key.study, key.prober, key.spec.patches_range, key.spec.sw_range, key.devices[0])
        stated, unbound = key.edge()
        bounded: dict[str, list[int]] = {}
        outcome = run_fast(key.evaluator, key.spec, key.devices, curves.train, curves.infer_for, key.objective,
                           stated["bound"] if stated else None, bounded)
        for phase, ns in bounded.items():
            if ns and stated:
                key.say(f"[{key.label}] {phase}: {ns[0]} not probed: its estimate exceeds the budget by more "
                        f"than the bound {stated['bound']:.3%} ({stated['scope']}) stated by {stated['calibration']}")
        check = edge_check(key.prober.measured, stated, bounded)
        if unbound and key.prober.measured:
            check["reason"] = unbound
        return Searched(outcome, curves.train, {"estimator_passes": curves.passes(), "edge_check": check})


@dataclass(frozen=True)
class TpeStrategy(Strategy):
    """Optuna's TPE over both phases at once, the study shared point by point (``autotune.search.strategies.tpe``)."""

    estimates_only: bool = False
    name: ClassVar[str] = "tpe"
    shares_points: ClassVar[bool] = True
    joint: ClassVar[bool] = True

    def sampler(self, seed: int, spec: AlgoSpec, shared: bool) -> optuna.samplers.BaseSampler:
        import optuna

        if shared:  # workers sharing a study: different opening points, not the same ones
            seed += os.getpid()
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, spec.num_trials))

    def run(self, key: KeyRun) -> Searched:
        from autotune.search.strategies.tpe import run_tpe

        return Searched(run_tpe(key.evaluator, key.spec, key.devices, seed=key.seed, objective=key.objective))


#: the names ``--strategy`` takes, each the object it stands for
STRATEGIES: dict[str, Strategy] = {
    "fast": FastStrategy(),
    "tpe": TpeStrategy(),
    "estimate": FastStrategy(estimates_only=True),
}


def strategy_named(name: str) -> Strategy:
    """The strategy an option names.

    Raises:
        SpecError: no such strategy (the valid names are listed).
    """
    return STRATEGIES[look_up_option(name, list(STRATEGIES), "strategy", SpecError)]


def strategy_of(strategy: str | Strategy) -> Strategy:
    """The strategy ``tune(strategy=...)`` is given: a ``Strategy`` as it is, a name (``--strategy``) as the
    object it stands for.

    Raises:
        SpecError: an unknown name (the valid ones are listed), a ``Strategy`` without a name, or neither.
    """
    if isinstance(strategy, Strategy):
        if not isinstance(strategy.name, str) or not strategy.name.strip():
            raise SpecError(f"strategy {type(strategy).__name__}: its name must be a non-empty string, "
                            f"got {strategy.name!r}")
        return strategy
    if isinstance(strategy, str):
        return strategy_named(strategy)
    raise SpecError(f"strategy must be a name ({', '.join(STRATEGIES)}) or an autotune.search.strategies.Strategy, "
                    f"got {type(strategy).__name__}")
