"""The search strategies behind one interface, looked up once from the option's name.

- ``fast``: bisection over the key's estimated curves, then probes at the edge
  (``autotune.search.strategies.fast``). One worker claims the key; the others wait for its
  stored result. Its goodput hand-off probe is timed (``autotune.search.handoff``).
- ``estimate``: ``fast`` answered by the estimator alone: no probe, and the only strategy that
  plans for a GPU that is not here (``--target-gpu``).
- ``tpe``: MONAI Auto3DSeg's baseline (``autotune.search.strategies.tpe``): Optuna's TPE, its
  study shared point by point among the workers, one trial sizing both phases.

The search driver asks a ``Strategy`` (``strategy_named``) what it needs: whether workers share
its study point by point or one claims the key, which study phase it keeps, its sampler, its
run on one key, whether it answers from estimates only, whether the hand-off's probe is timed,
and its label for messages. No module outside this one compares a strategy's name.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import SpecError
from autotune.search.strategies.evaluate import Evaluator
from autotune.search.strategies.outcome import SearchOutcome
from autotune.search.strategies.space import AlgoSpec
from autotune.utils import look_up_option

__all__ = ["KeyRun", "Searched", "Strategy", "STRATEGIES", "strategy_named"]

# (the calibration's stated bound on N+1 or None, why N+1 is probed anyway or None), asked only by ``fast``
EdgeBound = Callable[[], tuple[Mapping[str, Any] | None, str | None]]


@dataclass(frozen=True)
class KeyRun:
    """What a strategy runs on: one key's study, its evaluator and prober, the space and the objective.

    Attributes:
        edge: the calibration's stated bound for N+1 and, where N+1 is probed whatever a calibration
            says, the reason; called only by strategies that search an edge.
    """

    study: Any
    evaluator: Evaluator
    prober: Any
    spec: AlgoSpec
    devices: tuple[str, ...]
    objective: str
    seed: int
    label: str
    say: Callable[[str], None]
    edge: EdgeBound


@dataclass
class Searched:
    """A strategy's answer: the outcome, the estimator's training curve (or None) and the record's extra fields."""

    outcome: SearchOutcome
    train_curve: Any = None
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Strategy:
    """A search strategy.

    Attributes:
        name: the option's name (``--strategy``).
        search: the name its studies and stored results are keyed by (``estimate`` is ``fast``'s search).
        estimates_only: every point answered by the estimator, no probe.
        shares_points: workers share its study point by point (else one worker claims the key).
        joint: one trial sizes both phases in the key's own study (else training there, inference
            in a sibling study).
        times_handoff: the goodput hand-off's probe at the reference batch is timed here (with real probes).
    """

    name: str
    search: str
    estimates_only: bool = False
    shares_points: bool = False
    joint: bool = False
    times_handoff: bool = False

    @property
    def key_name(self) -> str:
        """The strategy in the tuning key (``autotune.search.storage.study.make_key``)."""
        return self.search + ("-estimate" if self.estimates_only else "")

    @property
    def label(self) -> str:
        """How messages name it."""
        return self.search + (" (estimates only)" if self.estimates_only else "")

    @property
    def phase(self) -> str:
        """The phase of the key's own study (``autotune.search.storage.study.open_study``)."""
        return "joint" if self.joint else "train"

    @property
    def claims_key(self) -> bool:
        """One worker claims the key and the others wait for its stored result."""
        return not self.shares_points

    def estimated(self) -> Strategy:
        """This search answered by the estimator alone."""
        return dataclasses.replace(self, estimates_only=True)

    def sampler(self, seed: int, spec: AlgoSpec, shared: bool) -> Any:
        """The Optuna sampler of the key's study (None: Optuna's default; points are enqueued by the search)."""
        return None

    def run(self, key: KeyRun) -> Searched:
        """Search one key."""
        raise NotImplementedError


@dataclass(frozen=True)
class FastStrategy(Strategy):
    """Bisection over the estimated curves, probes at the edge (``autotune.search.strategies.fast``)."""

    times_handoff: bool = True

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

    shares_points: bool = True
    joint: bool = True

    def sampler(self, seed: int, spec: AlgoSpec, shared: bool) -> Any:
        import optuna

        if shared:  # workers sharing a study: different opening points, not the same ones
            seed += os.getpid()
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, spec.num_trials))

    def run(self, key: KeyRun) -> Searched:
        from autotune.search.strategies.tpe import run_tpe

        return Searched(run_tpe(key.evaluator, key.spec, key.devices, seed=key.seed, objective=key.objective))


STRATEGIES: dict[str, Strategy] = {
    "fast": FastStrategy("fast", "fast"),
    "tpe": TpeStrategy("tpe", "tpe"),
    "estimate": FastStrategy("estimate", "fast", estimates_only=True),
}


def strategy_named(name: str) -> Strategy:
    """The strategy an option names.

    Raises:
        SpecError: no such strategy (the valid names are listed).
    """
    return STRATEGIES[look_up_option(name, list(STRATEGIES), "strategy", SpecError)]
