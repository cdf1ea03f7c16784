"""Call A of the GPU check, memory: the calibration (and the model on points it never saw), the contract
under half the card, MONAI's DiNTS, and expandable segments.

Sections, in order (each guarded by ``gpu_harness.Check.section``), each sized from what the first GPU
run measured (docs/gpu-check.md):

- ``calibrate``: ``autotune calibrate`` itself (a subprocess, as a user runs it) on a synthetic CT set at
  batch sizes the first run did not probe (``CALIBRATE_POINTS``); its report holds every point measured,
  each point predicted by the calibration shipped in the package before it was measured (``before``: the
  device model fitted on the first run, now on other N and M), the new fit and its file.
- ``plan``: ``autotune tune --strategy estimate`` of SegResNet (the calibration's bundle) under half the card
  (a fixed fraction, never the estimator's prediction) with the calibration just written: no probe, the
  device model decides every point (the first run already showed the probed edge exact).
- ``contract``: one epoch of ``autotune train`` of the planned bundle under the same limit, validated: the
  training and validation peaks against the budget and the plan's predicted peaks.
- ``monai_dints``: MONAI's official DiNTS (``BundleGen`` with MONAI's templates, carried in ``.gpu_data``),
  96^3 patches, fp16, on a set shaped as MSD Task02 made here (320 x 320 x 100-140 at 1.25 x 1.25 x 1.37
  mm): real peaks and the estimate at 8 and 16 patches, the device model's largest N under 80 GB (an A100
  80GB's memory, where MONAI states 8) and a probe at that N under that limit.
- ``expandable``: one of the first run's points again with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``,
  against the reserved peaks the first run measured without it (``FIRST_RUN``), and the device model's
  prediction for either setting.

The CUDA-hidden re-estimates (a machine without a GPU planning for this one) are left to the CPU
afterwards (``gpu_check.py install``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from autotune.utils import format_bytes
from benchmarks.gpu_data import copy_bundle
from benchmarks.gpu_harness import ROOT, Check

__all__ = ["FULL", "DRY", "run_memory", "contract_verdict", "monai_templates", "FIRST_RUN"]

#: the first run's measured max_memory_reserved (H200, no expandable segments): train, infer
FIRST_RUN = {("segresnet", 2, 8): (36586913792, 56480497664), ("unet", 8, 18): (9059696640, 12914262016)}
TEMPLATE_CANDIDATES = (ROOT / ".gpu_data" / "monai" / "algorithm_templates",
                       ROOT.parent / "shared" / "monai" / "algorithm_templates")

# Fixed by hand (never from the estimator): batch sizes the first run did not probe, two per template.
FULL: dict[str, Any] = {
    "calibrate_points": {"segresnet": (1, 3), "dints": (2, 8), "unet": (4, 16)}, "calibrate_templates": None,
    "probe_timeout": 90.0, "calibrate_seconds": 170.0,
    "plan_algo": "segresnet", "plan_card_fraction": 0.5, "plan_limit": None, "plan_range": (1, 64),
    "monai": {"cases": 3, "in_plane": 320, "depths": (100, 120, 140), "spacing": (1.25, 1.25, 1.37),
              "n_values": (8, 16), "phases": ("train", "infer"), "limit": "80GB", "shrink": None},
    "expandable": (("segresnet", 2, 8),),
    "needs_s": {"calibrate": 120.0, "plan": 20.0, "contract": 35.0, "monai_dints": 60.0, "expandable": 12.0},
}
DRY: dict[str, Any] = {
    "calibrate_points": {"segresnet": (1, 2)}, "calibrate_templates": ("segresnet",),  # calibrate asks for two
    "probe_timeout": 300.0, "calibrate_seconds": 600.0,
    "plan_algo": "segresnet", "plan_card_fraction": None, "plan_limit": "48MiB", "plan_range": (1, 64),
    # the dry run: one point, training only (MONAI's DiNTS validates slowly on a CPU)
    "monai": {"cases": 2, "in_plane": 48, "depths": (32, 40), "spacing": (1.25, 1.25, 1.37),
              "n_values": (1,), "phases": ("train",), "limit": "48MiB",
              "shrink": {"roi": [32, 32, 32], "channel_mul": 0.125}},
    "expandable": (("segresnet", 1, 8),),
    "needs_s": {"calibrate": 30.0, "plan": 20.0, "contract": 30.0, "monai_dints": 30.0, "expandable": 10.0},
}


def run_memory(check: Check) -> None:
    """Run call A's sections in order."""
    from autotune.probe.isolation import prestart

    prestart()  # this process's probes (MONAI's DiNTS, expandable) fork from a server preloaded meanwhile
    state: dict[str, Any] = {}
    needs = check.cfg["needs_s"]
    check.section("calibrate", lambda r: section_calibrate(check, r, state), needs["calibrate"])
    if state.get("bundles"):
        check.section("plan", lambda r: section_plan(check, r, state), needs["plan"])
        if state.get("tuned"):
            check.section("contract", lambda r: section_contract(check, r, state), needs["contract"])
    check.section("monai_dints", lambda r: section_monai_dints(check, r), needs["monai_dints"])
    if state.get("bundles"):
        check.section("expandable", lambda r: section_expandable(check, r, state), needs["expandable"])


def section_calibrate(check: Check, record: dict[str, Any], state: dict[str, Any]) -> None:
    """``autotune calibrate`` at the fixed points; its report in ``record`` (what install fits from)."""
    work, out = check.work / "calibrate", check.out / "calibration"
    report_path = check.work / "calibrate_report.json"
    report_path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "autotune", "calibrate", "--device", check.device, "--work", str(work),
           "--out", str(out), "--report", str(report_path), "--timeout", str(int(check.cfg["probe_timeout"])),
           "--max-seconds", str(int(min(check.cfg["calibrate_seconds"], check.left() - 60)))]
    for algo, ns in check.cfg["calibrate_points"].items():
        cmd += ["--points", f"{algo}={','.join(str(n) for n in ns)}"]
    if check.cfg["calibrate_templates"]:
        cmd += ["--templates", ",".join(check.cfg["calibrate_templates"])]
    if check.dry_run:
        cmd.append("--dry-run")
    env = dict(check.env)
    env.pop("AUTOTUNE_CALIBRATION_DIR", None)  # the calibration in force before: the package's
    proc = check.run(cmd, "calibrate", timeout=check.left() - 30, env=env)
    record["tail"] = ((proc.stdout or "") + (proc.stderr or ""))[-2500:]
    if not report_path.is_file():
        check.fail(record, "calibrate wrote no report")
        return
    report = json.loads(report_path.read_text(encoding="utf-8"))
    fit = report["fit"]
    record.update(points=report["points"], skipped=report.get("skipped"), before=report.get("before"),
                  file=report["file"], seconds_inside=report.get("seconds"), workspace=fit["workspace"],
                  fit={k: fit[k] for k in ("summary", "by_template", "point_factors", "leave_one_out", "fitted")})
    record["ct"] = {"shape": None, "spacing": None}
    source = Path(report["work"]) / "ct" / "dataset.json"
    state["bundles"] = {p.name.rsplit("_", 1)[0]: p for p in (Path(report["work"]) / "bundles").glob("*_0")}
    state["calibration"] = Path(report["file"])
    record["ct"] = _ct_facts(source)
    before = (report.get("before") or {}).get("summary") or {}
    check.say(f"   before ({(report.get('before') or {}).get('source')}): {before.get('within')} of "
              f"{before.get('points')} within 10%, worst {100 * before.get('max_under', 0):+.1f}% .. "
              f"{100 * before.get('max_over', 0):+.1f}%; new factors {fit['workspace']}")


def _ct_facts(index: Path) -> dict[str, Any]:
    """The CT set's first case's shape and spacing (what the re-estimates make again)."""
    import nibabel as nib

    case = json.loads(index.read_text(encoding="utf-8"))["training"][0]["image"]
    image = nib.load(str(index.parent / case))
    return {"shape": [int(s) for s in image.shape], "spacing": [round(float(s), 4) for s in image.header.get_zooms()],
            "cases": len(json.loads(index.read_text(encoding="utf-8"))["training"])}


def plan_limit(check: Check) -> str:
    """The plan's memory limit: a fixed fraction of the card (a fixed size on a dry run), never
    derived from the estimator's prediction."""
    if check.cfg["plan_limit"]:
        return str(check.cfg["plan_limit"])
    total = int(check.results["gpu"]["torch_total_memory"])
    return f"{int(total * float(check.cfg['plan_card_fraction'])) // 2**20}MiB"


def section_plan(check: Check, record: dict[str, Any], state: dict[str, Any]) -> None:
    """An estimate-only plan (``autotune tune --strategy estimate``: no probe, the device model with the
    calibration just written decides every point) of SegResNet under half the card."""
    algo = check.cfg["plan_algo"]
    bundle = copy_bundle(state["bundles"][algo], f"{algo}_plan")
    limit = plan_limit(check)
    storage = f"sqlite:///{check.work / 'plan_studies.db'}"
    (check.work / "plan_studies.db").unlink(missing_ok=True)
    summary_path = check.work / "plan_summary.json"
    summary_path.unlink(missing_ok=True)
    env = dict(check.env, AUTOTUNE_CALIBRATION_DIR=str(state["calibration"].parent))  # the calibration just written
    lo, hi = check.cfg["plan_range"]
    cmd = [sys.executable, "-m", "autotune", "tune", str(bundle), "--device", check.device, "--memory-limit", limit,
           "--strategy", "estimate", "--storage", storage, "--handoff", "largest",
           "--range-num-images-per-batch", str(lo), str(hi), "--validation-devices", "device",
           "--summary", str(summary_path)]
    record.update(algo=algo, bundle=str(bundle), limit=limit, calibration_used=str(state["calibration"]),
                  limit_rule=(f"{check.cfg['plan_card_fraction']} of the card's memory" if not check.cfg["plan_limit"]
                              else f"fixed {check.cfg['plan_limit']} (dry run)"))
    t0 = time.monotonic()
    proc = check.run(cmd, "plan_tune", timeout=check.left() - check.cfg["needs_s"]["contract"], env=env)
    record["tune_seconds"] = round(time.monotonic() - t0, 1)
    record["tune_tail"] = ((proc.stdout or "") + (proc.stderr or ""))[-2500:]
    results = json.loads(summary_path.read_text(encoding="utf-8")).get("results") if summary_path.is_file() else None
    if not results:
        check.fail(record, "the tune wrote no summary")
        return
    entry = results[0]
    record.update({k: entry.get(k) for k in ("status", "method", "memory_limit", "budget_bytes", "num_patches_per_iter",
                                             "max_num_patches_per_iter", "num_sw_batch_size", "peak_bytes",
                                             "train_peak_bytes", "infer_peak_bytes", "estimator_passes", "probes",
                                             "wall_seconds", "precision", "alloc_conf", "allowances", "batch")})
    if entry.get("status") == "tuned":
        state["tuned"] = bundle
    check.say(f"   plan: N={record.get('num_patches_per_iter')} (largest {record.get('max_num_patches_per_iter')}), "
              f"M={record.get('num_sw_batch_size')}, predicted peak {format_bytes(record.get('peak_bytes'))} of budget "
              f"{format_bytes(record.get('budget_bytes'))}")


def section_contract(check: Check, record: dict[str, Any], state: dict[str, Any]) -> None:
    bundle: Path = state["tuned"]
    plan = check.results["sections"]["plan"]
    limit = plan["limit"]
    cmd = [sys.executable, "-m", "autotune", "train", str(bundle), "--device", check.device, "--epochs", "1",
           "--val-every", "1", "--memory-limit", limit, "--quiet"]
    t0 = time.monotonic()
    proc = check.run(cmd, "contract_train", timeout=check.left() - 5)
    record.update(bundle=str(bundle), limit=limit, rc=proc.returncode, seconds=round(time.monotonic() - t0, 1),
                  num_patches_per_iter=plan.get("num_patches_per_iter"), num_sw_batch_size=plan.get("num_sw_batch_size"),
                  budget_bytes=plan.get("budget_bytes"), tuned_peak_bytes=plan.get("peak_bytes"),
                  predicted_train_bytes=plan.get("train_peak_bytes"), predicted_infer_bytes=plan.get("infer_peak_bytes"),
                  tail=((proc.stdout or "") + (proc.stderr or ""))[-1500:])
    model = bundle / "model_fold0"
    summary = json.loads((model / "train_summary.json").read_text()) if (model / "train_summary.json").is_file() else {}
    rows = json.loads((model / "metrics.json").read_text()).get("rows") if (model / "metrics.json").is_file() else []
    record.update({k: summary.get(k) for k in ("train_peak_bytes", "train_peak_allocated_bytes", "val_peak_bytes",
                                               "val_peak_allocated_bytes", "epochs_run", "precision", "alloc_conf")})
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


def monai_templates() -> Path | None:
    """MONAI's official templates: carried in ``.gpu_data/monai`` (``gpu_prepare.sh``), else ``../shared/monai``."""
    return next((p for p in TEMPLATE_CANDIDATES if (p / "dints" / "scripts" / "algo.py").is_file()), None)


def _monai_dints_bundle(check: Check, cfg: dict[str, Any], templates: Path) -> Path:
    """MONAI's DiNTS generated by ``autotune.BundleGen`` from MONAI's templates on the Heart-shaped set."""
    import contextlib
    import os

    import yaml

    import autotune
    from benchmarks.gpu_data import make_heart_dataset

    work = check.work / "monai"
    source = make_heart_dataset(work / "heart", cfg["cases"], cfg["in_plane"], cfg["depths"], cfg["spacing"])
    analysed = autotune.analyze(str(source), str(work), num_fold=1, progress=False)
    gen = autotune.BundleGen(algo_path=str(work), algos="dints", data_stats_filename=analysed.datastats,
                             data_src_cfg_name=analysed.data_src, templates_path_or_url=str(templates))
    cwd = os.getcwd()
    with contextlib.ExitStack() as stack:
        os.chdir(work)
        stack.callback(os.chdir, cwd)
        bundle = Path(gen.generate(str(work), num_fold=1)[0])
    if cfg["shrink"]:  # the dry run: a smaller search space and patch, as plain values in MONAI's configs
        network = bundle / "configs" / "network.yaml"
        data = yaml.safe_load(network.read_text())
        data["training_network"]["dints_space"]["channel_mul"] = cfg["shrink"]["channel_mul"]
        network.write_text(yaml.safe_dump(data, sort_keys=False))
        hyper = bundle / "configs" / "hyper_parameters.yaml"
        data = yaml.safe_load(hyper.read_text())
        data["training"]["roi_size"] = data["training"]["roi_size_valid"] = cfg["shrink"]["roi"]
        hyper.write_text(yaml.safe_dump(data, sort_keys=False))
    return bundle


def section_monai_dints(check: Check, record: dict[str, Any]) -> None:
    """MONAI's DiNTS at 8 and 16 patches: real peaks, the estimate, the model's largest N under the A100's 80 GB
    and a probe there under that limit."""
    from autotune.probe import allowance_for, estimate_on_device, run_probe
    from autotune.probe.runner import resolve_request
    from autotune.utils import parse_bytes

    cfg = check.cfg["monai"]
    templates = monai_templates()
    if templates is None:
        why = "MONAI's templates are neither in .gpu_data/monai nor ../shared/monai"
        if check.dry_run:  # a CPU dry run in a clone without ../shared: the section's code is what it checks
            record["not_at_hand"] = why
            check.say(f"   monai_dints: {why}; not run (a dry run)")
            return
        check.fail(record, f"{why}: run gpu_prepare.sh")
        return
    bundle = _monai_dints_bundle(check, cfg, templates)
    resolved = resolve_request(str(bundle), check_device=False)["config"]
    record.update(bundle=str(bundle), templates=str(templates), roi_size=list(resolved.roi_size),
                  precision=None, monai_figure={"gpu": "A100 80GB", "num_patches_per_iter": 8, "fitted": 9},
                  points=[])
    allowance = allowance_for(check.device) if check.cuda else None
    for n in cfg["n_values"]:
        res = run_probe(str(bundle), num_patches_per_iter=n, device=check.device, timeout=check.cfg["probe_timeout"],
                        phases=tuple(cfg["phases"]))
        point = {"n": n, "status": res.get("status"), "precision": res.get("precision"),
                 **{f"{p}_{f}": res.get(f"{p}_{f}") for p in ("train", "infer")
                    for f in ("cuda_max_memory_reserved", "cuda_max_memory_allocated", "peak_bytes")}}
        est = estimate_on_device(str(bundle), allowance or _cpu(), device=check.device, num_patches_per_iter=n,
                                 phases=tuple(cfg["phases"]))
        point.update(estimate_train_bytes=est.get("train_peak_bytes"), estimate_infer_bytes=est.get("infer_peak_bytes"),
                     model_train_reserved_bytes=est.get("train_device_reserved_bytes"),
                     model_infer_reserved_bytes=est.get("infer_device_reserved_bytes"), model=est.get("device_model"))
        record["points"].append(point)
        record["precision"] = record["precision"] or res.get("precision")
        check.say(f"   monai dints N={n}: {point['status']}, train peak {format_bytes(point['train_peak_bytes'])} "
                  f"(model {format_bytes(point['model_train_reserved_bytes'])}), infer peak "
                  f"{format_bytes(point['infer_peak_bytes'])} (model {format_bytes(point['model_infer_reserved_bytes'])})")
        check.save()
    limit = parse_bytes(cfg["limit"], "monai limit")
    largest = _largest_under(str(bundle), allowance or _cpu(), check.device, int(limit * 0.9), cfg["n_values"])
    record.update(limit=cfg["limit"], predicted_largest_n=largest, at_predicted={"status": None},
                  largest_n_that_trains=None)
    if largest:
        res = run_probe(str(bundle), num_patches_per_iter=largest, device=check.device, memory_limit=limit,
                        phases=("train",), timeout=check.cfg["probe_timeout"])
        record["at_predicted"] = {"n": largest, "status": res.get("status"), "train_peak_bytes": res.get("train_peak_bytes"),
                                  "limit_bytes": limit}
        record["largest_n_that_trains"] = largest if res.get("status") == "ok" else None
        check.say(f"   monai dints under {cfg['limit']}: the model's largest N {largest}: {res.get('status')}, "
                  f"peak {format_bytes(res.get('train_peak_bytes'))} (MONAI's figure on an A100 80GB: 8)")


def _cpu() -> Any:
    from autotune.probe import NO_ALLOWANCE

    return NO_ALLOWANCE


def _largest_under(bundle: str, allowance: Any, device: str, budget: int, measured: tuple[int, ...]) -> int | None:
    """The largest N whose training the device model puts under ``budget``, searched up to four times the
    largest N measured: over the training curve of one recorded trace (``autotune.probe.replay``) where it
    replays, else by bisection over point estimates."""
    from autotune.probe import (
        ReplayError,
        estimate,
        estimate_on_device,
        marker_batch,
        replay_of,
        resolve_request,
    )
    from autotune.search.curves.sparse import bisect_fits

    cfg = resolve_request(bundle, check_device=False)["config"]
    crops = cfg.num_crops_per_image
    factors = allowance.factors_for(cfg, device)[0] if str(device).startswith("cuda") else None
    try:
        traced = estimate(bundle, device=device, phases=("train",), num_patches_per_iter=marker_batch(crops),
                          record=True)
        replay = replay_of(traced, crops)
        if factors is not None:
            from autotune.search.curves.device import DeviceCurve

            curve: Any = DeviceCurve(replay, factors=factors, release=allowance.release_after_search)
        else:
            curve = replay
        peak = curve.predict
    except (ReplayError, ValueError):
        def peak(n: int) -> float:
            return float(estimate_on_device(bundle, allowance, device=device, num_patches_per_iter=n,
                                            phases=("train",))["device_peak_bytes"])
    top = 4 * max(measured)
    if peak(1) > budget:
        return None
    return top if peak(top) <= budget else int(bisect_fits(peak, 1, top, budget))


def section_expandable(check: Check, record: dict[str, Any], state: dict[str, Any]) -> None:
    """The first run's points again with expandable segments: measured reserved against the first run's, and
    the device model's prediction under each setting."""
    from autotune.probe import allowance_for, run_probe
    from autotune.probe.device_estimate import estimate_on_device

    conf = "expandable_segments:True"
    record.update(alloc_conf=conf, points=[])
    allowance = allowance_for(check.device) if check.cuda else _cpu()
    for algo, n, m in check.cfg["expandable"]:
        bundle = state["bundles"].get(algo)
        if bundle is None:
            continue
        res = run_probe(str(bundle), num_patches_per_iter=n, num_sw_batch_size=m, device=check.device,
                        timeout=check.cfg["probe_timeout"], env={"PYTORCH_CUDA_ALLOC_CONF": conf})
        point: dict[str, Any] = {"algo": algo, "n": n, "m": m, "status": res.get("status"),
                                 "child_alloc_conf": res.get("alloc_conf"), "first_run": FIRST_RUN.get((algo, n, m))}
        for phase in ("train", "infer"):
            point[f"{phase}_reserved"] = res.get(f"{phase}_cuda_max_memory_reserved") or res.get(f"{phase}_peak_bytes")
            point[f"{phase}_allocated"] = res.get(f"{phase}_cuda_max_memory_allocated")
        for setting, env in (("default", None), ("expandable", conf))[: 2 if check.cuda else 1]:
            saved = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
            if env:
                os.environ["PYTORCH_CUDA_ALLOC_CONF"] = env
            else:
                os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            try:
                est = estimate_on_device(str(bundle), allowance, device=check.device, num_patches_per_iter=n,
                                         num_sw_batch_size=m)
            finally:
                if saved is None:
                    os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
                else:
                    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = saved
            point[f"model_{setting}"] = {p: est.get(f"{p}_device_reserved_bytes") for p in ("train", "infer")}
        point.setdefault("model_expandable", point["model_default"])  # the CPU's model: the raw trace either way
        record["points"].append(point)
        first = point["first_run"] or (None, None)
        check.say(f"   expandable {algo} N={n} M={m}: {point['status']}, reserved train "
                  f"{format_bytes(point['train_reserved'])} (first run {format_bytes(first[0])}), infer "
                  f"{format_bytes(point['infer_reserved'])} (first run {format_bytes(first[1])})")
        check.save()
