"""What an out-of-memory costs once training steps down instead of ending: split against unsplit, on the CPU.

The full-size UNet template (no preset) on the first CASES hippocampus cases (one fold, a seeded fifth held out),
trained twice with the same seed:

- **training**: at a given batch of ``--batch`` patches per pass (default 8: a batch a limit L would be tuned to;
  at the template's 2, 0.6 of its peak holds no pass of one patch either, since the weights and optimizer state
  stay whole), first under a limit it never meets (the tracker counts, nothing binds): its measured training
  peak P stands for the tuned peak (L = P). Then under ``--fraction`` x P (default 0.6), where that batch cannot
  fit whole, so its passes run in micro-batches.
- **validation**: the same template with a ``--val-roi`` patch (default 32^3, so that a validation volume is
  about 12 windows: at the template's patch a hippocampus volume is one window, which no window batch changes),
  one patch per pass (so that validation, not training, holds the peak) and a sliding-window batch of
  ``--val-sw`` (default 12), unconstrained, then under a limit halfway between the validation peaks at window
  batch 1 and ``--val-sw`` (and above the training peak), so that validation steps its window batch down. On the
  CPU the volume is on the CPU already: that step is not taken.

Each run is ``autotune train`` in a process of its own. Reported per run: seconds per epoch (training, validation;
and the mean after the first epoch, which pays the process's set-up), the mean Dice at every epoch, the micro-batches and
window batch in force, the step-downs (each a failed attempt: the steps lost to the OOM itself) and the applied
steps against the unsplit run's. Memory is the tracker's count of live tensor bytes, as the CPU probe counts it,
not the RSS; times on a shared 2-core CPU are noisy (the load during each run is recorded).

    python -m benchmarks.bench_oom_recovery [--data ../shared/datasets/Task04_Hippocampus] [--cases 12] [--epochs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    HIPPOCAMPUS,
    LoadSampler,
    command,
    environment,
    first_cases,
    fresh_copy,
    generate_bundles,
    metrics_rows,
    parser,
    report,
)

NEVER_BINDS = 64 * 2**30  # the tracker counts under a limit; this one is never met


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f}"


def _dice(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def markdown_table(report: dict[str, Any]) -> str:
    """One row per run and epoch: limit, what was in force, seconds, steps, loss and Dice; then the step-downs."""
    lines = ["| part | run | limit (MiB) | epoch | micro-batches | sw batch | train s | val s | steps | loss | mean Dice |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for part in ("training", "validation"):
        for run in report[part]["runs"]:
            for row in run["rows"]:
                lines.append(f"| {part} | {run['name']} | {_mib(run['limit'])} | {row['epoch']} | "
                             f"{row['micro_batches']} | {row['sw_batch']} | {row['train_s']:.1f} | {row['val_s']:.1f} | "
                             f"{row['steps']} | {row['loss']:.4f} | {_dice(row['mean_dice'])} |")
    lines += ["", "| part | run | peak train (MiB) | peak val (MiB) | s/epoch | after the first | vs unsplit | "
              "step-downs (failed attempts) | steps applied vs unsplit | largest Dice difference | load (mean) |",
              "|---|---|---:|---:|---:|---:|---:|---|---|---:|---:|"]
    for part in ("training", "validation"):
        base = report[part]["runs"][0]
        for run in report[part]["runs"]:
            events = "; ".join(f"e{e['epoch']} {e.get('step', e.get('case'))}: {e['done']}" for e in run["events"])
            same_steps = sum(r["steps"] for r in run["rows"]) == sum(r["steps"] for r in base["rows"])
            dice = max((abs(r["mean_dice"] - b["mean_dice"]) for r, b in zip(run["rows"], base["rows"], strict=True)
                        if r["mean_dice"] is not None and b["mean_dice"] is not None), default=None)
            lines.append(f"| {part} | {run['name']} | {_mib(run['train_peak_bytes'])} | {_mib(run['val_peak_bytes'])} | "
                         f"{run['seconds_per_epoch']:.1f} | {run['seconds_per_epoch_after_first']:.1f} | "
                         f"{run['seconds_per_epoch_after_first'] / base['seconds_per_epoch_after_first']:.2f}x | "
                         f"{len(run['events'])}{': ' + events if events else ''} | {'same' if same_steps else 'differ'} | "
                         f"{'-' if dice is None else f'{dice:.2g}'} | {run['load']['mean']:.1f} |")
    return "\n".join(lines)


def _bundle(data: Path, cases: int, root: Path) -> Path:
    """The full-size UNet bundle of the first ``cases`` cases, one fold."""
    return generate_bundles(first_cases(data, cases, root), root / "work", ["unet"])["unet"]


def _train(source: Path, folder: Path, name: str, limit: int, epochs: int, **updates: Any) -> dict[str, Any]:
    """A fresh copy of ``source`` (with config ``updates``) trained ``epochs`` epochs under ``limit`` by
    ``autotune train`` in a process of its own (each run starts as cold as the others); its record."""
    from autotune.bundles.config import update_bundle_config

    slug = "".join(ch if ch.isalnum() else "_" for ch in name)
    bundle = fresh_copy(source, folder / slug)
    if updates:
        update_bundle_config(bundle, updates)
    command = [sys.executable, "-m", "autotune", "train", str(bundle), "--device", "cpu", "--epochs", str(epochs),
               "--val-every", "1", "--memory-limit", str(limit), "--quiet"]
    t0 = time.perf_counter()
    with LoadSampler() as load:
        done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{name}: exit {done.returncode}: {done.stderr[-2000:]}")
    summary = json.loads((bundle / "model_fold0" / "train_summary.json").read_text())
    rows = metrics_rows(bundle)
    keep = ("epoch", "loss", "mean_dice", "train_s", "val_s", "epoch_s", "steps", "samples", "micro_batches",
            "sw_batch", "validation_device", "train_peak_bytes", "val_peak_bytes")
    later = rows[1:] or rows  # the first epoch pays the process's one-off set-up
    return {"name": name, "limit": limit, "wall_s": round(wall, 1), "rows": [{k: r.get(k) for k in keep} for r in rows],
            "seconds_per_epoch": sum(r["epoch_s"] for r in rows) / len(rows),
            "seconds_per_epoch_after_first": sum(r["epoch_s"] for r in later) / len(later),
            "events": summary["memory_fallbacks"], "lines": [x for x in done.stderr.splitlines() if x.startswith("memory:")],
            "train_peak_bytes": summary["train_peak_bytes"], "val_peak_bytes": summary["val_peak_bytes"],
            "micro_batches": summary["micro_batches"], "sw_batch": summary["sw_batch"], "load": load.summary()}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from autotune.precision import cpu_bf16_native

    with tempfile.TemporaryDirectory(prefix="bench-oom-") as tmp:
        root = Path(tmp)
        bundle = _bundle(Path(args.data), args.cases, root)
        given = {"num_patches_per_iter": args.batch, "num_images_per_batch": args.batch}
        unsplit = _train(bundle, root, "unsplit", NEVER_BINDS, args.epochs, **given)
        print(json.dumps(unsplit), flush=True)
        limit = int(args.fraction * unsplit["train_peak_bytes"])
        split = _train(bundle, root, f"{args.fraction:g} x training peak", limit, args.epochs, **given)
        print(json.dumps(split), flush=True)
        roi = {"roi_size": [args.val_roi] * 3, "num_sw_batch_size": args.val_sw, "num_patches_per_iter": 1,
               "num_images_per_batch": 1}
        wide = _train(bundle, root, f"sw batch {args.val_sw}", NEVER_BINDS, args.val_epochs, **roi)
        narrow = _train(bundle, root, "sw batch 1 (peak only)", NEVER_BINDS, 1, **{**roi, "num_sw_batch_size": 1})
        print(json.dumps(wide), json.dumps(narrow), flush=True)
        val_limit = max((wide["val_peak_bytes"] + narrow["val_peak_bytes"]) // 2, int(1.05 * wide["train_peak_bytes"]))
        stepped = _train(bundle, root, "halfway between the sw peaks", val_limit, args.val_epochs, **roi)
        print(json.dumps(stepped), flush=True)
    return {
        "command": command("benchmarks.bench_oom_recovery"),
        "environment": environment(native_bf16=list(cpu_bf16_native()), date=time.strftime("%Y-%m-%d", time.gmtime())),
        "cases": args.cases, "epochs": args.epochs, "fraction": args.fraction, "batch": args.batch,
        "training": {"runs": [unsplit, split]},
        "validation": {"roi_size": roi["roi_size"], "sw_peak_at_1": narrow["val_peak_bytes"], "runs": [wide, stepped]},
    }


def _args() -> argparse.Namespace:
    p = parser(__doc__, "oom_recovery.json")
    p.add_argument("--data", default=str(HIPPOCAMPUS))
    p.add_argument("--cases", type=int, default=12)
    p.add_argument("--batch", type=int, default=8, help="patches per pass in the training part (given)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--fraction", type=float, default=0.6, help="the training limit, as a share of the peak")
    p.add_argument("--val-roi", type=int, default=32)
    p.add_argument("--val-sw", type=int, default=12)
    p.add_argument("--val-epochs", type=int, default=2)
    return p.parse_args()


def main() -> int:
    args = _args()
    os.environ.setdefault("AUTOTUNE_PRECISION", "fp32")  # the same precision on any CPU (the UNet trains fp32 here)
    report(args, lambda: measure(args), markdown_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
