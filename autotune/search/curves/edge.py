"""Memory curves and the largest batch a curve puts under a budget.

The estimator is cheap and, on the tensors, exact at every N; peak memory is not affine
in N over a wide range (a full-size UNet's slope between N = 52 and 64 is 1.8x its slope
between 1 and 2), so a line through two estimates misplaces the edge. The edge a curve
predicts is found by bisection over the estimator's own answers (``largest_under``). A real
measurement corrects the device allowance, ``peak = scale * estimate + offset``, never the
shape of the curve (``correct``): one point moves both halfway (it cannot tell them apart),
two fix scale and offset; an out-of-memory point raises the curve by the least error it
proves (``raised``). The search that probes the edge is
``autotune.search.strategies.edge_search``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from autotune.search.curves.sparse import bisect_fits, settle

__all__ = ["Curve", "CorrectedCurve", "correct", "raised", "raw_of", "largest_under"]


class Curve(Protocol):
    """Predicted peak bytes at batch size ``n``; ``cap``: n past which memory stops growing (or None)."""

    cap: int | None

    def predict(self, n: int) -> float:
        """Peak bytes at ``n``."""


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


def raised(base: Any, at_least: dict[int, int]) -> Any:
    """``base`` shifted up by the least error an out-of-memory point proves (none: ``base``)."""
    if base is None or not at_least:
        return base
    try:
        shift = max(peak - base.predict(n) for n, peak in at_least.items())
    except Exception:  # noqa: BLE001 - the edge search handles a failing estimator
        return base
    return CorrectedCurve(base, 1.0, shift) if shift > 0 else base


def largest_under(curve: Any, lo: int, hi: int, budget: float) -> int:
    """The largest n in [lo, hi] whose prediction fits ``budget`` (``lo - 1`` when none does), by
    bisection over the curve's answers (peak memory grows with n). A curve over a
    ``autotune.search.curves.sparse.SparseCurve`` first spends its few estimator passes (``settle``)."""
    settle(curve, lo, hi, budget)
    if curve.predict(hi) <= budget:  # the top first: where it fits, one estimate is all
        return hi
    if curve.predict(lo) > budget:
        return lo - 1
    return bisect_fits(curve.predict, lo, hi, budget)
