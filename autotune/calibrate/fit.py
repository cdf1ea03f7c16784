"""Turn measured points into a version-2 calibration: the device model's workspace factors per template and
phase, how well they predict (in-sample and leave one out), and the version-1 allowance beside them.

``point_factors`` (a bisection over the device model per point) is the slow part, a few seconds a
full-size point; the points are independent, so they are solved in worker processes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.calibrate.validate import bounds_of, inside_rows, out_of_sample, outside_rows
from autotune.probe.model_fit import (
    ModelPoint,
    error_summary,
    fit_factors,
    leave_one_out,
    point_factors,
    predict_point,
)

__all__ = ["model_points", "solve_factors", "fit_model", "by_template", "install_verdict"]


def model_points(points: Sequence[Mapping[str, Any]], estimates: Sequence[Mapping[str, Any] | None]) -> list[ModelPoint]:
    """The fit's points: each measured point whose probe was ok and whose estimate recorded both phases'
    events, with ``max_memory_reserved`` per phase (the tracked peak on a CPU dry run)."""
    out = []
    for point, est in zip(points, estimates, strict=True):
        if point["probe"]["status"] != "ok" or not est or not est.get("train_events") or not est.get("infer_events"):
            continue
        reserved, allocated = {}, {}
        for phase in ("train", "infer"):
            ph = point[phase]
            reserved[phase] = ph["max_memory_reserved"] if ph["max_memory_reserved"] is not None else ph["tracked_peak_bytes"]
            allocated[phase] = ph["max_memory_allocated"] if ph["max_memory_allocated"] is not None else ph["tracked_peak_bytes"]
        if None in reserved.values():
            continue
        out.append(ModelPoint(point["algo"], int(point["n"]), int(point["m"]), est["train_events"], est["infer_events"],
                              {k: int(v) for k, v in reserved.items()}, allocated,
                              {p: int(est[f"{p}_peak_bytes"]) for p in ("train", "infer")}))
    return out


def _solve_one(point: ModelPoint, release: bool, expandable: bool) -> dict[str, float]:
    return point_factors(point, release=release, expandable=expandable)


def solve_factors(points: Sequence[ModelPoint], release: bool = True, expandable: bool = False,
                  workers: int | None = None) -> list[dict[str, float]]:
    """``point_factors`` of every point, in worker processes (``workers``: default the CPUs, at most the points)."""
    workers = max(1, min(len(points), workers or os.cpu_count() or 1))
    if workers == 1 or len(points) < 2:
        return [_solve_one(p, release, expandable) for p in points]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            return list(pool.map(_solve_one, points, [release] * len(points), [expandable] * len(points)))
    except (BrokenProcessPool, OSError):  # no worker could start (a __main__ a new interpreter cannot import)
        return [_solve_one(p, release, expandable) for p in points]


def by_template(rows: Sequence[Mapping[str, Any]], card_bytes: float | None) -> dict[str, dict[str, Any]]:
    """``error_summary`` of ``rows`` per template and phase, and over both phases."""
    out: dict[str, dict[str, Any]] = {}
    for algo in sorted({r["algo"] for r in rows}):
        own = [r for r in rows if r["algo"] == algo]
        out[algo] = {"all": error_summary(own, card_bytes),
                     **{phase: error_summary([r for r in own if r["phase"] == phase], card_bytes)
                        for phase in ("train", "infer")}}
    return out


def fit_model(points: Sequence[ModelPoint], card_bytes: float | None, release: bool = True,
              expandable: bool = False, workers: int | None = None) -> dict[str, Any]:
    """The workspace factors per template and phase, the in-sample rows and the leave-one-out rows with
    their summaries (overall and ``by_template``)."""
    per_point = solve_factors(points, release, expandable, workers)
    factors = fit_factors([(p.algo, f) for p, f in zip(points, per_point, strict=True)])
    fitted = []
    for point in points:
        predicted = predict_point(point, factors[point.algo], release=release, expandable=expandable)
        for phase in ("train", "infer"):
            fitted.append({"algo": point.algo, "n": point.n, "m": point.m, "phase": phase,
                           "factor": factors[point.algo][phase], "predicted_bytes": int(round(predicted[phase])),
                           "reserved_bytes": int(point.reserved[phase]),
                           "error": predicted[phase] / float(point.reserved[phase]) - 1.0})
    loo = leave_one_out(points, per_point, release=release, expandable=expandable)
    validation = out_of_sample(points, per_point, card_bytes, release=release, expandable=expandable, loo=loo)
    return {
        "workspace": factors,
        "point_factors": [{"algo": p.algo, "n": p.n, "m": p.m, **f} for p, f in zip(points, per_point, strict=True)],
        "fitted": fitted, "leave_one_out": loo,
        "summary": {"fitted": error_summary(fitted, card_bytes), "leave_one_out": error_summary(loo, card_bytes)},
        "by_template": {"fitted": by_template(fitted, card_bytes), "leave_one_out": by_template(loo, card_bytes)},
        "out_of_sample": {name: _summaries(entry) for name, entry in validation.items()},
        "out_of_sample_rows": validation,
        "bounds": bounds_of(validation),
        "verdict": install_verdict(validation),
    }


def _summaries(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A scheme's summaries without its rows (per model for leave one template out)."""
    if "summary" in entry:
        return dict(entry["summary"])
    return {model: dict(e["summary"]) for model, e in entry.items()}


def install_verdict(validation: Mapping[str, Any]) -> dict[str, Any]:
    """Whether a fit may be installed: its out-of-sample error (the worst of leave one point out and leave one
    scale out, over- or under-prediction) must be no worse than that of what an estimate uses without it, the
    raw estimator with the allocator's rules, on the same points. ``{"install": bool, "fit_error",
    "raw_error", "line"}``; a fit with no out-of-sample point (one batch size per template) is not installed."""
    inside, raw = inside_rows(validation), outside_rows(validation)
    raw_error = max((abs(float(r["error"])) for r in raw), default=None)
    if not inside:
        return {"install": False, "fit_error": None, "raw_error": raw_error,
                "line": "no point could be predicted from the others (one batch size per template): the fit cannot be "
                        "checked out of sample; calibrate two or more batch sizes per template (--points)"}
    fit_error = max(abs(float(r["error"])) for r in inside)
    ok = raw_error is None or fit_error <= raw_error
    verdict = "installed" if ok else "not installed"
    line = (f"fit {verdict}: its worst out-of-sample error {100 * fit_error:.1f}% (leave one point out, leave one "
            f"scale out) against {'-' if raw_error is None else f'{100 * raw_error:.1f}%'} for the raw estimator with "
            "the allocator's rules on the same points")
    return {"install": ok, "fit_error": fit_error, "raw_error": raw_error, "line": line}
