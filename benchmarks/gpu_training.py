"""Call B of the GPU check, training: fast against regular, the hand-off's two batches, fp16 against bf16, DDP.

Sections, in order (each guarded by ``gpu_harness.Check.section``), on the shared hippocampus
set with the full-size UNet and SegResNet:

- ``hippocampus_data``: the bundles (the set is checked before anything runs, in gpu_check.py).
- ``fast_regular``: ``autotune train --mode fast`` against ``--mode regular``, samples/s per epoch,
  for UNet and SegResNet. UNet's fast run (fp16 with a GradScaler, the template's batch,
  validated every epoch, gradient norms recorded) is the reference run the later sections
  compare with, so it runs once.
- ``handoff``: ``autotune tune --handoff goodput`` (its two probes: samples/s at the template's
  batch and at the largest fit, and its verdict), then ``--handoff largest`` from the same
  study (no new probe) and as many epochs at the largest fit as the reference run: Dice per
  wall second of each, the squared gradient norms per step at both batches and B_simple.
- ``precision``: the reference run again in bf16 (no scaler): epoch time, peak, Dice.
- ``ddp``: ``torchrun --nproc-per-node 1 -m autotune.trainer`` (NCCL, world size 1), one epoch:
  its training peak against the reference run's first epoch.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from common import LoadSampler
from gpu_data import copy_bundle, generate, hippocampus_subset
from gpu_gradnorm import simple_noise_scale, steps_of
from gpu_harness import Check

from autotune.utils import format_bytes

__all__ = ["FULL", "DRY", "run_training", "run_summary", "dice_per_wall", "noise_scale_of"]

FULL: dict[str, Any] = {
    "algos": ("unet", "segresnet"), "subset_cases": None, "epochs": 5, "fr_epochs": 3, "ddp_epochs": 1,
    "precisions": {"fp16": "fp16", "bf16": "bf16"}, "train_limit": None, "handoff_limit": None,
    "handoff_range": None, "probe_timeout": 120.0,
    "needs_s": {"hippocampus_data": 20.0, "fast_regular": 40.0, "handoff": 80.0, "precision": 35.0, "ddp": 25.0},
}
DRY: dict[str, Any] = {
    "algos": ("unet", "segresnet"), "subset_cases": 10, "epochs": 2, "fr_epochs": 1, "ddp_epochs": 1,
    # no native bf16 on this CPU (emulated, ~100x slower): both labels train in fp32 on a dry run
    "precisions": {"fp16": "fp32", "bf16": "fp32"}, "train_limit": "2GiB", "handoff_limit": None,
    "handoff_range": (1, 3), "probe_timeout": 300.0,
    "needs_s": {"hippocampus_data": 20.0, "fast_regular": 40.0, "handoff": 60.0, "precision": 30.0, "ddp": 30.0},
}


def run_training(check: Check, hippocampus: Path | None) -> None:
    """Run call B's sections in order; ``hippocampus`` is the Decathlon folder (None on a dry run: demo data)."""
    state: dict[str, Any] = {}
    needs = check.cfg["needs_s"]
    check.section("hippocampus_data", lambda r: section_data(check, r, state, hippocampus), needs["hippocampus_data"])
    if not state.get("bundles"):
        return
    check.section("fast_regular", lambda r: section_fast_regular(check, r, state), needs["fast_regular"])
    check.section("handoff", lambda r: section_handoff(check, r, state), needs["handoff"])
    check.section("precision", lambda r: section_precision(check, r, state), needs["precision"])
    check.section("ddp", lambda r: section_ddp(check, r, state), needs["ddp"])


def section_data(check: Check, record: dict[str, Any], state: dict[str, Any], hippocampus: Path | None) -> None:
    from autotune.probe.runner import resolve_request

    if hippocampus is None:  # a dry run without the shared set
        from autotune.data.synthetic import make_demo_dataset

        source, what = make_demo_dataset(check.work / "demo", cases=12, size=32, classes=2), "synthetic demo set"
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
        record["bundles"][algo] = {"bundle": str(bundle), "roi_size": cfg.get("roi_size"),
                                   "num_patches_per_iter": cfg.get("num_patches_per_iter"),
                                   "num_crops_per_image": cfg.get("num_crops_per_image")}
    state["bundles"] = bundles


class _UtilSampler:
    """NVML utilisation every 0.2 s in a thread (nothing on the CPU)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled, self.samples, self._stop = enabled, [], threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        while not self._stop.is_set():
            self.samples.append(int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            time.sleep(0.2)
        pynvml.nvmlShutdown()

    def __enter__(self) -> _UtilSampler:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self.enabled:
            self._thread.join(timeout=5)

    def mean(self) -> float | None:
        return statistics.fmean(self.samples) if self.samples else None


def train_run(check: Check, bundle: Path, label: str, *, mode: str, epochs: int, val_every: int,
              precision: str | None, record_grads: bool = False, ddp: bool = False) -> dict[str, Any]:
    """Train a private copy of ``bundle`` (named ``label``); returns its run record (``run_summary``)."""
    copy = copy_bundle(bundle, label)
    grads = check.work / f"grads_{label}.json"
    grads.unlink(missing_ok=True)
    args = [str(copy), "--device", check.device, "--mode", mode, "--epochs", str(epochs), "--val-every",
            str(val_every), "--quiet"]
    args += ["--precision", precision] if precision else []
    args += ["--memory-limit", check.cfg["train_limit"]] if check.cfg["train_limit"] else []
    if ddp:
        env = dict(check.env, NCCL_DEBUG="INFO")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "-m", "autotune.trainer", *args]
    elif record_grads:
        env, cmd = check.env, [sys.executable, str(Path(__file__).parent / "gpu_gradnorm.py"), "--out", str(grads),
                               "--", *args]
    else:
        env, cmd = check.env, [sys.executable, "-m", "autotune.trainer", *args]
    t0 = time.monotonic()
    with _UtilSampler(check.cuda) as util, LoadSampler() as load:
        proc = check.run(cmd, f"train_{label}", timeout=check.left() - 3, env=env)
    model = copy / "model_fold0"
    run = run_summary(_read(model / "metrics.json").get("rows") or [], _read(model / "train_summary.json"))
    text = (proc.stdout or "") + (proc.stderr or "")
    run.update(label=label, bundle=str(copy), mode=mode, precision_asked=precision, rc=proc.returncode,
               wall_s=round(time.monotonic() - t0, 1), gpu_util_mean=util.mean(), load=load.summary(),
               num_patches_per_iter=_config_value(copy, "num_patches_per_iter"), tail=text[-800:],
               grads_file=str(grads) if grads.is_file() else None)
    if ddp:
        run["nccl_seen"] = "NCCL INFO" in text
    check.say(f"   {label}: rc={run['rc']} samples/s {run['samples_per_s_median']} peak "
              f"{format_bytes(run['train_peak_bytes'])} Dice {run['mean_dice_last']} ({run['wall_s']} s)")
    return run


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _config_value(bundle: Path, key: str) -> Any:
    from autotune.bundles.config import load_bundle_config

    return load_bundle_config(bundle).get(key)


def run_summary(rows: list[dict[str, Any]], summary: dict[str, Any]) -> dict[str, Any]:
    """A run's epochs (time, samples/s, Dice, peaks) and what the sections compare: the median samples/s
    after the first epoch (all epochs when there is one), the largest training peak, the last Dice."""
    keys = ("epoch", "train_s", "samples", "steps", "samples_per_s", "data_wait_share", "val_s", "mean_dice",
            "elapsed_s", "train_peak_bytes", "train_peak_allocated_bytes", "val_peak_bytes", "world_size")
    epochs = [{k: r.get(k) for k in keys} for r in rows]
    rates = [e["samples_per_s"] for e in epochs if e["samples_per_s"]]
    steady = rates[1:] or rates
    peaks = [int(e["train_peak_bytes"]) for e in epochs if e["train_peak_bytes"]]
    dice = [e["mean_dice"] for e in epochs if e["mean_dice"] is not None]
    return {"epochs": epochs, "samples_per_s_median": statistics.median(steady) if steady else None,
            "train_peak_bytes": max(peaks) if peaks else None,
            "first_epoch_train_peak_bytes": epochs[0]["train_peak_bytes"] if epochs else None,
            "mean_dice_last": dice[-1] if dice else None, "best_metric": summary.get("best_metric"),
            "precision": summary.get("precision"), "world_size": summary.get("world_size"),
            "epochs_run": summary.get("epochs_run")}


def reference_run(check: Check, state: dict[str, Any]) -> dict[str, Any]:
    """UNet, fast, fp16 with a GradScaler, the template's batch, validated every epoch, gradient norms
    recorded: trained once, compared with by every section after it."""
    if "reference" not in state:
        state["reference"] = train_run(check, state["bundles"]["unet"], "unet_fast_fp16", mode="fast",
                                       epochs=check.cfg["epochs"], val_every=1,
                                       precision=check.cfg["precisions"]["fp16"], record_grads=True)
    return state["reference"]


def section_fast_regular(check: Check, record: dict[str, Any], state: dict[str, Any]) -> None:
    record["runs"], record["speedup"] = {}, {}
    for algo in check.cfg["algos"]:
        for mode in ("fast", "regular"):
            if check.left() < 15:
                check.cut(record, f"{check.left():.0f} s left")
                return
            if algo == "unet" and mode == "fast":
                run = reference_run(check, state)
            else:
                run = train_run(check, state["bundles"][algo], f"{algo}_{mode}", mode=mode,
                                epochs=check.cfg["fr_epochs"], val_every=1000,
                                precision=check.cfg["precisions"]["fp16"] if mode == "fast" else None)
            record["runs"][f"{algo}_{mode}"] = run
            check.save()
        fast, regular = record["runs"][f"{algo}_fast"], record["runs"][f"{algo}_regular"]
        if fast["samples_per_s_median"] and regular["samples_per_s_median"]:
            record["speedup"][algo] = fast["samples_per_s_median"] / regular["samples_per_s_median"]


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
    results = _read(summary).get("results") or []
    return results[0] if results else None


def section_handoff(check: Check, record: dict[str, Any], state: dict[str, Any]) -> None:
    reference = reference_run(check, state)
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
        record["runs"] = {"reference": "fast_regular.runs.unet_fast", "largest": None}
        record["why_no_largest_run"] = f"the largest fit ({n_large}) is not above the template's batch"
        return
    run = train_run(check, largest_bundle, "unet_largest", mode="fast", epochs=check.cfg["epochs"], val_every=1,
                    precision=check.cfg["precisions"]["fp16"], record_grads=True)
    record["runs"] = {"reference": "fast_regular.runs.unet_fast", "largest": run}
    record["dice_per_wall"] = dice_per_wall({"reference": reference, "largest": run})
    record["grad_sq_norms"] = {name: _grad_steps(r) for name, r in (("reference", reference), ("largest", run))}
    record["noise_scale"] = noise_scale_of(reference, run)
    ns = record["noise_scale"]["all_steps"]
    check.say(f"   Dice per wall: winner {record['dice_per_wall']['winner']}; B_simple {ns['b_simple']} "
              f"({ns['why'] or 'from ' + str(ns['steps_small']) + ' + ' + str(ns['steps_big']) + ' steps'})")


def _grad_steps(run: dict[str, Any]) -> dict[str, Any]:
    path = run.get("grads_file")
    steps = _read(Path(path)).get("steps") if path else None
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


def section_precision(check: Check, record: dict[str, Any], state: dict[str, Any]) -> None:
    import torch

    reference = reference_run(check, state)
    bf16 = train_run(check, state["bundles"]["unet"], "unet_fast_bf16", mode="fast", epochs=check.cfg["epochs"],
                     val_every=1, precision=check.cfg["precisions"]["bf16"], record_grads=True)
    record["runs"] = {"fp16": "fast_regular.runs.unet_fast", "bf16": bf16}
    record["bf16_supported"] = bool(torch.cuda.is_bf16_supported()) if check.cuda else False
    record["precisions_trained"] = {"fp16": reference.get("precision"), "bf16": bf16.get("precision")}
    ref_rate, rate = reference.get("samples_per_s_median"), bf16.get("samples_per_s_median")
    ref_peak, peak = reference.get("train_peak_bytes"), bf16.get("train_peak_bytes")
    record.update(bf16_over_fp16_samples_per_s=rate / ref_rate if rate and ref_rate else None,
                  bf16_over_fp16_train_peak=peak / ref_peak if peak and ref_peak else None,
                  mean_dice_last={"fp16": reference.get("mean_dice_last"), "bf16": bf16.get("mean_dice_last")},
                  dice_per_wall=dice_per_wall({"fp16": reference, "bf16": bf16}))


def section_ddp(check: Check, record: dict[str, Any], state: dict[str, Any]) -> None:
    reference = reference_run(check, state)
    run = train_run(check, state["bundles"]["unet"], "unet_ddp", mode="fast", epochs=check.cfg["ddp_epochs"],
                    val_every=1000, precision=check.cfg["precisions"]["fp16"], ddp=True)
    single, ddp = reference.get("first_epoch_train_peak_bytes"), run.get("first_epoch_train_peak_bytes")
    record.update(run=run, launcher="torchrun --nproc-per-node 1 -m autotune.trainer", world_size=run.get("world_size"),
                  nccl_seen=run.get("nccl_seen"), ddp_first_epoch_train_peak_bytes=ddp,
                  single_first_epoch_train_peak_bytes=single,
                  ddp_over_single_peak=ddp / single if ddp and single else None)
    check.say(f"   ddp peak {format_bytes(ddp)} against single-process {format_bytes(single)}")
