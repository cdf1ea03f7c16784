"""Find the largest batch that fits: search the estimator's answers, confirm with the device.

The estimator is cheap and, on the tensors, exact at every N; peak memory is not affine
in N over a wide range (a full-size UNet's slope between N = 52 and 64 is 1.8x its slope
between 1 and 2), so a line through two estimates misplaces the edge. Here the edge is
found by bisection over the estimator's own answers at the candidate points
(``largest_under``), and the real probes go to N and N+1 only. A real measurement
corrects the device allowance, ``peak = scale * estimate + offset``, never the shape of
the curve (``correct``): one point moves both halfway (it cannot tell them apart), two fix
scale and offset. After two
predictions that measurements contradict, the search bisects on real probes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Curve", "EstimatedCurve", "CorrectedCurve", "correct", "raw_of", "largest_under", "find_max_feasible"]

log = logging.getLogger(__name__)


class Curve(Protocol):
    """Predicted peak bytes at batch size ``n``; ``cap``: n past which memory stops growing (or None)."""

    cap: int | None

    def predict(self, n: int) -> float:
        """Peak bytes at ``n``."""


@dataclass
class EstimatedCurve:
    """The estimator's answer at each n, computed once per n (``estimate_fn`` gives bytes).

    ``known`` holds answers already computed (a resumed search reads them from its study).
    """

    estimate_fn: Callable[[int], float]
    cap: int | None = None
    known: dict[int, float] = field(default_factory=dict)

    def predict(self, n: int) -> float:
        if self.cap is not None:
            n = min(n, self.cap)
        if n not in self.known:
            self.known[n] = float(self.estimate_fn(n))
        return self.known[n]


@dataclass
class CorrectedCurve:
    """``scale * base.predict(n) + offset``: the device allowance, fitted to real peaks."""

    base: Any
    scale: float = 1.0
    offset: float = 0.0

    @property
    def cap(self) -> int | None:
        return getattr(self.base, "cap", None)

    def predict(self, n: int) -> float:
        return self.scale * self.base.predict(n) + self.offset


def raw_of(curve: Any) -> Any:
    """The estimator's own curve under ``curve`` (through ``CorrectedCurve.base`` links)."""
    while isinstance(curve, CorrectedCurve):
        curve = curve.base
    return curve


def correct(base: Any, measured: dict[int, int], near: int) -> Any:
    """``base`` corrected with real peaks (``measured``: n -> bytes), using the two nearest ``near``.

    One point moves scale and offset halfway each; two fix both; a measured peak that does not grow
    where the estimate does makes the curve flat at the larger measurement.
    """
    if base is None or not measured:
        return base
    points = sorted(measured.items(), key=lambda item: (abs(item[0] - near), -item[0]))[:2]
    if len(points) == 2:
        (n1, p1), (n2, p2) = sorted(points)
        e1, e2 = base.predict(n1), base.predict(n2)
        if e2 != e1:
            scale = (p2 - p1) / (e2 - e1)
            if scale <= 0:
                return CorrectedCurve(base, 0.0, float(max(p1, p2)))
            return CorrectedCurve(base, scale, p1 - scale * e1)
    # one point cannot tell a scale error from an offset error: take the mean of the two readings
    # (the truth lies between them when both errors have the same sign)
    n, peak = points[0]
    estimated = base.predict(n)
    if estimated <= 0:
        return CorrectedCurve(base, 1.0, peak - estimated)
    return CorrectedCurve(base, (1.0 + peak / estimated) / 2, (peak - estimated) / 2)


def _raised(base: Any, at_least: dict[int, int]) -> Any:
    """``base`` shifted up by the least error an out-of-memory point proves (none: ``base``)."""
    if base is None or not at_least:
        return base
    try:
        shift = max(peak - base.predict(n) for n, peak in at_least.items())
    except Exception:  # noqa: BLE001 - find_max_feasible handles a failing estimator
        return base
    return CorrectedCurve(base, 1.0, shift) if shift > 0 else base


def _over_by_bound(model: Any, n: int, budget: float, bound: float) -> bool:
    """True when the estimate at ``n`` exceeds ``budget`` by more than a stated over-prediction bound.

    The bound holds for estimates, not for a curve read between them: with a ``SparseCurve`` under
    ``model``, ``n`` must be estimated (a pass left, or known), else the answer is False (probe)."""
    from autotune.search.sparse import sparse_of

    sparse = sparse_of(model)
    try:
        if sparse is not None and not sparse.spend(n, reserve=True):
            return False
        return model.predict(n) / (1.0 + float(bound)) > budget
    except Exception:  # noqa: BLE001 - no estimate: probe
        return False


def _bound_held(model: Any, peak: int | None, n: int, bound: float) -> bool:
    """True when the measured ``peak`` at ``n`` is no further under the estimate than the bound allows:
    the probe at the edge checks the estimate the bound is then applied to, one above it. Where ``n``
    was not estimated (a ``SparseCurve`` reads it between estimates) there is nothing to check it
    against, and the calibration's word stands."""
    from autotune.search.sparse import sparse_of

    if peak is None:
        return False
    sparse = sparse_of(model)
    if sparse is not None and not sparse.estimated(n):
        return True
    try:
        return float(peak) >= model.predict(n) / (1.0 + float(bound))
    except Exception:  # noqa: BLE001 - no estimate: probe
        return False


def largest_under(curve: Any, lo: int, hi: int, budget: float) -> int:
    """The largest n in [lo, hi] whose prediction fits ``budget`` (``lo - 1`` when none does), by
    bisection over the curve's answers (peak memory grows with n). A curve over a
    ``autotune.search.sparse.SparseCurve`` first spends its few estimator passes (``settle``)."""
    from autotune.search.sparse import settle

    settle(curve, lo, hi, budget)
    if curve.predict(hi) <= budget:  # the top first: where it fits, one estimate is all
        return hi
    if curve.predict(lo) > budget:
        return lo - 1
    fits, over = lo, hi
    while fits + 1 < over:
        mid = (fits + over) // 2
        if curve.predict(mid) <= budget:
            fits = mid
        else:
            over = mid
    return fits


def find_max_feasible(
    evaluate: Callable[[int], Any],
    lo: int,
    hi: int,
    model: Any,
    budget: int,
    bound: float | None = None,
    bounded: list[int] | None = None,
) -> tuple[int | None, list[Any]]:
    """The largest n in [lo, hi] that fits, with as few real evaluations as the estimate allows.

    ``model`` is a ``Curve`` (or None: bisection alone). The largest n its corrected answers put
    under the budget is probed, then one above. Each measurement corrects the model; after two
    predictions that measurements contradict, it bisects (doubling while nothing above is known
    to fail), so a wrong model costs O(log range) probes.

    ``bound``: a calibration's stated bound on the estimate's over-prediction (the device's peak is at
    least ``model.predict(n) / (1 + bound)``), or None. With a bound, the check one above a measured
    fit is skipped when ``model`` puts it over the budget by more than the bound; each n so settled is
    appended to ``bounded``. Without a bound every n is probed.

    Returns:
        (largest feasible n or None when even ``lo`` does not fit, evaluations made)
    """
    lo_ok, hi_bad = lo - 1, hi + 1
    measured: dict[int, int] = {}
    at_least: dict[int, int] = {}
    evaluations: list[Any] = []
    misses = 0
    current = model
    if bound is not None:  # keep one estimator pass for the check one above the edge
        from autotune.search.sparse import sparse_of

        sparse = sparse_of(model)
        if sparse is not None and sparse.reserved == 0 and sparse.passes < sparse.max_passes:
            sparse.reserved = 1

    def predicted_edge(curve: Any) -> int | None:
        nonlocal model
        if curve is None:
            return None
        try:
            return largest_under(curve, lo, hi, budget)
        except Exception as exc:  # the estimator is an aid: bisect without it
            log.warning("estimate failed, bisecting without it: %s", exc)
            model = None
            return None

    while lo_ok + 1 < hi_bad:
        edge = predicted_edge(current)
        if misses >= 2 or edge is None:
            n = (lo_ok + hi_bad) // 2 if hi_bad <= hi else min(hi, max(lo, 2 * max(lo_ok, 1)))
            n = n if lo_ok < n < hi_bad else lo_ok + 1
        elif lo_ok < edge < hi_bad:
            n = edge  # the predicted maximum
        elif edge <= lo_ok:
            n = lo_ok + 1  # the model says lo_ok is the edge: confirm one above
        else:
            n = hi_bad - 1
        if bound is not None and model is not None and lo_ok >= lo and n == lo_ok + 1 \
                and _bound_held(model, measured.get(lo_ok), lo_ok, bound) and _over_by_bound(model, n, budget, bound):
            hi_bad = n  # the device's peak at n exceeds the budget even at the bound's worst
            if bounded is not None:
                bounded.append(n)
            continue
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
        elif evaluation.status == "oom" and evaluation.peak_bytes:
            at_least[n] = int(evaluation.peak_bytes)  # the peak when it ran out: a lower bound
        current = correct(model, measured, max(lo_ok, lo)) if measured else _raised(model, at_least)
    return (lo_ok if lo_ok >= lo else None), evaluations
