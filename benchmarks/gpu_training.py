"""Call B of the GPU check, training: time to a Dice, fast against regular, in every precision; the hand-off; DDP.

Sections, in order (each guarded by ``gpu_harness.Check.section``), on the shared hippocampus
set with the full-size UNet and SegResNet:

- ``hippocampus_data``: the bundles (the set is checked before anything runs, in gpu_check.py).
- ``time_to_dice``: every training run at once on the one GPU (the first run used 4 % of the
  H200: runs this small leave it idle), each trained to a wall-clock budget and validated every
  epoch: ``autotune train --mode regular --max-time REGULAR`` and ``--mode fast --max-time FAST``
  (half of it, the goal's ratio; the fast schedule is fitted to its budget) for UNet and SegResNet,
  and UNet's fast run in fp16 with a GradScaler (the reference run, gradient norms recorded), in
  bf16 and in fp32, and compiled (``fast_training.compile: true``) in fp16 and in bf16. Per run: the wall time to mean Dice 0.80, the best Dice at fixed wall times,
  where an epoch's time goes (data wait, host-to-device, forward and backward, validation), the
  steps the GradScaler skipped; fast against regular (time to the target, samples/s) and each
  low precision's per-epoch distance from fp32; compiled against eager (its first call's seconds, time to the
  target and samples/s over the eager run's).
- ``handoff``: ``autotune tune --handoff goodput`` (its two probes: samples/s at the template's
  batch and at the largest fit, and its verdict), then ``--handoff largest`` from the same
  study (no new probe) and the fast budget at the largest fit: Dice per wall second against the
  reference run, the squared gradient norms per step at both batches and B_simple.
- ``ddp``: ``torchrun --nproc-per-node 1 -m autotune.trainer`` (NCCL, world size 1), one epoch:
  its training peak against the reference run's first epoch.
- ``oom_recovery`` (``gpu_oom.py``): UNet at a batch of 8, unconstrained, then under 0.6 x its training peak: it
  completes by stepping down; its step-downs, samples/s and Dice against the unconstrained run's.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from autotune.utils import format_bytes
from benchmarks.gpu_data import copy_bundle, generate, hippocampus_subset
from benchmarks.gpu_gradnorm import simple_noise_scale, steps_of
from benchmarks.gpu_harness import Check
from benchmarks.gpu_runs import TARGET_DICE, read_json_file, train_run

__all__ = ["FULL", "DRY", "run_training", "dice_per_wall", "noise_scale_of", "dice_distance", "compile_effect",
           "compiled_copy"]

FULL: dict[str, Any] = {
    # wall budgets of the first run's measured times: a training run took 35-47 s for 5 epochs, caching
    # and start included, so regular's 120 s is about 18 epochs and fast's 60 s about 12
    "algos": ("unet", "segresnet"), "subset_cases": None, "regular_s": 120.0, "fast_s": 60.0, "ddp_epochs": 1,
    "checkpoints_s": (30, 45, 60, 90, 120), "precisions": {"fp16": "fp16", "bf16": "bf16", "fp32": "fp32"},
    "train_limit": None, "handoff_limit": None, "handoff_range": None, "probe_timeout": 120.0,
    "oom_batch": 8, "oom_epochs": 3,
    "needs_s": {"hippocampus_data": 20.0, "time_to_dice": 135.0, "handoff": 100.0, "ddp": 25.0, "oom_recovery": 60.0},
}
DRY: dict[str, Any] = {
    # tiny bundles on an 8-case synthetic set on the CPU: every run trains one epoch (each is longer than its budget)
    "algos": ("unet", "segresnet"), "subset_cases": 10, "demo_cases": 8, "regular_s": 6.0, "fast_s": 3.0,
    "ddp_epochs": 1, "checkpoints_s": (3, 6),
    # no native bf16 on this CPU (emulated, ~100x slower): every label trains in fp32 on a dry run
    "precisions": {"fp16": "fp32", "bf16": "fp32", "fp32": "fp32"}, "train_limit": "2GiB", "handoff_limit": None,
    "handoff_range": (1, 3), "probe_timeout": 300.0,
    "oom_batch": 8, "oom_epochs": 1,
    "needs_s": {"hippocampus_data": 20.0, "time_to_dice": 60.0, "handoff": 60.0, "ddp": 30.0, "oom_recovery": 60.0},
}


def run_training(check: Check, hippocampus: Path | None) -> None:
    """Run call B's sections in order; ``hippocampus`` is the Decathlon folder (None on a dry run: demo data)."""
    state: dict[str, Any] = {}
    needs = check.cfg["needs_s"]
    check.section("hippocampus_data", lambda r: section_data(check, r, state, hippocampus), needs["hippocampus_data"])
    if not state.get("bundles"):
        return
    check.section("time_to_dice", lambda r: section_time_to_dice(check, r, state), needs["time_to_dice"])
    if "reference" not in state:
        return  # the later sections compare with the reference run
    check.section("handoff", lambda r: section_handoff(check, r, state), needs["handoff"])
    check.section("ddp", lambda r: section_ddp(check, r, state), needs["ddp"])
    from benchmarks.gpu_oom import section_oom_recovery

    check.section("oom_recovery", lambda r: section_oom_recovery(check, r, state), needs["oom_recovery"])


def section_data(check: Check, record: dict[str, Any], state: dict[str, Any], hippocampus: Path | None) -> None:
    from autotune.probe.runner import resolve_request

    if hippocampus is None:  # a dry run without the shared set
        from autotune.data.synthetic import make_demo_dataset

        source = make_demo_dataset(check.work / "demo", cases=int(check.cfg["demo_cases"]), size=32, classes=2)
        what = "synthetic demo set"
    elif check.cfg["subset_cases"]:
        source = hippocampus_subset(hippocampus, check.work / "hippocampus", int(check.cfg["subset_cases"]))
        what = f"the first {check.cfg['subset_cases']} cases of {hippocampus}"
    else:
        source, what = hippocampus, str(hippocampus)
    t0 = time.monotonic()
    bundles = generate(check.work / "work_hippocampus", source, check.cfg["algos"], tiny=check.dry_run)
    record.update(dataset=what, source=str(source), seconds=round(time.monotonic() - t0, 1),
                  preset="tiny" if check.dry_run else "full", bundles={})
    for algo, bundle in bundles.items():
        cfg = resolve_request(str(bundle), check_device=False)["config"]
        record["bundles"][algo] = {"bundle": str(bundle), "roi_size": list(cfg.roi_size),
                                   "num_patches_per_iter": cfg.num_patches_per_iter,
                                   "num_crops_per_image": cfg.num_crops_per_image}
    state["bundles"] = bundles


def train_group(check: Check, runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Train every run of ``runs`` (label -> ``train_run``'s keywords) at the same time, one thread each."""
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        futures = {label: pool.submit(train_run, check, label=label, **kwargs) for label, kwargs in runs.items()}
        return {label: future.result() for label, future in futures.items()}


def dice_distance(run: dict[str, Any], reference: dict[str, Any]) -> float | None:
    """The largest per-epoch distance between two runs' validation Dice over the epochs both validated."""
    mine = {e["epoch"]: e["mean_dice"] for e in run.get("epochs") or [] if e.get("mean_dice") is not None}
    theirs = {e["epoch"]: e["mean_dice"] for e in reference.get("epochs") or [] if e.get("mean_dice") is not None}
    common = sorted(set(mine) & set(theirs))
    return max(abs(mine[e] - theirs[e]) for e in common) if common else None


def compiled_copy(bundle: Path) -> Path:
    """A copy of ``bundle`` beside it that trains through ``torch.compile`` (``fast_training.compile: true``)."""
    import yaml

    copy = copy_bundle(bundle, f"{bundle.name}_compiled")
    path = copy / "configs" / "hyper_parameters.yaml"
    config = yaml.safe_load(path.read_text())
    config.setdefault("fast_training", {})["compile"] = True
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return copy


def compile_effect(compiled: dict[str, Any], eager: dict[str, Any]) -> dict[str, Any]:
    """A compiled run against the same run eager: whether it compiled, its first call's seconds, its time to the
    target over eager's and its steady samples/s over eager's (None where either lacks the figure)."""
    record = compiled.get("compile") or {}
    t_c, t_e = compiled.get("time_to_target_s"), eager.get("time_to_target_s")
    r_c, r_e = compiled.get("samples_per_s_median"), eager.get("samples_per_s_median")
    return {"used": record.get("used"), "reason": record.get("reason"), "first_call_s": record.get("first_call_s"),
            "setup_s": compiled.get("setup_s"), "eager_setup_s": eager.get("setup_s"),
            "time_to_target_over_eager": t_c / t_e if t_c and t_e else None,
            "samples_per_s_over_eager": r_c / r_e if r_c and r_e else None}


def section_time_to_dice(check: Check, record: dict[str, Any], state: dict[str, Any]) -> None:
    """Every run at once: fast (half the budget) against regular per template, and UNet's fast run in each
    precision; the reference run (UNet, fast, fp16) records its gradient norms for the hand-off."""
    cfg, bundles = check.cfg, state["bundles"]
    fast_s, regular_s = float(cfg["fast_s"]), float(cfg["regular_s"])
    runs: dict[str, dict[str, Any]] = {}
    for algo in cfg["algos"]:
        runs[f"{algo}_fast"] = dict(bundle=bundles[algo], mode="fast", precision=cfg["precisions"]["fp16"],
                                    max_time=fast_s, record_grads=algo == "unet")
        runs[f"{algo}_regular"] = dict(bundle=bundles[algo], mode="regular", precision=None, max_time=regular_s)
    for name in ("bf16", "fp32"):
        runs[f"unet_fast_{name}"] = dict(bundle=bundles["unet"], mode="fast", precision=cfg["precisions"][name],
                                         max_time=fast_s)
    compiled = compiled_copy(bundles["unet"])  # fast_training.compile: true, compile time inside the budget
    for name, label in (("fp16", "unet_fast_compiled"), ("bf16", "unet_fast_bf16_compiled")):
        runs[label] = dict(bundle=compiled, mode="fast", precision=cfg["precisions"][name], max_time=fast_s)
    record.update(target=TARGET_DICE, fast_s=fast_s, regular_s=regular_s, concurrent=len(runs))
    record["runs"] = train_group(check, runs)
    check.save()
    state["reference"] = record["runs"]["unet_fast"]
    record["fast_over_regular"] = {}
    for algo in cfg["algos"]:
        fast, regular = record["runs"][f"{algo}_fast"], record["runs"][f"{algo}_regular"]
        t_fast, t_regular = fast["time_to_target_s"], regular["time_to_target_s"]
        rate_fast, rate_regular = fast["samples_per_s_median"], regular["samples_per_s_median"]
        record["fast_over_regular"][algo] = {
            "time_to_target": t_fast / t_regular if t_fast and t_regular else None,
            "time_to_target_at_most": t_fast / regular_s if t_fast and not t_regular else None,
            "samples_per_s": rate_fast / rate_regular if rate_fast and rate_regular else None}
    record["compile"] = {name: compile_effect(record["runs"][compiled_label], record["runs"][eager_label])
                         for name, compiled_label, eager_label in (("fp16", "unet_fast_compiled", "unet_fast"),
                                                                   ("bf16", "unet_fast_bf16_compiled", "unet_fast_bf16"))}
    fp32 = record["runs"]["unet_fast_fp32"]
    record["precision"] = {
        "trained": {name: record["runs"][label].get("precision")
                    for name, label in (("fp16", "unet_fast"), ("bf16", "unet_fast_bf16"), ("fp32", "unet_fast_fp32"))},
        "dice_distance_from_fp32": {"fp16": dice_distance(record["runs"]["unet_fast"], fp32),
                                    "bf16": dice_distance(record["runs"]["unet_fast_bf16"], fp32)},
        "scaler_skipped_steps_fp16": record["runs"]["unet_fast"].get("scaler_skipped_steps")}


def _tune(check: Check, bundle: Path, handoff: str, storage: str) -> dict[str, Any] | None:
    """``autotune tune`` of ``bundle`` with the hand-off rule ``handoff``; its summary entry, or None."""
    summary = check.work / f"tune_{bundle.name}.json"
    summary.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "autotune", "tune", str(bundle), "--device", check.device, "--storage", storage,
           "--handoff", handoff, "--validation-devices", "device", "--timeout", str(int(check.cfg["probe_timeout"])),
           "--summary", str(summary)]
    if check.cfg["handoff_limit"]:
        cmd += ["--memory-limit", check.cfg["handoff_limit"]]
    if check.cfg["handoff_range"]:
        cmd += ["--range-num-images-per-batch", *(str(v) for v in check.cfg["handoff_range"])]
    check.run(cmd, f"tune_{handoff}", timeout=check.left() - 20)
    results = read_json_file(summary).get("results") or []
    return results[0] if results else None


def section_handoff(check: Check, record: dict[str, Any], state: dict[str, Any]) -> None:
    reference = state["reference"]
    bundle = state["bundles"]["unet"]
    db = check.work / "handoff_studies.db"
    db.unlink(missing_ok=True)
    storage = f"sqlite:///{db}"
    goodput = _tune(check, copy_bundle(bundle, "unet_handoff"), "goodput", storage)
    if goodput is None:
        check.fail(record, "the goodput tune wrote no summary")
        return
    record.update(verdict=goodput.get("handoff"), batch=goodput.get("batch"),
                  largest_fit=goodput.get("max_num_patches_per_iter"), handed=goodput.get("num_patches_per_iter"),
                  reference_batch=reference.get("num_patches_per_iter"))
    check.say(f"   verdict: {(goodput.get('handoff') or {}).get('line')}")
    largest_bundle = copy_bundle(bundle, "unet_largest_tuned")
    largest = _tune(check, largest_bundle, "largest", storage)  # the study's points: no new probe
    n_large = (largest or {}).get("num_patches_per_iter")
    record["largest_tune_probes"] = (largest or {}).get("probes")
    if not n_large or n_large <= int(reference.get("num_patches_per_iter") or 0):
        record["runs"] = {"reference": "time_to_dice.runs.unet_fast", "largest": None}
        record["why_no_largest_run"] = f"the largest fit ({n_large}) is not above the template's batch"
        return
    run = train_run(check, largest_bundle, "unet_largest", mode="fast", max_time=float(check.cfg["fast_s"]),
                    precision=check.cfg["precisions"]["fp16"], record_grads=True)
    record["runs"] = {"reference": "time_to_dice.runs.unet_fast", "largest": run}
    record["dice_per_wall"] = dice_per_wall({"reference": reference, "largest": run})
    record["grad_sq_norms"] = {name: _grad_steps(r) for name, r in (("reference", reference), ("largest", run))}
    record["noise_scale"] = noise_scale_of(reference, run)
    ns = record["noise_scale"]["all_steps"]
    check.say(f"   Dice per wall: winner {record['dice_per_wall']['winner']}; B_simple {ns['b_simple']} "
              f"({ns['why'] or 'from ' + str(ns['steps_small']) + ' + ' + str(ns['steps_big']) + ' steps'})")


def _grad_steps(run: dict[str, Any]) -> dict[str, Any]:
    path = run.get("grads_file")
    steps = read_json_file(Path(path)).get("steps") if path else None
    return {"patches_per_step": run.get("num_patches_per_iter"), "steps": steps}


def dice_per_wall(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each run's validated epochs (cumulative training seconds, wall since its start, Dice), the best Dice
    each reached by the wall time of the shorter run, the last Dice per wall second, and the winner."""
    curves: dict[str, list[dict[str, Any]]] = {}
    for name, run in runs.items():
        total, points = 0.0, []
        for e in run.get("epochs") or []:
            total += float(e.get("train_s") or 0.0)
            if e.get("mean_dice") is not None and e.get("elapsed_s"):
                points.append({"epoch": e["epoch"], "train_s_cum": round(total, 2), "elapsed_s": e["elapsed_s"],
                               "mean_dice": e["mean_dice"]})
        curves[name] = points
    common = min(c[-1]["elapsed_s"] for c in curves.values()) if all(curves.values()) and curves else None
    at_common = {name: (max((p["mean_dice"] for p in c if p["elapsed_s"] <= common), default=None)
                        if common is not None else None) for name, c in curves.items()}
    per_s = {name: (c[-1]["mean_dice"] / c[-1]["elapsed_s"] if c else None) for name, c in curves.items()}
    known = {name: v for name, v in at_common.items() if v is not None}
    winner = max(known, key=lambda k: known[k]) if len(known) == len(runs) and len(set(known.values())) > 1 else None
    return {"curves": curves, "common_wall_s": common, "dice_at_common_wall": at_common,
            "dice_per_wall_s": per_s, "winner": winner}


def noise_scale_of(reference: dict[str, Any], large: dict[str, Any]) -> dict[str, Any]:
    """B_simple (``gpu_gradnorm.simple_noise_scale``) from the two runs' steps of their nominal batch:
    all steps, and the steps after each run's first epoch (gradients settle after the warm-up)."""
    b_small, b_big = int(reference.get("num_patches_per_iter") or 0), int(large.get("num_patches_per_iter") or 0)
    if not reference.get("grads_file") or not large.get("grads_file"):
        empty = simple_noise_scale([], b_small, [], b_big)
        return {"all_steps": empty, "after_first_epoch": empty}
    small, big = steps_of(Path(reference["grads_file"]), b_small), steps_of(Path(large["grads_file"]), b_big)

    def first_epoch_steps(run: dict[str, Any]) -> int:
        epochs = run.get("epochs") or []
        return int(epochs[0].get("steps") or 0) if epochs else 0

    return {"all_steps": simple_noise_scale(small, b_small, big, b_big),
            "after_first_epoch": simple_noise_scale(small[first_epoch_steps(reference):], b_small,
                                                    big[first_epoch_steps(large):], b_big)}


def section_ddp(check: Check, record: dict[str, Any], state: dict[str, Any]) -> None:
    reference = state["reference"]
    run = train_run(check, state["bundles"]["unet"], "unet_ddp", mode="fast", epochs=check.cfg["ddp_epochs"],
                    val_every=1000, precision=check.cfg["precisions"]["fp16"], ddp=True)
    single, ddp = reference.get("first_epoch_train_peak_bytes"), run.get("first_epoch_train_peak_bytes")
    record.update(run=run, launcher="torchrun --nproc-per-node 1 -m autotune.trainer", world_size=run.get("world_size"),
                  nccl_seen=run.get("nccl_seen"), ddp_first_epoch_train_peak_bytes=ddp,
                  single_first_epoch_train_peak_bytes=single,
                  ddp_over_single_peak=ddp / single if ddp and single else None)
    check.say(f"   ddp peak {format_bytes(ddp)} against single-process {format_bytes(single)}")
