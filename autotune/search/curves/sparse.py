"""An estimated memory curve that spends at most a few estimator passes (a key's three in all).

The estimator (a FakeTensor trace on the CPU) costs about a second per pass, more than a real
probe on a GPU; a bisection over its answers costs one pass per step (eight for a range of 64).
The training curve needs one pass (``autotune.probe.replay``: one trace, every N, exact). This
curve is for what cannot be replayed: the sliding window, whose loop over window batches
changes with its batch size, and training where a trace does not replay. ``SparseCurve`` reads
the estimator at the top of the range, at the bottom, and once more where the line through
those two puts the edge (``settle``); every other N is read off the curve through the estimates
it has (the parabola through the three nearest inside them, a line outside). The loader batch's
bytes are exact and not affine in N (a loader batch holds lcm(N, crops) patches), so they are
taken out before interpolating and added back after (``step_bytes``): the interpolation is over
the rest, which grows with N. The real probes at N and N+1 settle the edge; a curve read wrong
costs probes (``autotune.search.strategies.edge_search`` corrects and, after two misses, bisects), never
the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_PASSES", "SparseCurve", "sparse_of", "settle", "passes_of", "bisect_fits"]

MAX_PASSES = 3


@dataclass
class SparseCurve:
    """Peak bytes at each n from at most ``max_passes`` estimator passes (``estimate_fn``).

    ``known``: estimates already computed (read back from a study; they cost no pass).
    ``step_bytes``: the exact part of the peak that is not affine in n (the loader batches), or None.
    ``cap``: n past which memory stops growing (sliding-window batches past the number of windows).
    """

    estimate_fn: Callable[[int], float]
    cap: int | None = None
    known: dict[int, float] = field(default_factory=dict)
    step_bytes: Callable[[int], float] | None = None
    max_passes: int = MAX_PASSES
    passes: int = 0
    reserved: int = 0  # passes kept for ``spend(n, reserve=True)`` (the N+1 check under a stated bound)

    def _clamp(self, n: int) -> int:
        return min(int(n), self.cap) if self.cap is not None else int(n)

    def _step(self, n: int) -> float:
        return float(self.step_bytes(n)) if self.step_bytes is not None else 0.0

    def estimated(self, n: int) -> bool:
        """True when the estimator has answered at ``n`` (not read off the curve between estimates)."""
        return self._clamp(n) in self.known

    def spend(self, n: int, reserve: bool = False) -> bool:
        """Estimate at ``n`` when it is not known and a pass is left (``reserve``: one of the reserved
        passes may be used); True when ``n`` is known after."""
        n = self._clamp(n)
        left = self.max_passes - (0 if reserve else self.reserved)
        if n not in self.known and self.passes < left:
            self.passes += 1
            self.known[n] = float(self.estimate_fn(n))
        return n in self.known

    def predict(self, n: int) -> float:
        n = self._clamp(n)
        if n in self.known:
            return self.known[n]
        if len(self.known) < 2 and self.spend(n):
            return self.known[n]
        rest = {x: v - self._step(x) for x, v in self.known.items()}
        xs = sorted(rest)
        if not xs:
            raise RuntimeError("no estimate and no estimator pass left")
        if len(xs) == 1:  # out of passes with one point: proportional above the constant part is unknown
            x0 = xs[0]
            return self._step(n) + rest[x0] * n / x0
        if len(xs) >= 3 and xs[0] < n < xs[-1]:  # inside: the parabola through the three nearest estimates
            near = sorted(sorted(xs, key=lambda x: (abs(x - n), x))[:3])
            value = 0.0
            for i, xi in enumerate(near):
                weight = 1.0
                for j, xj in enumerate(near):
                    if j != i:
                        weight *= (n - xj) / (xi - xj)
                value += weight * rest[xi]
            return self._step(n) + value
        below = [x for x in xs if x < n]
        above = [x for x in xs if x > n]
        if below and above:
            a, b = below[-1], above[0]
        elif above:  # extrapolate down along the first segment
            a, b = above[0], above[1]
        else:  # extrapolate up along the last segment
            a, b = below[-2], below[-1]
        slope = (rest[b] - rest[a]) / (b - a)
        return self._step(n) + rest[a] + slope * (n - a)


def sparse_of(curve: Any) -> SparseCurve | None:
    """The ``SparseCurve`` under ``curve`` (through ``CorrectedCurve.base`` links), or None."""
    seen = 0
    while curve is not None and seen < 8:
        if isinstance(curve, SparseCurve):
            return curve
        curve, seen = getattr(curve, "base", None), seen + 1
    return None


def passes_of(curve: Any) -> int:
    """Estimator passes spent by the ``SparseCurve`` under ``curve`` (0 when there is none)."""
    sparse = sparse_of(curve)
    return sparse.passes if sparse is not None else 0


def bisect_fits(predict: Callable[[int], float], fits: int, over: int, budget: float) -> int:
    """The largest n in [fits, over) whose prediction fits ``budget``, by bisection (peak memory grows
    with n), given that ``fits`` fits and ``over`` does not."""
    while fits + 1 < over:
        mid = (fits + over) // 2
        if predict(mid) <= budget:
            fits = mid
        else:
            over = mid
    return fits


def settle(curve: Any, lo: int, hi: int, budget: float) -> None:
    """Spend the passes where they tell the edge in [lo, hi]: the top (fits: done), the bottom (does not:
    done), then the edge the line through them predicts. ``curve`` may wrap the sparse curve (an allowance
    or a probe's correction); the budget is compared with ``curve``'s answers."""
    sparse = sparse_of(curve)
    if sparse is None:
        return
    sparse.spend(hi)
    if curve.predict(hi) <= budget:
        return
    sparse.spend(lo)
    if curve.predict(lo) > budget:
        return
    fits = bisect_fits(curve.predict, lo, hi, budget)  # over the interpolated answers: no pass
    for n in (fits, fits + 1):  # the check: the predicted edge, or the point above it when the edge is known
        if lo < n < hi and not sparse.estimated(n):
            sparse.spend(n)
            break
