"""Fast vs regular training, side by side, on a real dataset (CPU by default).

Both modes train the same bundle (same network, same seed, same fold, same validation)
for the same wall-clock budget, each in its own process (``python -m autotune.trainer``).
Reported per mode: seconds per epoch, the share of step time spent waiting for data,
wall time (from process start, caching included) to a validation mean Dice target, and
the best mean Dice reached within the budget. Prints a table and writes JSON.

    python -m benchmarks.bench_train --budget 300            # 300 s per mode
    python -m benchmarks.bench_train --budget 600 --roi 48   # the full 10-minute goal
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import LoadSampler, write_json

REPO = Path(__file__).resolve().parents[1]

DEFAULT_DATA = "/work/shared/datasets/Task04_Hippocampus"


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=DEFAULT_DATA, help="dataset: Decathlon folder, input.yaml or datalist")
    p.add_argument("--work", default="/tmp/autotune_bench_train", help="scratch folder (replaced)")
    p.add_argument("--budget", type=float, default=600, help="seconds per mode (default 600)")
    p.add_argument("--algo", default="segresnet", choices=("segresnet", "unet", "dints"))
    p.add_argument("--roi", type=int, default=32, help="cubic roi edge (default 32; 0: the template's own roi)")
    p.add_argument("--init-filters", type=int, default=16, help="SegResNet init_filters (default 16; 0: the template's)")
    p.add_argument("--epochs", type=int, default=40, help="epochs the schedule is planned for (default 40)")
    p.add_argument("--val-every", type=int, default=1)
    p.add_argument("--sw-overlap", type=float, default=0.25, help="validation window overlap (default 0.25)")
    p.add_argument("--num-workers", type=int, default=2, help="regular mode's DataLoader workers (default 2)")
    p.add_argument("--target", type=float, default=0.80, help="validation mean Dice target (default 0.80)")
    p.add_argument("--train-cases", type=int, default=0,
                   help="use only the first N training cases (0: all); for short CPU budgets")
    p.add_argument("--val-cases", type=int, default=0, help="use only the first N cases of the held-out fold (0: all)")
    p.add_argument("--modes", default="fast,regular")
    p.add_argument("--report-only", action="store_true", help="re-read the metrics of the last run in --work")
    p.add_argument("--epoch-rounds", type=int, default=0,
                   help="also time N alternating 2-epoch runs per mode (less sensitive to other load on the machine)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "train.json"))
    return p.parse_args(argv)


def make_bundle(args: argparse.Namespace, work: Path) -> Path:
    """Analyse the data (5 folds) and generate the bundle for fold 0 with the benchmark's settings."""
    from autotune.data.analyze import analyze
    from autotune.facade.bundlegen import BundleGen

    result = analyze(args.data, work, num_fold=5, progress=False)
    overrides: dict[str, Any] = {
        "num_epochs": args.epochs,
        "num_epochs_per_validation": args.val_every,
        "early_stop_patience": 0,
        "num_workers": args.num_workers,
        "sw_overlap": args.sw_overlap,
        "num_sw_batch_size": 8,
    }
    if args.roi:
        overrides["roi_size"] = [args.roi] * 3
    if args.algo == "segresnet" and args.init_filters:
        overrides["segresnet"] = {"network": {"args": {"init_filters": args.init_filters}}}
    gen = BundleGen(work, algos=args.algo, data_stats_filename=result.datastats, data_src_cfg_name=result.data_src)
    bundles = gen.generate(work, num_fold=5, overrides=overrides)
    bundle = Path(next(b["path"] for b in bundles if b["fold"] == 0))
    if args.train_cases or args.val_cases:
        subset_datalist(bundle, args.train_cases, args.val_cases)
    return bundle


def subset_datalist(bundle: Path, train_cases: int, val_cases: int) -> None:
    """Point the bundle at a datalist with the first N training and first M fold-0 cases (same for both modes)."""
    from autotune.bundles.config import load_bundle_config, update_bundle_config

    cfg = load_bundle_config(bundle)
    cases = json.loads(Path(cfg["datalist"]).read_text())["training"]
    val = [c for c in cases if c["fold"] == cfg["fold"]]
    train = [c for c in cases if c["fold"] != cfg["fold"]]
    subset = (train[:train_cases] if train_cases else train) + (val[:val_cases] if val_cases else val)
    path = bundle.parent / "datalist_subset.json"
    path.write_text(json.dumps({"training": subset}, indent=1))
    update_bundle_config(bundle, {"datalist": str(path)})


def run_mode(bundle: Path, mode: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Train a private copy of ``bundle`` in ``mode`` in a fresh process; return its measurements."""
    copy = work / f"{mode}_{bundle.name}"
    command = [sys.executable, "-m", "autotune.trainer", str(copy), "--mode", mode, "--device", args.device,
               "--epochs", str(args.epochs), "--max-time", f"{args.budget:g}", "--val-every", str(args.val_every)]
    log = work / f"{mode}.log"
    # With --report-only nothing runs, so no load is recorded (the load now says nothing about that run).
    load_before, load_during, wall = None, None, None
    if not args.report_only:
        shutil.copytree(bundle, copy)
        load_before = os.getloadavg()
        t0 = time.monotonic()
        with open(log, "w") as handle, LoadSampler() as load:
            code = subprocess.call(command, stdout=handle, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONPATH": str(REPO)})
        wall = time.monotonic() - t0
        load_during = load.summary()
        if code != 0:
            raise SystemExit(f"{mode} run failed (exit {code}); see {log}")
    record = json.loads((copy / "model_fold0" / "metrics.json").read_text())
    rows = record["rows"]
    validated = [r for r in rows if r.get("mean_dice") is not None]
    reached = next((r for r in validated if r["mean_dice"] >= args.target), None)
    in_budget = [r["mean_dice"] for r in validated if r["elapsed_s"] <= args.budget]
    steady = rows[1:] or rows  # epoch 1 pays one-off kernel set-up
    return {
        "mode": mode,
        "command": " ".join(command),
        "epochs": len(rows),
        "train_s_per_epoch": statistics.median(r["train_s"] for r in steady),
        "train_s_per_epoch_min": min(r["train_s"] for r in steady),  # the least disturbed epoch
        "epoch_s_with_val": statistics.median(r["epoch_s"] for r in steady),
        "first_epoch_train_s": rows[0]["train_s"],
        "data_wait_share": statistics.median(r["data_wait_share"] for r in steady),
        "samples_per_s": statistics.median(r["samples_per_s"] for r in steady),
        "setup_s": rows[0]["elapsed_s"] - rows[0]["epoch_s"],
        "time_to_target_s": reached["elapsed_s"] if reached else None,
        "epoch_at_target": reached["epoch"] if reached else None,
        "best_dice_in_budget": max(in_budget) if in_budget else None,
        "best_dice": max((r["mean_dice"] for r in validated), default=None),
        "dice_curve": [[r["epoch"], round(r["elapsed_s"], 1), round(r["mean_dice"], 4)] for r in validated],
        "wall_s": wall,
        "load_avg_before": load_before,
        "load_avg_after": None if args.report_only else os.getloadavg(),
        "load_during_run": load_during,
        "options": record.get("options"),
        "log": str(log),
    }


def epoch_rounds(bundle: Path, args: argparse.Namespace, work: Path, modes: list[str]) -> dict[str, Any]:
    """Alternate short runs of each mode; the second epoch's time of each run (the first sets up kernels)."""
    times: dict[str, list[float]] = {m: [] for m in modes}
    waits: dict[str, list[float]] = {m: [] for m in modes}
    loads: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for index in range(args.epoch_rounds):
        for mode in modes:
            copy = work / f"round{index}_{mode}"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(bundle, copy)
            with LoadSampler() as load:
                subprocess.check_call([sys.executable, "-m", "autotune.trainer", str(copy), "--mode", mode, "--device",
                                       args.device, "--epochs", "2", "--val-every", "2", "-q"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      env={**os.environ, "PYTHONPATH": str(REPO)})
            row = json.loads((copy / "model_fold0" / "metrics.json").read_text())["rows"][1]
            times[mode].append(row["train_s"])
            waits[mode].append(row["data_wait_share"])
            loads[mode].append(load.summary())
    return {m: {"train_s": times[m], "min_s": min(times[m]), "median_s": statistics.median(times[m]),
                "data_wait_share": waits[m], "load_during_runs": loads[m]} for m in modes}


def _dice_cell(run: dict[str, Any]) -> str:
    """Best Dice within the budget, then the run's best with its epoch and time when it came later."""
    if run["best_dice_in_budget"] is None:
        return "-"
    cell = f"{run['best_dice_in_budget']:.3f}"
    best = max(run["dice_curve"], key=lambda point: point[2]) if run["dice_curve"] else None
    if best is not None and best[2] > run["best_dice_in_budget"]:
        cell += f" ({best[2]:.3f} at epoch {best[0]}, {best[1]:.0f} s)"
    return cell


def markdown_table(report: dict[str, Any]) -> str:
    """The markdown table of a report (what BENCHMARKS.md shows)."""
    target, budget = report["settings"]["target"], report["settings"]["budget"]
    lines = [f"| mode | epochs run (budget checked at epoch ends) | train s/epoch (median / min) | data-wait share | time to mean Dice "
             f"{target:.2f} | epoch reaching {target:.2f} | best mean Dice within {budget:g} s |",
             "|---|---|---|---|---|---|---|"]
    for r in report["results"].values():
        per_epoch = f"{r['train_s_per_epoch']:.1f}"
        if r.get("train_s_per_epoch_min") is not None:
            per_epoch += f" / {r['train_s_per_epoch_min']:.1f}"
        reached = "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.0f} s"
        epoch = "–" if r["epoch_at_target"] is None else str(r["epoch_at_target"])
        lines.append(f"| {r['mode']} | {r['epochs']} | {per_epoch} | {100 * r['data_wait_share']:.1f} % | {reached} | "
                     f"{epoch} | {_dice_cell(r)} |")
    return "\n".join(lines)


def _ratio(slow: float | None, fast: float | None) -> float | None:
    return slow / fast if slow and fast else None


def _summary(results: dict[str, Any], rounds: dict[str, Any]) -> dict[str, Any]:
    """Fast against regular: the speed-up ratios (empty unless both modes ran)."""
    fast, regular = results.get("fast"), results.get("regular")
    summary: dict[str, Any] = {}
    if fast and regular:
        to_target = _ratio(regular["time_to_target_s"], fast["time_to_target_s"])
        lower_bound = None
        if to_target is None and fast["time_to_target_s"] and regular["time_to_target_s"] is None:
            # Regular never got there: its whole run is a lower bound on its time to the target.
            lower_bound = regular["dice_curve"][-1][1] / fast["time_to_target_s"]
        summary = {
            "epoch_speedup_train_only": _ratio(regular["train_s_per_epoch"], fast["train_s_per_epoch"]),
            "epoch_speedup_train_only_min": _ratio(regular["train_s_per_epoch_min"], fast["train_s_per_epoch_min"]),
            "epochs_to_target_ratio": _ratio(regular["epoch_at_target"], fast["epoch_at_target"]),
            "epoch_speedup_with_val": _ratio(regular["epoch_s_with_val"], fast["epoch_s_with_val"]),
            "time_to_target_speedup": to_target,
            "time_to_target_speedup_at_least": lower_bound,
        }
        if rounds:
            summary["epoch_speedup_rounds_min"] = _ratio(rounds["regular"]["min_s"], rounds["fast"]["min_s"])
            summary["epoch_speedup_rounds_median"] = _ratio(rounds["regular"]["median_s"], rounds["fast"]["median_s"])
    return summary


def _print_table(args: Any, results: dict[str, Any], summary: dict[str, Any]) -> None:
    """One row per mode, then the summary ratios."""
    def fmt(value: Any, spec: str = ".2f") -> str:
        return "-" if value is None else format(value, spec)

    roi = f"{args.roi}^3" if args.roi else "of the template"
    print(f"{args.algo} roi {roi} on {args.device}, budget {args.budget:g} s per mode, target Dice {args.target}")
    print(f"{'mode':<8} {'epochs':>6} {'train s/ep':>10} {'min s/ep':>8} {'ep+val s':>9} {'data wait':>9} "
          f"{'samples/s':>9} {'t->target s':>11} {'ep->target':>10} {'best Dice':>9}")
    for r in results.values():
        print(f"{r['mode']:<8} {r['epochs']:>6} {fmt(r['train_s_per_epoch']):>10} {fmt(r['train_s_per_epoch_min']):>8} "
              f"{fmt(r['epoch_s_with_val']):>9} {fmt(100 * r['data_wait_share'], '.1f') + '%':>9} "
              f"{fmt(r['samples_per_s'], '.1f'):>9} {fmt(r['time_to_target_s'], '.0f'):>11} "
              f"{fmt(r['epoch_at_target'], 'd'):>10} {fmt(r['best_dice_in_budget'], '.4f'):>9}")
    for key, value in summary.items():
        print(f"{key}: {fmt(value)}")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with --report-only, re-read the last run's metrics); print and write JSON."""
    args = _args(argv)
    import monai
    import torch

    work = Path(args.work)
    if args.report_only:
        bundle = work / f"{args.algo}_0"
    else:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        bundle = make_bundle(args, work)
    results = {mode: run_mode(bundle, mode, args, work) for mode in args.modes.split(",")}
    rounds = epoch_rounds(bundle, args, work, list(results)) if args.epoch_rounds else {}
    summary = _summary(results, rounds)
    report = {
        "benchmark": "train fast vs regular",
        "data": args.data,
        "algo": args.algo,
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "work")},
        "environment": {
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "torch": torch.__version__, "monai": monai.__version__, "python": platform.python_version(),
        },
        "results": results,
        "epoch_rounds": rounds,
        "summary": summary,
    }
    out = Path(args.out)
    write_json(out, report)

    _print_table(args, results, summary)
    print(markdown_table(report))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
