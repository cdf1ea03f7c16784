"""The search strategy's interface: what the search driver asks of a strategy, as Optuna asks a ``BaseSampler``.

A strategy is an object: ``autotune.tune(bundles, strategy=FastStrategy())`` runs the object it is given, and the
names the command line takes (``--strategy fast``) resolve to the shipped objects in one place
(``autotune.search.strategies.registry``). A strategy of one's own subclasses ``Strategy``: its ``name`` (its
studies and stored results are keyed by it) and its ``run`` on one key (``KeyRun``: the key's study, the evaluator
that turns a point into a trial, the prober, the space, the objective), which returns what it found
(``Searched``); the class attributes say how the driver runs it (whether workers share its study point by point
or one claims the key, whether one trial sizes both phases, its sampler, whether it answers from estimates only,
whether the hand-off's probe is timed). ``tests/search/test_strategy_object.py`` passes one defined in the test
to ``tune``.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autotune.search.strategies.evaluate import Evaluator
from autotune.search.strategies.outcome import SearchOutcome
from autotune.search.strategies.space import AlgoSpec

if TYPE_CHECKING:  # pragma: no cover
    import optuna

    from autotune.search.curves.edge import Curve
    from autotune.search.curves.probers import Prober

__all__ = ["EdgeBound", "KeyRun", "Searched", "Strategy"]

# (the calibration's stated bound on N+1 or None, why N+1 is probed anyway or None), asked only by ``fast``
EdgeBound = Callable[[], tuple[Mapping[str, Any] | None, str | None]]


@dataclass(frozen=True)
class KeyRun:
    """What a strategy runs on: one key's study, its evaluator and prober, the space and the objective.

    Attributes:
        study: the key's own Optuna study (its phase is ``Strategy.phase``).
        evaluator: evaluates a point (``evaluate(point, phases)``) as a trial of the study of its phases, reusing
            a point the study holds; the strategy's points go through it.
        prober: what answers a point (a real probe, the estimator, the fake probe of the tests) and the
            estimator's curves (``autotune.search.curves.probers.Prober``).
        spec: the key's search space (``AlgoSpec``: the ranges, the trial budget, the validation devices).
        devices: the validation devices tried, in order.
        objective: ``max-batch`` or ``throughput`` (``autotune.search.strategies.objective``).
        seed: the bundle's seed.
        label: how messages name the key (its algorithm).
        say: prints one progress line.
        edge: the calibration's stated bound for N+1 and, where N+1 is probed whatever a calibration
            says, the reason; called only by strategies that search an edge.
    """

    study: optuna.Study
    evaluator: Evaluator
    prober: Prober
    spec: AlgoSpec
    devices: tuple[str, ...]
    objective: str
    seed: int
    label: str
    say: Callable[[str], None]
    edge: EdgeBound


@dataclass
class Searched:
    """A strategy's answer: the outcome, the estimator's training curve (or None) and the record's extra fields.

    ``fields`` go into the key's record and so into the bundle's ``tuning:`` block: each must be a key the block
    holds (``autotune.bundles.plan.TuningPlan``: ``fast`` gives ``estimator_passes`` and ``edge_check``); the
    write-back refuses another."""

    outcome: SearchOutcome
    train_curve: Curve | None = None
    fields: dict[str, Any] = field(default_factory=dict)


class Strategy(abc.ABC):
    """A search strategy: a subclass gives its ``name`` and its ``run`` on one key.

    Attributes (class attributes; a subclass or an instance sets its own):
        estimates_only: every point answered by the estimator, no probe (``estimated()`` gives the same search so).
        shares_points: workers share its study point by point (else one worker claims the key and the others
            wait for its stored result).
        joint: one trial sizes both phases in the key's own study (else training there, inference in a sibling
            study).
        times_handoff: the goodput hand-off's probe at the reference batch is timed here (with real probes).
    """

    estimates_only: bool = False
    shares_points: bool = False
    joint: bool = False
    times_handoff: bool = False

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """The search's name: its studies and stored results are keyed by it (``key_name``), and the record and
        the bundle's ``tuning:`` block name it. Two strategies that search differently need two names."""

    @abc.abstractmethod
    def run(self, key: KeyRun) -> Searched:
        """Search one key: evaluate points with ``key.evaluator`` and return what was found (an outcome with no
        answer, ``SearchOutcome.nothing``, when even the smallest batch does not fit)."""

    def sampler(self, seed: int, spec: AlgoSpec, shared: bool) -> optuna.samplers.BaseSampler | None:
        """The Optuna sampler of the key's study (None: Optuna's default; the points are the strategy's own).
        ``shared``: workers share the study (their samplers should start apart)."""
        return None

    @property
    def key_name(self) -> str:
        """The strategy in the tuning key (``autotune.search.storage.study.make_key``)."""
        return self.name + ("-estimate" if self.estimates_only else "")

    @property
    def label(self) -> str:
        """How messages name it."""
        return self.name + (" (estimates only)" if self.estimates_only else "")

    @property
    def phase(self) -> str:
        """The phase of the key's own study (``autotune.search.storage.study.open_study``)."""
        return "joint" if self.joint else "train"

    @property
    def claims_key(self) -> bool:
        """One worker claims the key and the others wait for its stored result."""
        return not self.shares_points

    def estimated(self) -> Strategy:
        """This search answered by the estimator alone: a copy with ``estimates_only`` (itself when it is)."""
        if self.estimates_only:
            return self
        clone = copy.copy(self)
        object.__setattr__(clone, "estimates_only", True)  # a frozen dataclass's field too
        return clone
