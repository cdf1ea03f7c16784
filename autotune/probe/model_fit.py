"""Fit the device model's calibrated part (cuDNN's workspace factor per template and phase) to measured
points, and say how well it predicts points it was not fitted on (leave one out).

A point is one probe on the GPU: its template, N and M, the estimator's recorded trace of both
phases (``estimate(..., record=True)`` at the same N and M) and the measured
``max_memory_reserved`` of each phase. For each point the factor ``w`` at which the model's
reserved peak (``autotune.probe.device_model.predict_reserved``) reaches the measured one is
found by bisection, training's first (validation's peak depends on what training left cached);
a template's factor for a phase is the mean over its points. ``leave_one_out`` predicts each
point from the factors of the template's other points only: the left-out point never informs
its own prediction.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.probe.device_model import BAND, PHASES, predict_reserved

__all__ = ["ModelPoint", "MAX_FACTOR", "point_factors", "fit_factors", "predict_point", "leave_one_out",
           "error_summary"]

MAX_FACTOR = 64.0  # a workspace 64 times the largest activation: beyond anything measured (16 on the H200)
_STEPS = 14


@dataclass
class ModelPoint:
    """One measured point: template, N, M, the estimator's traces and the measured peaks per phase."""

    algo: str
    n: int
    m: int
    train_events: Sequence[tuple[str, int, int, str]]
    infer_events: Sequence[tuple[str, int, int, str]]
    reserved: Mapping[str, int]
    allocated: Mapping[str, int] = field(default_factory=dict)
    estimate: Mapping[str, int] = field(default_factory=dict)


def _reserved(point: ModelPoint, phase: str, w_train: float, w_infer: float, band: Sequence[float], release: bool,
              expandable: bool) -> float:
    infer = point.infer_events if phase == "infer" else None
    figures = predict_reserved(point.train_events, infer, {"train": w_train, "infer": w_infer}, band=band,
                               release=release, expandable=expandable)
    return figures[phase]["reserved"]


def _solve(f: Any, target: float) -> float:
    """The smallest w in [0, MAX_FACTOR] with f(w) >= target, by bisection (0 or MAX_FACTOR at the ends)."""
    if f(0.0) >= target:
        return 0.0
    lo, hi = 0.0, MAX_FACTOR
    if f(hi) < target:
        return hi
    for _ in range(_STEPS):
        mid = (lo + hi) / 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def point_factors(point: ModelPoint, band: Sequence[float] = BAND, release: bool = True,
                  expandable: bool = False) -> dict[str, float]:
    """The workspace factor per phase at which the model meets this point's measured reserved peak."""
    w_train = _solve(lambda w: _reserved(point, "train", w, 0.0, band, release, expandable),
                     float(point.reserved["train"]))
    w_infer = _solve(lambda w: _reserved(point, "infer", w_train, w, band, release, expandable),
                     float(point.reserved["infer"]))
    return {"train": w_train, "infer": w_infer}


def fit_factors(per_point: Sequence[tuple[str, Mapping[str, float]]]) -> dict[str, dict[str, float]]:
    """Per template, the mean of its points' factors (``per_point``: (template, point_factors) pairs)."""
    by_template: dict[str, list[Mapping[str, float]]] = {}
    for algo, factors in per_point:
        by_template.setdefault(algo, []).append(factors)
    return {algo: {phase: round(statistics.fmean(f[phase] for f in fs), 4) for phase in PHASES}
            for algo, fs in sorted(by_template.items())}


def predict_point(point: ModelPoint, factors: Mapping[str, float], band: Sequence[float] = BAND,
                  release: bool = True, expandable: bool = False) -> dict[str, float]:
    """The model's reserved peak of each phase of ``point`` with the workspace ``factors``."""
    figures = predict_reserved(point.train_events, point.infer_events, factors, band=band, release=release,
                               expandable=expandable)
    return {phase: figures[phase]["reserved"] for phase in PHASES}


def leave_one_out(points: Sequence[ModelPoint], per_point: Sequence[Mapping[str, float]],
                  band: Sequence[float] = BAND, release: bool = True, expandable: bool = False) -> list[dict[str, Any]]:
    """Each point's reserved peaks predicted from the mean factors of its template's other points
    (``per_point[i]`` is ``point_factors(points[i])``); a template with one point is left out."""
    rows = []
    for i, point in enumerate(points):
        others = [per_point[j] for j, other in enumerate(points) if j != i and other.algo == point.algo]
        if not others:
            continue
        factors = {phase: statistics.fmean(f[phase] for f in others) for phase in PHASES}
        predicted = predict_point(point, factors, band, release, expandable)
        for phase in PHASES:
            measured = float(point.reserved[phase])
            rows.append({"algo": point.algo, "n": point.n, "m": point.m, "phase": phase,
                         "factor": round(factors[phase], 4), "predicted_bytes": int(round(predicted[phase])),
                         "reserved_bytes": int(measured), "error": predicted[phase] / measured - 1.0})
    return rows


def error_summary(rows: Sequence[Mapping[str, Any]], card_bytes: float | None = None,
                  tolerance: float = 0.10) -> dict[str, Any]:
    """Worst over- and under-prediction of ``rows`` (``predicted_bytes``, ``reserved_bytes``, ``error``),
    how many are within ``tolerance``, and the worst under-prediction as a share of the card."""
    if not rows:
        return {"points": 0}
    out: dict[str, Any] = {
        "points": len(rows),
        "within": sum(abs(r["error"]) <= tolerance for r in rows),
        "tolerance": tolerance,
        "max_over": max(0.0, max(r["error"] for r in rows)),
        "max_under": min(0.0, min(r["error"] for r in rows)),
    }
    if card_bytes:
        out["max_under_of_card"] = min(0.0, min((r["predicted_bytes"] - r["reserved_bytes"]) / card_bytes
                                                for r in rows))
    return out
