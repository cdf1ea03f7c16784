"""Time to a Dice: fast training against regular, side by side, each with its full recipe.

The yardstick users care about is how soon a good Dice comes, not how many epochs it takes. Both
modes train the same bundle (fold 0 of 5 of the dataset, the full-size template, one seed) for the
same wall budget, at the same time, each in its own process pinned to its own core with one compute
thread (``--serial`` runs them one after the other with every core instead):

- ``regular``: ``autotune train --mode regular --max-time BUDGET``: the seed's baseline (plain
  Dataset, DataLoader with worker processes, fp32, Adam 1e-4, Dice loss, no schedule);
- ``fast``: ``autotune train --mode fast --max-time F`` for each budget F of ``--fast-budgets`` (default:
  half of regular's, the goal's ratio), one after another on the other core: cache, thread loader,
  the machine's default precision, the template's recipe with its schedule fitted to its budget. A
  fitted schedule ends its decay where its time ends, so the budget it is given is the question a
  user asks ("I have this long: do I get the Dice?"); the budgets are fixed before the run.

Both validate every epoch (``--val-every``), so each curve has a point per epoch; that validation
is part of each run's wall time. Reported per mode: wall time (from the run's start, caching
included) to the target mean Dice, the best Dice at fixed wall times, and where an epoch's time
goes (data wait, host-to-device copies, forward and backward, validation). Prints tables, writes
JSON and a PNG of Dice against wall seconds.

    python -m benchmarks.bench_time_to_dice --budget 1500                 # UNet, CPU, side by side
    python -m benchmarks.bench_time_to_dice --report-only                 # tables from the JSON
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    LoadSampler,
    cell,
    dice_plot,
    environment,
    first_at,
    fresh_copy,
    generate_bundles,
    metrics_rows,
    parser,
    read_json,
    run_logged,
    write_json,
)

DEFAULT_DATA = "/work/shared/datasets/Task04_Hippocampus"
MODES = ("fast", "regular")
#: wall seconds at which the best Dice so far is reported (those past the budget are left out)
CHECKPOINTS_S = (60, 120, 240, 360, 480, 600, 900, 1200, 1800)
#: where an epoch's time goes, in the order the table shows (metrics.csv's columns)
PHASES = (("data_wait_s", "data wait"), ("h2d_s", "host-to-device"), ("compute_s", "forward+backward"),
          ("val_s", "validation"))


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__, "time_to_dice_unet_cpu.json")
    p.add_argument("--data", default=DEFAULT_DATA, help="dataset: Decathlon folder, input.yaml or datalist")
    p.add_argument("--work", default="/tmp/autotune_bench_time_to_dice", help="scratch folder (replaced)")
    p.add_argument("--algo", default="unet", choices=("unet", "segresnet", "dints"))
    p.add_argument("--budget", type=float, default=1500, help="regular's wall seconds (--max-time; default 1500)")
    p.add_argument("--fast-budgets", default=None,
                   help="fast's wall seconds, comma-separated, run one after another (default: half of --budget)")
    p.add_argument("--target", type=float, default=0.80, help="validation mean Dice target (default 0.80)")
    p.add_argument("--val-every", type=int, default=1, help="validate every K epochs in both modes (default 1)")
    p.add_argument("--num-workers", type=int, default=1,
                   help="regular mode's DataLoader worker processes (default 1: it shares its core with them)")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--device", default="cpu")
    p.add_argument("--serial", action="store_true", help="one mode after the other, every core each")
    p.add_argument("--label", default=None, help="what this run changes, for the tables (default: its overrides)")
    p.add_argument("--seed", type=int, default=0, help="the bundle's seed (initial weights, data order, crops)")
    p.add_argument("--epochs", type=int, default=None,
                   help="train this many epochs, the schedule planned for them, the budget only a cap: two recipes' "
                        "Dice per epoch then compare on a machine whose speed changes during the runs (a schedule "
                        "fitted to the wall would change with it)")
    p.add_argument("--overrides", default=None,
                   help="a YAML mapping merged into the generated bundle (as `autotune generate --overrides`), e.g. "
                        "'{fast_training: {compile: true}}': the recipe change a run measures")
    return p.parse_args(argv)


def make_bundle(args: argparse.Namespace, work: Path) -> Path:
    """Analyse the data (5 folds) and generate the full-size bundle of fold 0; nothing tuned."""
    # neither run stops early: each curve covers the whole budget
    import yaml

    overrides = {"early_stop_patience": 0, "num_workers": args.num_workers, "seed": args.seed}
    if args.overrides:
        from autotune.bundles.render import deep_merge

        overrides = deep_merge(overrides, yaml.safe_load(args.overrides) or {})
    [bundle] = generate_bundles(args.data, work, args.algo, num_fold=5, overrides=overrides).values()
    return bundle


def planned_runs(args: argparse.Namespace) -> list[tuple[str, str, float]]:
    """(label, mode, budget seconds) of every run: regular at ``--budget``, fast at each ``--fast-budgets``."""
    runs = []
    if "fast" in args.modes.split(","):
        budgets = ([float(b) for b in str(args.fast_budgets).split(",")] if args.fast_budgets
                   else [args.budget / 2])
        runs += [(f"fast {b:g} s", "fast", b) for b in budgets]
    if "regular" in args.modes.split(","):
        runs.append(("regular", "regular", float(args.budget)))
    return runs


def command(copy: Path, mode: str, budget: float, args: argparse.Namespace) -> list[str]:
    epochs = [] if args.epochs is None else ["--epochs", str(args.epochs)]
    return [sys.executable, "-m", "autotune.trainer", str(copy), "--mode", mode, "--device", args.device,
            "--max-time", f"{budget:g}s", "--val-every", str(args.val_every), *epochs]


def train(bundle: Path, label: str, mode: str, budget: float, core: int | None, args: argparse.Namespace,
          work: Path) -> tuple[list[str], Path]:
    """Train ``label`` on a private copy of ``bundle`` (pinned to ``core`` with one thread, or free) to its end."""
    name = label.replace(" ", "_")
    copy = fresh_copy(bundle, work / f"{name}_{bundle.name}")
    argv = command(copy, mode, budget, args)
    if core is None:
        run_logged(argv, work / f"{name}.log")
    else:
        argv = ["taskset", "-c", str(core), *argv]
        run_logged(argv, work / f"{name}.log", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return argv, copy


def summarise(copy: Path, label: str, mode: str, budget: float, args: argparse.Namespace,
              argv: list[str]) -> dict[str, Any]:
    """One mode's measurements from its ``metrics.json`` and ``train_summary.json``."""
    model = copy / "model_fold0"
    rows = metrics_rows(copy)
    summary = read_json(model / "train_summary.json")
    validated = [r for r in rows if r.get("mean_dice") is not None]
    reached = first_at(validated, args.target)
    steady = rows[1:] or rows  # the first epoch pays one-off set-up
    best_at = {}
    for seconds in CHECKPOINTS_S:
        if seconds <= args.budget:  # past a run's own budget: its best within it
            seen = [r["mean_dice"] for r in validated if r["elapsed_s"] <= seconds]
            best_at[str(seconds)] = max(seen) if seen else None
    return {
        "label": label, "mode": mode, "command": " ".join(argv), "budget_s": budget, "precision": summary.get("precision"),
        "schedule": summary.get("schedule"), "techniques": summary.get("techniques"), "epochs": len(rows), "steps_per_epoch": rows[0].get("steps"),
        "setup_s": rows[0]["elapsed_s"] - rows[0]["epoch_s"],
        "time_to_target_s": reached["elapsed_s"] if reached else None,
        "epoch_at_target": reached["epoch"] if reached else None,
        "best_dice": max((r["mean_dice"] for r in validated), default=None),
        "best_dice_at_s": best_at,
        "samples_per_s": statistics.median(r["samples_per_s"] for r in steady),
        "epoch_s": statistics.fmean(r["epoch_s"] for r in steady),
        # means, so the phases add up to the epoch (medians of each column come from different epochs)
        "phases_s": {key: statistics.fmean(float(r.get(key) or 0.0) for r in steady) for key, _ in PHASES},
        "curve": [[r["epoch"], round(r["elapsed_s"], 1), round(r["mean_dice"], 4)] for r in validated],
        "lr": [r["lr"] for r in rows],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train every run (side by side: fast's budgets one after another on core 0, regular on core 1; or
    one after another with every core) and gather their measurements."""
    import monai

    from autotune.precision import cpu_bf16_native

    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    bundle = make_bundle(args, work)
    runs = planned_runs(args)
    lanes = ([[r] for r in runs] if args.serial
             else [[r for r in runs if r[1] == "fast"], [r for r in runs if r[1] == "regular"]])
    results: dict[str, Any] = {}

    def lane(index: int, planned: list[tuple[str, str, float]]) -> None:
        for label, mode, budget in planned:
            with LoadSampler() as load:
                argv, copy = train(bundle, label, mode, budget, None if args.serial else index, args, work)
            results[label] = {**summarise(copy, label, mode, budget, args, argv), "load_during_run": load.summary()}

    threads = [threading.Thread(target=lane, args=(i, planned)) for i, planned in enumerate(lanes) if planned]
    for thread in threads:
        thread.start()
        if args.serial:
            thread.join()
    for thread in threads:
        thread.join()
    missing = [label for label, _, _ in runs if label not in results]
    if missing:
        raise SystemExit(f"runs without results: {missing}")
    results = {label: results[label] for label, _, _ in runs}
    reached = [r["time_to_target_s"] for r in results.values() if r["mode"] == "fast" and r["time_to_target_s"]]
    regular = next((r for r in results.values() if r["mode"] == "regular"), None)
    ratio = min(reached) / regular["time_to_target_s"] if reached and regular and regular["time_to_target_s"] else None
    return {
        "benchmark": "time to Dice, fast against regular", "data": args.data, "algo": args.algo,
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "work", "report_only")},
        "environment": environment(native_bf16=list(cpu_bf16_native()), monai=monai.__version__,
                                   date=time.strftime("%Y-%m-%d")),
        "results": results,
        "fast_over_regular_time_to_target": ratio, "roi_size": _roi_of(bundle),
    }


def _roi_of(bundle: Path) -> list[int]:
    from autotune.bundles.config import load_bundle_config

    return list(load_bundle_config(str(bundle)).roi_size)


def table(report: dict[str, Any]) -> str:
    """Time to the target and the best Dice at fixed wall times, per mode (markdown)."""
    target = report["settings"]["target"]
    modes = list(report["results"].values())
    times = [s for s in modes[0]["best_dice_at_s"]] if modes else []
    head = " | ".join(["| run", "precision", "schedule", "epochs", "s/epoch", "samples/s", f"time to Dice {target:.2f}",
                       "epoch", *(f"best at {s} s" for s in times), "best |"])
    lines = [head, "|" + "---|" * (9 + len(times))]
    for r in modes:
        schedule = r.get("schedule") or {}
        if r["mode"] == "regular":
            planned = "constant lr (Adam 1e-4)"
        elif schedule.get("set_by") == "max_time":
            budget = r.get("budget_s", report["settings"]["budget"])
            planned = f"fitted to {budget:g} s ({schedule.get('planned_epochs')} epochs)"
        else:
            planned = f"{schedule.get('planned_epochs')} epochs"
        cells = [r.get("label", r["mode"]), str(r["precision"]), planned, str(r["epochs"]), cell(r["epoch_s"], ".1f", "–"),
                 cell(r["samples_per_s"], ".2f", "–"), cell(r["time_to_target_s"], ".0f", "–") + (" s" if r["time_to_target_s"] else ""),
                 cell(r["epoch_at_target"], "d", "–"), *(cell(r["best_dice_at_s"][s], ".3f", "–") for s in times),
                 cell(r["best_dice"], ".3f", "–")]
        lines.append("| " + " | ".join(cells) + " |")
    ratio = report.get("fast_over_regular_time_to_target")
    reached = [r["time_to_target_s"] for r in modes if r["mode"] == "fast" and r["time_to_target_s"]]
    regular = next((r for r in modes if r["mode"] == "regular"), None)
    if ratio is not None:
        lines.append("")
        lines.append(f"fast's time to Dice {target:.2f} (its quickest budget) over regular's: **{ratio:.2f}** "
                     "(goal: at most 0.5)")
    elif reached and regular is not None:  # regular never reached it: its budget bounds its time from below
        lines.append("")
        lines.append(f"regular did not reach Dice {target:.2f} in its {regular['budget_s']:g} s (best "
                     f"{regular['best_dice']:.3f}): fast's time to it (its quickest budget) over regular's is below "
                     f"**{min(reached) / regular['budget_s']:.2f}** (goal: at most 0.5)")
    return "\n".join(lines)


def variant_of(report: dict[str, Any]) -> str:
    """What a report's run changed against the template: its ``--label`` (else its overrides, else "as generated")
    and its seed."""
    settings = report["settings"]
    what = settings.get("label") or settings.get("overrides") or "as generated"
    return f"{what}, seed {settings.get('seed', 0)}"


def runs_table(*reports: dict[str, Any]) -> str:
    """One row per report's fast run (one change each, the same budget): the time to Dice 0.80 and 0.85 (wall,
    set-up and validation included), the best Dice at fixed walls and in all, s/epoch and the precision."""
    walls = ("120", "240", "300", "360", "480", "600")
    lines = ["| run | precision | roi | epochs | s/epoch | time to 0.80 | time to 0.85 | "
             + " | ".join(f"best at {w} s" for w in walls) + " | best |", "|" + "---|" * (8 + len(walls))]
    for report in reports:
        for r in report["results"].values():
            curve = r["curve"]  # [epoch, elapsed_s, dice]
            at = {t: next((f"{e:.0f} s" for _, e, d in curve if d >= t), "–") for t in (0.80, 0.85)}
            best = {w: max((d for _, e, d in curve if e <= float(w)), default=None) for w in walls}
            lines.append("| " + " | ".join([
                variant_of(report), str(r["precision"]), "x".join(map(str, report.get("roi_size") or [])) or "–",
                str(r["epochs"]), cell(r["epoch_s"], ".1f", "–"), at[0.80], at[0.85],
                *(cell(best[w], ".3f", "–") for w in walls), cell(r["best_dice"], ".3f", "–")]) + " |")
    return "\n".join(lines)


def epochs_table(*reports: dict[str, Any]) -> str:
    """One row per report's fast run trained a fixed number of epochs (``--epochs``): the mean Dice at every few
    epochs and the best, which the machine's speed does not change, beside s/epoch and the CPU time the
    hypervisor stole during the run, which it does."""
    runs = [(report, r) for report in reports for r in report["results"].values()]
    last = max((len(r["curve"]) for _, r in runs), default=0)
    marks = sorted({e for e in range(last // 4, last + 1, max(1, last // 4)) if e} | {last})
    lines = ["| run | epochs | " + " | ".join(f"Dice at epoch {e}" for e in marks)
             + " | best | s/epoch | CPU time stolen |", "|" + "---|" * (5 + len(marks))]
    for report, r in runs:
        dice = {int(e): d for e, _, d in r["curve"]}
        steal = (r.get("load_during_run") or {}).get("steal")
        lines.append("| " + " | ".join([
            variant_of(report), str(r["epochs"]), *(cell(dice.get(e), ".3f", "–") for e in marks),
            cell(r["best_dice"], ".3f", "–"), cell(r["epoch_s"], ".1f", "–"),
            "–" if steal is None else f"{100 * steal:.0f} %"]) + " |")
    return "\n".join(lines)


def breakdown(report: dict[str, Any]) -> str:
    """Where a steady epoch's time goes, per mode (means over the epochs after the first; markdown)."""
    lines = ["| run | epoch s | " + " | ".join(label for _, label in PHASES) + " | rest of training |",
             "|" + "---|" * (3 + len(PHASES))]
    for r in report["results"].values():
        phases = r["phases_s"]
        rest = r["epoch_s"] - sum(phases.values())
        cells = [r.get("label", r["mode"]), cell(r["epoch_s"], ".1f", "–"),
                 *(f"{phases[key]:.1f} ({100 * phases[key] / r['epoch_s']:.0f} %)" for key, _ in PHASES),
                 f"{rest:.1f} ({100 * rest / r['epoch_s']:.0f} %)"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    """Validation mean Dice against wall seconds, one line per mode, the target dashed."""
    lines = [(f"{r.get('label', r['mode'])} ({r['precision']})", [p[1] for p in r["curve"]], [p[2] for p in r["curve"]])
             for r in report["results"].values()]
    dice_plot(path, [(f"{report['algo']}: {report['environment']['cpu']}", lines)], "wall seconds (caching included)",
              target=report["settings"]["target"])
def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    out = Path(args.out)
    report = read_json(out) if args.report_only else run(args)
    if not args.report_only:
        write_json(out, report)
        plot(report, out.with_suffix(".png"))
    print(table(report))
    print()
    print(breakdown(report))
    print(f"wrote {out}" if not args.report_only else f"read {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
