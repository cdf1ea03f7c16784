"""bf16 against fp32 training on this CPU, template by template: does bf16 autocast train as fp32 does?

For each bundle of WORK (by default the README main job's ``segresnet_0``, ``dints_0``, ``unet_0``),
trains two private copies side by side, one in fp32 and one in bf16 (``--precision``, so a template
that keeps fp32 on the CPU is measured in bf16 all the same), with ``autotune train --device cpu
--epochs E`` (one torch thread each, under ``nice``), and reads their ``metrics.json``:

- whether every epoch's loss was finite and the run ended with exit code 0;
- the best mean Dice, and bf16's best less fp32's (the claim: within 0.05);
- epochs and wall seconds to ``--dice`` (the first validated epoch at or above it);
- the best Dice within a fixed wall: the shorter of the two runs' walls (both are measured to it).

Prints a table, writes JSON. Measured on the CPU it runs on (its oneDNN bf16 answer is recorded).

    python -m benchmarks.bench_bf16_training --work /tmp/work --epochs 12      # the README job's bundles
    python -m benchmarks.bench_bf16_training --work FULL --bundles unet_0 --epochs 300 --max-time 900 --val-every 1 \
        --label "full size, Task04_Hippocampus" --out benchmarks/results/bf16_training_full.json
    python -m benchmarks.bench_bf16_training --report-only
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    LoadSampler,
    cell,
    command,
    environment,
    first_at,
    fresh_copy,
    load_cell,
    parser,
    report,
    write_json,
)

PRECISIONS = ("fp32", "bf16")


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__, "bf16_training.json")
    p.add_argument("--work", default="/tmp/work", help="the folder of the bundles (the README job's --work-dir)")
    p.add_argument("--bundles", default="segresnet_0,dints_0,unet_0")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--dice", type=float, default=0.7, help="the Dice whose epochs and wall are reported")
    p.add_argument("--max-time", default=None, help="passed to autotune train (full-size runs)")
    p.add_argument("--val-every", type=int, default=None, help="passed to autotune train")
    p.add_argument("--memory-limit", default="16GiB",
                   help="passed to autotune train: a limit neither run reaches (a bundle tuned in bf16 at a small limit "
                        "does not fit it in fp32, and this measures training, not the memory contract)")
    p.add_argument("--label", default="tiny preset, the README main job's bundles")
    return p.parse_args(argv)


def _run(bundle: Path, copy: Path, precision: str, args: argparse.Namespace) -> subprocess.Popen:
    fresh_copy(bundle, copy)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("AUTOTUNE_PRECISION", None)
    cmd = ["nice", "-n", "10", sys.executable, "-m", "autotune", "train", str(copy), "--device", "cpu", "--epochs",
           str(args.epochs), "--precision", precision, "-q", *(["--max-time", args.max_time] if args.max_time else []),
           *(["--val-every", str(args.val_every)] if args.val_every else []), "--memory-limit", args.memory_limit]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _best_within(rows: list[dict[str, Any]], wall: float) -> float | None:
    dices = [r["mean_dice"] for r in rows if r.get("mean_dice") is not None and r["elapsed_s"] <= wall + 1e-9]
    return max(dices) if dices else None


def _outcome(copy: Path, proc: subprocess.Popen, out: str, err: str, dice: float) -> dict[str, Any]:
    metrics = copy / "model_fold0" / "metrics.json"
    rows = json.loads(metrics.read_text())["rows"] if metrics.is_file() else []
    rows = [{k: r.get(k) for k in ("epoch", "loss", "mean_dice", "elapsed_s", "epoch_s", "nonfinite_steps")}
            for r in rows]
    reached = first_at(rows, dice)
    dices = [r["mean_dice"] for r in rows if r["mean_dice"] is not None]
    return {"exit_code": proc.returncode, "last_line": (err.strip().splitlines() or [""])[-1][:400],
            "finite_loss": bool(rows) and all(math.isfinite(r["loss"]) for r in rows),
            "nonfinite_steps": sum(int(r["nonfinite_steps"] or 0) for r in rows), "epochs": len(rows),
            "best_dice": max(dices) if dices else None, "final_dice": dices[-1] if dices else None,
            "epochs_to_dice": reached["epoch"] if reached else None,
            "wall_to_dice_s": reached["elapsed_s"] if reached else None,
            "wall_s": rows[-1]["elapsed_s"] if rows else None, "rows": rows}


def measure_bundle(bundle: Path, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """Train ``bundle`` in fp32 and bf16 side by side; the two outcomes and their comparison."""
    procs = {p: _run(bundle, scratch / f"{bundle.name}_{p}", p, args) for p in PRECISIONS}
    with LoadSampler() as load:
        texts = {p: proc.communicate() for p, proc in procs.items()}
    runs = {p: _outcome(scratch / f"{bundle.name}_{p}", procs[p], *texts[p], args.dice) for p in PRECISIONS}
    walls = [runs[p]["wall_s"] for p in PRECISIONS if runs[p]["wall_s"] is not None]
    fixed = min(walls) if len(walls) == 2 else None
    for p in PRECISIONS:
        runs[p]["best_dice_in_fixed_wall"] = _best_within(runs[p]["rows"], fixed) if fixed else None
    fp32, bf16 = runs["fp32"]["best_dice"], runs["bf16"]["best_dice"]
    return {"bundle": bundle.name, "runs": runs, "fixed_wall_s": fixed, "load_during_run": load.summary(),
            "bf16_minus_fp32_best_dice": (bf16 - fp32) if fp32 is not None and bf16 is not None else None,
            "within_0_05": (fp32 is not None and bf16 is not None and runs["bf16"]["finite_loss"]
                            and runs["bf16"]["exit_code"] == 0 and abs(bf16 - fp32) <= 0.05)}


def markdown_table(report: dict[str, Any], *more: dict[str, Any]) -> str:
    """The table of a report and of ``more`` reports of the same run's settings (what BENCHMARKS.md shows)."""
    env = report["environment"]
    lines = [f"CPU: {env['cpu']} ({env['cores']} cores), torch {env['torch']}, 1 thread per run, the two runs side by "
             f"side; oneDNN bf16 check: {'yes' if env['onednn_bf16'] else 'no'}; {report['label']}, {report['epochs']} "
             f"epochs; Dice target {report['dice']}.", "",
             "| bundle | precision | exit | finite loss | best Dice | bf16 - fp32 | epochs to target | wall to target s "
             "| best Dice in fixed wall (s) | wall s | load during |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for item in [b for r in (report, *more) for b in r["bundles"]]:
        load = load_cell(item["load_during_run"])
        for p in PRECISIONS:
            run = item["runs"][p]
            diff = cell(item["bf16_minus_fp32_best_dice"], "+.3f") if p == "bf16" else ""
            lines.append(f"| {item['bundle']} | {p} | {run['exit_code']} | {'yes' if run['finite_loss'] else 'no'} | "
                         f"{cell(run['best_dice'])} | {diff} | {cell(run['epochs_to_dice'], 'd')} | "
                         f"{cell(run['wall_to_dice_s'], '.0f')} | {cell(run['best_dice_in_fixed_wall'])} "
                         f"({cell(item['fixed_wall_s'], '.0f')}) | {cell(run['wall_s'], '.0f')} | {load} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    report(args, lambda: measure(args, argv), markdown_table)
    return 0


def measure(args: argparse.Namespace, argv: list[str] | None) -> dict[str, Any]:
    """Each bundle trained in fp32 and bf16; the report is written after each bundle (a long run keeps what it
    measured)."""
    import torch

    work = Path(args.work)
    started = time.time()
    result: dict[str, Any] = {
        "benchmark": "bf16 against fp32 training on this CPU, template by template",
        "command": command("benchmarks.bench_bf16_training", argv),
        "label": args.label, "epochs": args.epochs, "dice": args.dice, "seconds": 0.0,
        "environment": environment(onednn_bf16=bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
                                   onednn_max_cpu_isa=os.environ.get("ONEDNN_MAX_CPU_ISA")),
        "bundles": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench_bf16_") as scratch:
        for name in args.bundles.split(","):
            result["bundles"].append(measure_bundle(work / name, args, Path(scratch)))
            result["seconds"] = round(time.time() - started, 1)
            write_json(Path(args.out), result)
            print(markdown_table(result), flush=True)
    return result


if __name__ == "__main__":
    sys.exit(main())
