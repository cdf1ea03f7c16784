"""Call A of the GPU check, memory: the estimator against the device, a calibration, the edge, the contract.

Sections, in order (each guarded by ``gpu_harness.Check.section``):

- ``ct_data``: a synthetic CT set (512 x 512 x 120 at 0.8 x 0.8 x 2.5 mm, three cases) and the
  full-size bundles of SegResNet, DiNTS and UNet for it.
- ``points``: per template, at a few batch sizes N fixed by hand and sliding-window batches M
  (the windows over the CT volume split in 4, 2 and 1 batches), one real probe (isolated child)
  recording ``max_memory_allocated``/``max_memory_reserved`` per phase, and the estimator's
  figure for the same point (fake CUDA tensors on the GPU).
- ``calibrate``: the allowances fitted to those points (``autotune.probe.calibration``), written
  to ``OUT/calibration/<gpu>.json`` with the bound per template.
- ``edge``: ``autotune tune`` of SegResNet with ``AUTOTUNE_PROBE_EDGE=1`` under half the card
  (a fixed fraction, not the estimator's prediction) and the calibration just written: N that
  fits and N+1 probed, M and M+1 likewise, each read back from the study.
- ``contract``: one epoch of training of the handed bundle under the same limit: the training
  and validation peaks against the budget and the tuned peak.

The CUDA-hidden re-estimates (a machine without a GPU planning for this one) are left to the
CPU afterwards (``gpu_check.py reestimate``).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from gpu_data import copy_bundle, generate, make_ct_dataset
from gpu_harness import Check

from autotune.utils import format_bytes

__all__ = ["FULL", "DRY", "run_memory", "point_pairs", "calibration_rows", "edge_summary"]

# Fixed by hand per template (never from the estimator): the batch sizes probed.
FULL: dict[str, Any] = {
    "ct": {"shape": (512, 512, 120), "spacing": (0.8, 0.8, 2.5), "cases": 3},
    "n_values": {"segresnet": (1, 2, 4), "dints": (1, 4, 12), "unet": (1, 8, 32)},
    "sw_divisors": (4, 2, 1), "probe_timeout": 120.0, "reserve_after_points_s": 110.0,
    "edge_algo": "segresnet", "edge_card_fraction": 0.5, "edge_limit": None, "edge_range": (1, 64),
    "needs_s": {"ct_data": 45.0, "points": 30.0, "edge": 70.0, "contract": 35.0},
}
DRY: dict[str, Any] = {
    "ct": {"shape": (64, 64, 24), "spacing": (0.8, 0.8, 2.5), "cases": 3},
    "n_values": {"segresnet": (1,), "dints": (1,), "unet": (1, 2)},
    "sw_divisors": (4, 2, 1), "probe_timeout": 300.0, "reserve_after_points_s": 150.0,
    "edge_algo": "segresnet", "edge_card_fraction": None, "edge_limit": "48MiB", "edge_range": (1, 64),
    "needs_s": {"ct_data": 30.0, "points": 30.0, "edge": 60.0, "contract": 30.0},
}


def run_memory(check: Check) -> None:
    """Run call A's sections in order."""
    state: dict[str, Any] = {}
    needs = check.cfg["needs_s"]
    check.section("ct_data", lambda r: section_ct_data(check, r, state), needs["ct_data"])
    if not state.get("bundles"):
        return
    check.section("points", lambda r: section_points(check, r, state), needs["points"])
    check.section("calibrate", lambda r: section_calibrate(check, r), 0.0)
    check.section("edge", lambda r: section_edge(check, r, state), needs["edge"])
    if state.get("tuned"):
        check.section("contract", lambda r: section_contract(check, r, state), needs["contract"])


def section_ct_data(check: Check, record: dict[str, Any], state: dict[str, Any]) -> None:
    from autotune.probe.runner import resolve_request
    from autotune.step import num_windows

    ct = check.cfg["ct"]
    t0 = time.monotonic()
    source = make_ct_dataset(check.work / "ct", ct["cases"], ct["shape"], ct["spacing"])
    record["made_s"] = round(time.monotonic() - t0, 1)
    t1 = time.monotonic()
    bundles = generate(check.work / "work_ct", source, tuple(check.cfg["n_values"]), tiny=check.dry_run)
    record.update(generated_s=round(time.monotonic() - t1, 1), source=str(source), shape=list(ct["shape"]),
                  spacing=list(ct["spacing"]), cases=ct["cases"], preset="tiny" if check.dry_run else "full")
    record["bundles"] = {}
    for algo, bundle in bundles.items():
        cfg = resolve_request(str(bundle), check_device=False)["config"]
        record["bundles"][algo] = {"bundle": str(bundle), "roi_size": cfg.get("roi_size"),
                                   "infer_volume_shape": cfg.get("infer_volume_shape"),
                                   "num_crops_per_image": cfg.get("num_crops_per_image"),
                                   "num_windows": num_windows(cfg)}
    state["bundles"] = bundles


def point_pairs(n_values: tuple[int, ...], windows: int, divisors: tuple[int, ...]) -> list[tuple[int, int]]:
    """(N, M) per probe: the N values in order, each with M = the windows split in the divisor of
    the same place counted from the end (the largest N with all windows in one batch)."""
    ns = sorted(int(n) for n in n_values)
    ds = list(divisors)[-len(ns):]
    ds = [ds[0]] * (len(ns) - len(ds)) + ds  # more N than divisors: the smallest M repeats
    return [(n, max(1, math.ceil(windows / d))) for n, d in zip(ns, ds, strict=True)]


def section_points(check: Check, record: dict[str, Any], state: dict[str, Any]) -> None:
    from autotune.probe.isolation import prestart

    prestart()  # the probes' fork server imports torch and MONAI once
    points: list[dict[str, Any]] = []
    record["points"] = points
    info = check.results["sections"]["ct_data"]["bundles"]
    for algo, bundle in state["bundles"].items():
        for n, m in point_pairs(check.cfg["n_values"][algo], int(info[algo]["num_windows"]), check.cfg["sw_divisors"]):
            if check.left() < check.cfg["reserve_after_points_s"]:
                check.cut(record, f"{check.left():.0f} s left, kept for the edge and the contract")
                return
            point = measure_point(check, algo, bundle, n, m)
            points.append(point)
            if point["probe"]["status"] not in ("ok", "oom"):
                check.fail(record, f"{algo} N={n} M={m}: probe {point['probe']['status']} "
                                   f"{point['probe'].get('error_type')}")
            check.say(_point_line(point))
            check.save()


def measure_point(check: Check, algo: str, bundle: Path, n: int, m: int) -> dict[str, Any]:
    """One real probe at (N, M) and the estimator's figure for the same point."""
    from autotune.probe.estimate import estimate
    from autotune.probe.runner import run_probe

    timeout = min(check.cfg["probe_timeout"], max(20.0, check.left() - 10))
    res = run_probe(str(bundle), num_patches_per_iter=n, num_sw_batch_size=m, device=check.device, timeout=timeout)
    point: dict[str, Any] = {"algo": algo, "n": n, "m": m, "bundle": str(bundle), "roi_size": res.get("roi_size"),
                             "infer_volume_shape": res.get("infer_volume_shape"), "precision": res.get("precision"),
                             "probe": {"status": res.get("status"), "error_type": res.get("error_type"),
                                       "wall_seconds": res.get("wall_seconds"),
                                       "nvml_baseline_used_bytes": res.get("nvml_baseline_used_bytes"),
                                       "error_tail": (res.get("error_tail") or "")[-800:] or None},
                             "estimate_emulated": None}
    est: dict[str, Any] = {}
    try:
        est = estimate(str(bundle), num_patches_per_iter=n, num_sw_batch_size=m, device=check.device)
        point["estimate"] = {"semantics": est.get("semantics"), "seconds": est.get("seconds"), "error": None}
    except Exception as exc:  # noqa: BLE001 - a failed estimate is a result of the point
        point["estimate"] = {"semantics": None, "seconds": None, "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
        check.fail(check.results["sections"]["points"], f"{algo} N={n}: estimate {type(exc).__name__}")
    for phase in ("train", "infer"):
        point[phase] = _phase_record(res, est, phase, check.cuda)
    point["train"]["step_seconds"] = res.get("step_seconds_median")
    point["train"]["samples_per_s"] = res.get("samples_per_s")
    point["infer"]["seconds_per_volume"] = res.get("sw_seconds_per_volume")
    return point


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


def _point_line(p: dict[str, Any]) -> str:
    parts = [f"{p['algo']:<9} N={p['n']:<3} M={p['m']:<3} {p['probe']['status']}"]
    for phase in ("train", "infer"):
        ph = p[phase]
        measured = ph["max_memory_allocated"] or ph["tracked_peak_bytes"]
        parts.append(f"{phase} measured {format_bytes(measured)} reserved {format_bytes(ph['max_memory_reserved'])} "
                     f"est {format_bytes(ph['estimate_bytes'])}")
    return " | ".join(parts)


def calibration_rows(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
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


def section_calibrate(check: Check, record: dict[str, Any]) -> None:
    from autotune.probe.allowances import CudaAllowance, apply_allowance
    from autotune.probe.calibration import calibration_record, fit_allowance, write_calibration

    rows = calibration_rows(check.results["sections"].get("points", {}).get("points") or [])
    record["rows"] = rows
    if not rows:
        raise RuntimeError("no successful probe to calibrate from")
    fit = fit_allowance(rows)
    fitted = CudaAllowance(context_bytes=0, cudnn_workspace_bytes=int(fit["cudnn_workspace_bytes"]),
                           allocator_slack_fraction=float(fit["allocator_slack_fraction"]), source="fit")
    for row in rows:
        row["predicted_reserved_bytes"] = apply_allowance(row["estimate_bytes"], fitted, include_context=False)
        row["predicted_vs_reserved"] = row["predicted_reserved_bytes"] / row["reserved_bytes"] - 1
        row["estimate_vs_allocated"] = row["estimate_bytes"] / row["allocated_bytes"] - 1 if row["allocated_bytes"] else None
    by_template = {}
    for algo in sorted({r["algo"] for r in rows}):
        own = [r for r in rows if r["algo"] == algo]
        by_template[algo] = {"max_over_prediction": max(0.0, max(r["predicted_vs_reserved"] for r in own)),
                             "points": len(own)}
    record.update(fit=fit, by_template=by_template, rows_count=len(rows),
                  worst_estimate_vs_allocated=max(abs(r["estimate_vs_allocated"] or 0) for r in rows))
    cal = calibration_record(check.results["gpu"], fit, rows, "python benchmarks/gpu_check.py memory")
    cal["fit"]["by_template"] = by_template
    if check.dry_run:
        cal["dry_run"] = "CPU dry run: tracked peaks, not a device's memory; never install this file"
    record["file"] = str(write_calibration(check.out / "calibration", cal))
    check.say(f"   fit: workspace {format_bytes(fit['cudnn_workspace_bytes'])}, slack "
              f"{fit['allocator_slack_fraction']:.4f}, context {format_bytes(fit['context_bytes'])}, worst "
              f"over-prediction {fit['max_over_prediction']:.2%} -> {record['file']}")


def edge_limit(check: Check) -> str:
    """The tune's memory limit: a fixed fraction of the card (a fixed size on a dry run), never
    derived from the estimator's prediction."""
    if check.cfg["edge_limit"]:
        return str(check.cfg["edge_limit"])
    total = int(check.results["gpu"]["torch_total_memory"])
    return f"{int(total * float(check.cfg['edge_card_fraction'])) // 2**20}MiB"


def section_edge(check: Check, record: dict[str, Any], state: dict[str, Any]) -> None:
    algo = check.cfg["edge_algo"]
    bundle = copy_bundle(state["bundles"][algo], f"{algo}_edge")
    limit = edge_limit(check)
    storage = f"sqlite:///{check.work / 'edge_studies.db'}"
    (check.work / "edge_studies.db").unlink(missing_ok=True)
    summary_path = check.work / "edge_summary.json"
    summary_path.unlink(missing_ok=True)
    env = dict(check.env, AUTOTUNE_PROBE_EDGE="1")
    calibration = check.results["sections"].get("calibrate", {}).get("file")
    if calibration:  # tune with the allowances just fitted
        env["AUTOTUNE_CALIBRATION_DIR"] = str(Path(calibration).parent)
    lo, hi = check.cfg["edge_range"]
    cmd = [sys.executable, "-m", "autotune", "tune", str(bundle), "--device", check.device, "--memory-limit", limit,
           "--storage", storage, "--handoff", "largest", "--range-num-images-per-batch", str(lo), str(hi),
           "--validation-devices", "device", "--timeout", str(int(check.cfg["probe_timeout"])),
           "--summary", str(summary_path)]
    record.update(algo=algo, bundle=str(bundle), limit=limit, calibration_used=calibration,
                  limit_rule=(f"{check.cfg['edge_card_fraction']} of the card's memory" if not check.cfg["edge_limit"]
                              else f"fixed {check.cfg['edge_limit']} (dry run)"))
    t0 = time.monotonic()
    proc = check.run(cmd, "edge_tune", timeout=check.left() - check.cfg["needs_s"]["contract"], env=env)
    record["tune_seconds"] = round(time.monotonic() - t0, 1)
    record["tune_tail"] = ((proc.stdout or "") + (proc.stderr or ""))[-2500:]
    results = json.loads(summary_path.read_text(encoding="utf-8")).get("results") if summary_path.is_file() else None
    if not results:
        check.fail(record, "the tune wrote no summary")
        return
    entry = results[0]
    record.update({k: entry.get(k) for k in ("status", "memory_limit", "budget_bytes", "num_patches_per_iter",
                                             "max_num_patches_per_iter", "num_sw_batch_size", "peak_bytes",
                                             "train_peak_bytes", "infer_peak_bytes", "edge_check", "estimator_passes",
                                             "probes", "wall_seconds", "precision")})
    trials = study_trials(entry)
    record["trials"] = trials
    windows = check.results["sections"]["ct_data"]["bundles"][algo]["num_windows"]
    record["summary"] = edge_summary(entry, trials, (lo, hi), windows)
    if record["summary"]["train"]["why"] == "N or the one above was not probed":
        check.fail(record, "N+1 was not probed although AUTOTUNE_PROBE_EDGE=1: the edge is untested")
    if entry.get("status") == "tuned":
        state["tuned"] = bundle
    check.say(f"   edge: {record['summary']['line']}")


def study_trials(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """Every probe trial of the tune's two studies (training and sliding window), read back from its storage."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out = []
    for phase, name in (("train", entry.get("study_name")), ("infer", entry.get("infer_study_name"))):
        if not name:
            continue
        study = optuna.load_study(study_name=name, storage=entry["storage"])
        for t in study.trials:
            attrs = t.user_attrs
            out.append({"phase": phase, "trial": t.number, "state": t.state.name,
                        "n": t.params.get("num_patches_per_iter"), "m": t.params.get("num_sw_batch_size"),
                        "kind": attrs.get("kind"), "status": attrs.get("status"), "peak_bytes": attrs.get("peak_bytes"),
                        "budget_bytes": attrs.get("budget_bytes"), "verdict": attrs.get("verdict"),
                        "fail_reason": attrs.get("fail_reason")})
    return out


def edge_summary(entry: dict[str, Any], trials: list[dict[str, Any]], patches_range: tuple[int, int],
                 windows: int | None) -> dict[str, Any]:
    """N (the largest fit) and N+1, M and M+1, each with its probe, and whether the edge is exact:
    the probe at N fits and the probe one above does not (OOM or over the budget). ``windows`` (the
    sliding windows over the volume) is the top of M: a larger batch holds no more windows."""

    def probe_at(phase: str, key: str, value: int | None) -> dict[str, Any] | None:
        found = [t for t in trials if t["phase"] == phase and t["kind"] == "probe" and t[key] == value]
        return found[-1] if found else None

    def side(phase: str, key: str, value: int | None, top: int | None) -> dict[str, Any]:
        at, above = probe_at(phase, key, value), probe_at(phase, key, None if value is None else value + 1)
        out: dict[str, Any] = {key: value, "at": at, "above": above, "exact": None, "why": None}
        if value is None:
            out["why"] = "nothing fits"
        elif top is not None and value >= top:
            out["why"] = f"{value} is the top of the searched range: nothing above to probe"
        elif at is None or above is None:
            out["why"] = f"{'N' if phase == 'train' else 'M'} or the one above was not probed"
        else:
            out["exact"] = at["verdict"] == "fits" and above["verdict"] == "does not fit"
        return out

    n = entry.get("max_num_patches_per_iter")
    train = side("train", "n", n, patches_range[1])
    infer = side("infer", "m", entry.get("num_sw_batch_size"), windows)
    line = (f"N={n}: {(train['at'] or {}).get('status')}, N+1: {(train['above'] or {}).get('status')} "
            f"({(train['above'] or {}).get('verdict')}), exact {train['exact']}; M={infer['m']}: "
            f"{(infer['at'] or {}).get('status')}, M+1: {(infer['above'] or {}).get('verdict')}, exact {infer['exact']}")
    return {"train": train, "infer": infer, "line": line}


def section_contract(check: Check, record: dict[str, Any], state: dict[str, Any]) -> None:
    bundle: Path = state["tuned"]
    edge = check.results["sections"]["edge"]
    limit = edge["limit"]
    cmd = [sys.executable, "-m", "autotune", "train", str(bundle), "--device", check.device, "--epochs", "1",
           "--val-every", "1", "--memory-limit", limit, "--quiet"]
    t0 = time.monotonic()
    proc = check.run(cmd, "contract_train", timeout=check.left() - 5)
    record.update(bundle=str(bundle), limit=limit, rc=proc.returncode, seconds=round(time.monotonic() - t0, 1),
                  num_patches_per_iter=edge.get("num_patches_per_iter"), budget_bytes=edge.get("budget_bytes"),
                  tuned_peak_bytes=edge.get("peak_bytes"), tail=((proc.stdout or "") + (proc.stderr or ""))[-1500:])
    model = bundle / "model_fold0"
    summary = json.loads((model / "train_summary.json").read_text()) if (model / "train_summary.json").is_file() else {}
    rows = json.loads((model / "metrics.json").read_text()).get("rows") if (model / "metrics.json").is_file() else []
    record.update({k: summary.get(k) for k in ("train_peak_bytes", "train_peak_allocated_bytes", "val_peak_bytes",
                                               "val_peak_allocated_bytes", "epochs_run", "precision")})
    record.update(contract_verdict(record, rows or []))
    check.say(f"   contract: N={record['num_patches_per_iter']} train peak {format_bytes(record['train_peak_bytes'])} "
              f"val peak {format_bytes(record['val_peak_bytes'])} budget {format_bytes(record['budget_bytes'])} "
              f"tuned {format_bytes(record['tuned_peak_bytes'])} -> within budget {record['within_budget']}")


def contract_verdict(record: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The training peaks over the budget and over the tuned peak, and whether a full step of N ran
    (an epoch of fewer patches than N would not test the handed batch)."""
    budget, tuned = record.get("budget_bytes"), record.get("tuned_peak_bytes")
    peaks = [int(v) for v in (record.get("train_peak_bytes"), record.get("val_peak_bytes")) if v]
    peak = max(peaks) if peaks else None
    n = record.get("num_patches_per_iter")
    samples = sum(int(r.get("samples") or 0) for r in rows)
    return {
        "peak_bytes": peak,
        "peak_over_budget": peak / budget if peak and budget else None,
        "peak_over_tuned_peak": peak / tuned if peak and tuned else None,
        "within_budget": (peak <= budget) if peak and budget else None,
        "samples_trained": samples,
        "full_step_seen": bool(n) and samples >= int(n),
    }
