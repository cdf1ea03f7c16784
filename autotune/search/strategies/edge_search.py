"""Find the largest batch that fits with as few real evaluations as the estimate allows.

The estimated curve (``autotune.search.curves``) puts the edge somewhere; the largest n its
corrected answers put under the budget is probed, then one above. Each measurement corrects the
curve's device allowance (``autotune.search.curves.edge.correct``), never its shape; after two
predictions that measurements contradict, the search bisects on real probes (doubling while
nothing above is known to fail), so a wrong curve costs O(log range) probes, never the answer.

A calibration's stated bound on the estimate's over-prediction (``autotune.search.curves.bound``)
settles the check one above a measured fit without a probe where the estimate there exceeds the
budget by more than the bound.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autotune.search.curves.bound import bound_held, over_by_bound
from autotune.search.curves.edge import correct, largest_under, raised
from autotune.search.curves.sparse import sparse_of

__all__ = ["find_max_feasible", "EdgeSearch"]

log = logging.getLogger(__name__)


@dataclass
class EdgeSearch:
    """The state of one edge search over [lo, hi]: what is known to fit and to fail, and the curve.

    ``lo_ok``: the largest n known to fit (``lo - 1``: none yet); ``hi_bad``: the smallest n known not
    to fit (``hi + 1``: none yet); ``measured``/``at_least``: real peaks that fit / lower bounds from
    points that ran out of memory; ``misses``: predictions the measurements contradicted.
    """

    lo: int
    hi: int
    model: Any
    budget: int
    bound: float | None = None
    lo_ok: int = 0
    hi_bad: int = 0
    measured: dict[int, int] = field(default_factory=dict)
    at_least: dict[int, int] = field(default_factory=dict)
    misses: int = 0
    current: Any = None

    def __post_init__(self) -> None:
        self.lo_ok, self.hi_bad, self.current = self.lo - 1, self.hi + 1, self.model
        if self.bound is not None:  # keep one estimator pass for the check one above the edge
            sparse = sparse_of(self.model)
            if sparse is not None and sparse.reserved == 0 and sparse.passes < sparse.max_passes:
                sparse.reserved = 1

    @property
    def open(self) -> bool:
        """True while a point between the known fit and the known failure is untried."""
        return self.lo_ok + 1 < self.hi_bad

    def predicted_edge(self) -> int | None:
        """The largest n the corrected curve puts under the budget (None: no curve, or it failed)."""
        if self.current is None:
            return None
        try:
            return largest_under(self.current, self.lo, self.hi, self.budget)
        except Exception as exc:  # the estimator is an aid: bisect without it
            log.warning("estimate failed, bisecting without it: %s", exc)
            self.model = self.current = None
            return None

    def next_point(self, edge: int | None) -> int:
        """The n to evaluate next, given the curve's predicted ``edge``."""
        lo_ok, hi_bad = self.lo_ok, self.hi_bad
        if self.misses >= 2 or edge is None:
            n = (lo_ok + hi_bad) // 2 if hi_bad <= self.hi else min(self.hi, max(self.lo, 2 * max(lo_ok, 1)))
            return n if lo_ok < n < hi_bad else lo_ok + 1
        if lo_ok < edge < hi_bad:
            return edge  # the predicted maximum
        return lo_ok + 1 if edge <= lo_ok else hi_bad - 1  # confirm one above the known fit

    def settled_by_bound(self, n: int) -> bool:
        """True when the stated bound settles that ``n`` (one above a measured fit) does not fit."""
        if self.bound is None or self.model is None or self.lo_ok < self.lo or n != self.lo_ok + 1:
            return False
        return (bound_held(self.model, self.measured.get(self.lo_ok), self.lo_ok, self.bound)
                and over_by_bound(self.model, n, self.budget, self.bound))

    def record(self, n: int, evaluation: Any, edge: int | None) -> None:
        """Take ``evaluation`` of ``n`` into the known bounds and correct the curve with it."""
        if evaluation.feasible:
            self.lo_ok = n
        else:
            self.hi_bad = n
        if edge is not None and ((evaluation.feasible and n > edge) or (not evaluation.feasible and n <= edge)):
            self.misses += 1  # the measurement contradicts the prediction it was made with
        if evaluation.status == "ok" and evaluation.peak_bytes:
            self.measured[n] = int(evaluation.peak_bytes)
        elif evaluation.status == "oom" and evaluation.peak_bytes:
            self.at_least[n] = int(evaluation.peak_bytes)  # the peak when it ran out: a lower bound
        if self.measured:
            self.current = correct(self.model, self.measured, max(self.lo_ok, self.lo))
        else:
            self.current = raised(self.model, self.at_least)


def find_max_feasible(
    evaluate: Callable[[int], Any],
    lo: int,
    hi: int,
    model: Any,
    budget: int,
    bound: float | None = None,
    bounded: list[int] | None = None,
) -> tuple[int | None, list[Any]]:
    """The largest n in [lo, hi] that fits (None when even ``lo`` does not), and the evaluations made.

    Args:
        evaluate: evaluates n for real (an ``Evaluation``: ``feasible``, ``failed``, ``status``, ``peak_bytes``).
        model: the estimated ``Curve`` (None: bisection alone).
        bound: a calibration's stated over-prediction bound, or None (every n probed).
        bounded: each n settled by the bound without a probe is appended here.
    """
    search = EdgeSearch(lo, hi, model, budget, bound)
    evaluations: list[Any] = []
    while search.open:
        edge = search.predicted_edge()
        n = search.next_point(edge)
        if search.settled_by_bound(n):
            search.hi_bad = n  # the device's peak at n exceeds the budget even at the bound's worst
            if bounded is not None:
                bounded.append(n)
            continue
        evaluation = evaluate(n)
        evaluations.append(evaluation)
        if evaluation.failed:  # a crash says nothing about memory: try the point once more
            evaluation = evaluate(n)
            evaluations.append(evaluation)
        search.record(n, evaluation, edge)
    return (search.lo_ok if search.lo_ok >= lo else None), evaluations
