"""The calibration's points: one real probe per (template, N, M) and the estimator's trace of the same point.

A point's record holds, per phase, the estimator's raw peak, the device's ``max_memory_allocated``
and ``max_memory_reserved``, NVML's used memory and what the allocator held at the phase's end;
the estimator's recorded events (``estimate(..., record=True)``) are returned beside it for the fit
(``autotune.probe.model_fit``), not kept in the record. On the CPU (a dry run) the probe's tracked
peak stands in for the device's figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["SW_DIVISORS", "point_pairs", "measure_point", "calibration_rows"]

# the batch sizes probed per template: its ``OwnTemplate`` (``autotune.families.own``)
SW_DIVISORS = (4, 2, 1)  # the windows over the CT volume in 4, 2 and 1 batches


def point_pairs(n_values: Sequence[int], windows: int, divisors: Sequence[int] = SW_DIVISORS) -> list[tuple[int, int]]:
    """(N, M) per probe: the N values in order, each with M = the windows split in the divisor of
    the same place counted from the end (the largest N with all windows in one batch)."""
    ns = sorted(int(n) for n in n_values)
    ds = list(divisors)[-len(ns):]
    ds = [ds[0]] * (len(ns) - len(ds)) + ds  # more N than divisors: the smallest M repeats
    return [(n, max(1, math.ceil(windows / d))) for n, d in zip(ns, ds, strict=True)]


def _phase_record(res: dict[str, Any], est: dict[str, Any], phase: str, cuda: bool) -> dict[str, Any]:
    allocated = res.get(f"{phase}_cuda_max_memory_allocated")
    estimate_bytes = est.get(f"{phase}_peak_bytes")
    return {
        "estimate_bytes": estimate_bytes,
        "max_memory_allocated": allocated,
        "max_memory_reserved": res.get(f"{phase}_cuda_max_memory_reserved"),
        "nvml_used_bytes": res.get(f"{phase}_nvml_used_bytes"),
        "reserved_now": res.get(f"{phase}_cuda_memory_reserved_now"),
        # on the CPU the probe's tracked peak (the estimator's own tracker: checks the fake pass only)
        "tracked_peak_bytes": None if cuda else res.get(f"{phase}_peak_bytes"),
        "estimate_vs_allocated": (estimate_bytes / allocated - 1) if estimate_bytes and allocated else None,
    }


def measure_point(algo: str, bundle: Path, n: int, m: int, device: str, timeout: float,
                  env: dict[str, str] | None = None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One real probe at (N, M) (both phases, no memory limit) and the estimator's recorded trace of the
    same point: the point's record, and the estimate's result with its events (None when it failed)."""
    from autotune.probe.estimate import estimate
    from autotune.probe.runner import run_probe

    res = run_probe(str(bundle), num_patches_per_iter=n, num_sw_batch_size=m, device=device, timeout=timeout, env=env)
    point: dict[str, Any] = {"algo": algo, "n": n, "m": m, "bundle": str(bundle), "roi_size": res.get("roi_size"),
                             "infer_volume_shape": res.get("infer_volume_shape"), "precision": res.get("precision"),
                             "probe": {"status": res.get("status"), "error_type": res.get("error_type"),
                                       "wall_seconds": res.get("wall_seconds"),
                                       "nvml_baseline_used_bytes": res.get("nvml_baseline_used_bytes"),
                                       "alloc_conf": res.get("alloc_conf"),
                                       "allocator_stats": res.get("allocator_stats"),
                                       "error_tail": (res.get("error_tail") or "")[-800:] or None},
                             "estimate_emulated": None}
    est: dict[str, Any] | None = None
    try:
        est = estimate(str(bundle), num_patches_per_iter=n, num_sw_batch_size=m, device=device, record=True)
        point["estimate"] = {"semantics": est.get("semantics"), "seconds": est.get("seconds"), "error": None}
    except Exception as exc:  # noqa: BLE001 - a failed estimate is a result of the point
        point["estimate"] = {"semantics": None, "seconds": None, "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
    cuda = str(device).startswith("cuda")
    for phase in ("train", "infer"):
        point[phase] = _phase_record(res, est or {}, phase, cuda)
    point["train"]["step_seconds"] = res.get("step_seconds_median")
    point["train"]["samples_per_s"] = res.get("samples_per_s")
    point["infer"]["seconds_per_volume"] = res.get("sw_seconds_per_volume")
    return point, est


def calibration_rows(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fit's input, one row per point and phase: the estimate against ``max_memory_reserved``
    (on the CPU the tracked peak stands in for allocated and reserved), and the context NVML sees
    outside the allocator."""
    rows = []
    for p in points:
        if p["probe"]["status"] != "ok":
            continue
        for phase in ("train", "infer"):
            ph = p[phase]
            reserved = ph["max_memory_reserved"] if ph["max_memory_reserved"] is not None else ph["tracked_peak_bytes"]
            allocated = ph["max_memory_allocated"] if ph["max_memory_allocated"] is not None else ph["tracked_peak_bytes"]
            if reserved is None or not ph["estimate_bytes"]:
                continue
            nvml, now, base = ph["nvml_used_bytes"], ph["reserved_now"], p["probe"].get("nvml_baseline_used_bytes")
            context = nvml - now - (base or 0) if nvml is not None and now is not None else None
            rows.append({"algo": p["algo"], "n": p["n"], "m": p["m"], "phase": phase,
                         "estimate_bytes": int(ph["estimate_bytes"]), "allocated_bytes": allocated,
                         "reserved_bytes": int(reserved), "context_bytes": context})
    return rows
