"""One training run of the GPU check's call B, and what a run's record holds: ``train_run``, ``run_summary``.

Shared by the training sections (``gpu_training.py``) and the out-of-memory recovery (``gpu_oom.py``), which both
train through it; neither imports the other.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from autotune.utils import format_bytes
from benchmarks.common import LoadSampler
from benchmarks.gpu_data import copy_bundle
from benchmarks.gpu_harness import Check

__all__ = ["TARGET_DICE", "train_run", "run_summary", "time_to_target", "best_by", "read_json_file"]

TARGET_DICE = 0.80


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


def train_run(check: Check, bundle: Path, label: str, *, mode: str, precision: str | None,
              max_time: float | None = None, epochs: int | None = None, val_every: int = 1,
              record_grads: bool = False, ddp: bool = False, memory_limit: str | None = None) -> dict[str, Any]:
    """Train a private copy of ``bundle`` (named ``label``) to a wall budget (``max_time``: the schedule
    fitted to it) or for ``epochs``, under ``memory_limit`` (default the call's); returns its run record
    (``run_summary``)."""
    copy = copy_bundle(bundle, label)
    grads = check.work / f"grads_{label}.json"
    grads.unlink(missing_ok=True)
    length = ["--max-time", f"{max_time:g}s"] if max_time is not None else ["--epochs", str(epochs)]
    args = [str(copy), "--device", check.device, "--mode", mode, *length, "--val-every", str(val_every), "--quiet"]
    args += ["--precision", precision] if precision else []
    limit = memory_limit or check.cfg["train_limit"]
    args += ["--memory-limit", limit] if limit else []
    if ddp:
        env = dict(check.env, NCCL_DEBUG="INFO")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "-m", "autotune.trainer", *args]
    elif record_grads:
        env, cmd = check.env, [sys.executable, "-m", "benchmarks.gpu_gradnorm", "--out", str(grads),
                               "--", *args]
    else:
        env, cmd = check.env, [sys.executable, "-m", "autotune.trainer", *args]
    t0 = time.monotonic()
    with _UtilSampler(check.cuda) as util, LoadSampler() as load:
        proc = check.run(cmd, f"train_{label}", timeout=check.left() - 3, env=env)
    model = copy / "model_fold0"
    run = run_summary(read_json_file(model / "metrics.json").get("rows") or [], read_json_file(model / "train_summary.json"))
    text = (proc.stdout or "") + (proc.stderr or "")
    run.update(label=label, bundle=str(copy), mode=mode, precision_asked=precision, rc=proc.returncode,
               max_time_s=max_time, wall_s=round(time.monotonic() - t0, 1), gpu_util_mean=util.mean(),
               load=load.summary(), num_patches_per_iter=_num_patches_per_iter(copy),
               tail=text[-800:], grads_file=str(grads) if grads.is_file() else None)
    run.update(time_to_target_s=time_to_target(run), best_by_s=best_by(run, check.cfg["checkpoints_s"]))
    if ddp:
        run["nccl_seen"] = "NCCL INFO" in text
    check.say(f"   {label}: rc={run['rc']} samples/s {run['samples_per_s_median']} peak "
              f"{format_bytes(run['train_peak_bytes'])} Dice {run['mean_dice_last']} to {TARGET_DICE}: "
              f"{run['time_to_target_s']} s ({run['wall_s']} s)")
    return run


def read_json_file(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _num_patches_per_iter(bundle: Path) -> int:
    from autotune.bundles.config import load_bundle_config

    return load_bundle_config(bundle).num_patches_per_iter


def run_summary(rows: list[dict[str, Any]], summary: dict[str, Any]) -> dict[str, Any]:
    """A run's epochs (time and where it went, samples/s, Dice, peaks) and what the sections compare: the
    median samples/s after the first epoch (all epochs when there is one), the largest training peak, the
    last Dice, the steps the GradScaler skipped and how the schedule was set."""
    keys = ("epoch", "train_s", "samples", "steps", "samples_per_s", "data_wait_s", "data_wait_share", "h2d_s",
            "compute_s", "scaler_skipped_steps", "val_s", "mean_dice", "elapsed_s", "lr", "train_peak_bytes",
            "train_peak_allocated_bytes", "val_peak_bytes", "world_size")
    epochs = [{k: r.get(k) for k in keys} for r in rows]
    rates = [e["samples_per_s"] for e in epochs if e["samples_per_s"]]
    steady = rates[1:] or rates
    peaks = [int(e["train_peak_bytes"]) for e in epochs if e["train_peak_bytes"]]
    dice = [e["mean_dice"] for e in epochs if e["mean_dice"] is not None]
    later = epochs[1:] or epochs  # the first epoch pays one-off set-up
    phases = {key: (statistics.fmean(float(e.get(key) or 0.0) for e in later) if later else None)
              for key in ("data_wait_s", "h2d_s", "compute_s", "val_s", "train_s")}
    return {"epochs": epochs, "samples_per_s_median": statistics.median(steady) if steady else None,
            "train_peak_bytes": max(peaks) if peaks else None,
            "first_epoch_train_peak_bytes": epochs[0]["train_peak_bytes"] if epochs else None,
            "mean_dice_last": dice[-1] if dice else None, "best_metric": summary.get("best_metric"),
            "precision": summary.get("precision"), "world_size": summary.get("world_size"),
            "epochs_run": summary.get("epochs_run"), "schedule": summary.get("schedule"),
            "phases_mean_s": phases, "setup_s": summary.get("setup_s"),
            "compile": (summary.get("techniques") or {}).get("compile"),
            "scaler_skipped_steps": sum(int(e.get("scaler_skipped_steps") or 0) for e in epochs)}


def time_to_target(run: dict[str, Any], target: float = TARGET_DICE) -> float | None:
    """Wall seconds from the run's start (caching included) to its first validation at ``target`` or above."""
    return next((e["elapsed_s"] for e in run.get("epochs") or []
                 if e.get("mean_dice") is not None and e["mean_dice"] >= target), None)


def best_by(run: dict[str, Any], seconds: Any) -> dict[str, float | None]:
    """The best validation Dice within each of ``seconds`` of wall time (None: no validation by then)."""
    points = [(e["elapsed_s"], e["mean_dice"]) for e in run.get("epochs") or [] if e.get("mean_dice") is not None]
    return {str(s): max((d for t, d in points if t <= s), default=None) for s in seconds}
