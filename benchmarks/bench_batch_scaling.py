"""Time to mean Dice 0.80: each template as generated against the same bundle after tuning.

For each algorithm, fold 0 of 5 of the dataset, full-size templates (no preset), the
variants (``--variants``, default all three):

- ``generated``: the bundle as ``autotune generate`` writes it;
- ``largest``: a copy tuned by ``autotune tune --strategy estimate --handoff largest`` at a
  fixed memory limit (so the largest batch that fits is far above the template's): the
  largest fit under the training-set cap, the scaled learning rate and the sample-counted
  schedule (results written before the goodput rule call this variant ``tuned``);
- ``handoff``: a copy tuned by ``autotune tune --strategy fast --handoff goodput`` at the
  same limit: real probes measure samples/s at the largest fit and at the template's
  batch, and the goodput rule (``autotune.search.handoff``) picks the batch handed over.

All train in fast mode for the same wall budget, one after the other (the order reverses
from one algorithm to the next), each in its own process, validating every epoch. Prints
a table, writes JSON (and a PNG of the curves) after every run, so a cut-off run keeps
what it had.

    python -m benchmarks.bench_batch_scaling --budget 420 --epochs 20
    python -m benchmarks.bench_batch_scaling --variants generated,handoff   # the goodput rule's pair
    python -m benchmarks.bench_batch_scaling --report-only            # table from the JSON
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.common import (
    LoadSampler,
    cell,
    command,
    dice_plot,
    environment,
    first_at,
    fresh_copy,
    generate_bundles,
    metrics_rows,
    parser,
    run_logged,
    write_json,
)

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

DEFAULT_DATA = "/work/shared/datasets/Task04_Hippocampus"
VARIANTS = ("generated", "largest", "handoff")
#: every variant a report may hold, in table order ("tuned": "largest" before the goodput rule)
KNOWN_VARIANTS = ("generated", "tuned", "largest", "handoff")
#: how each tuned variant is tuned (besides the limit, device and storage)
TUNE_FLAGS = {"largest": ["--strategy", "estimate", "--handoff", "largest"],
              "handoff": ["--strategy", "fast", "--handoff", "goodput"]}


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__, "batch_scaling.json")
    p.add_argument("--data", default=DEFAULT_DATA)
    p.add_argument("--work", default="/tmp/autotune_bench_batch_scaling", help="scratch folder (replaced)")
    p.add_argument("--algos", default="unet,segresnet,dints")
    p.add_argument("--budget", type=float, default=420, help="wall seconds per training run (--max-time)")
    p.add_argument("--epochs", type=int, default=20, help="epochs the schedule is planned for (both variants)")
    p.add_argument("--limit", default="8GiB", help="memory limit to tune at (a round figure, not from the estimator)")
    p.add_argument("--range", type=int, nargs=2, default=None, metavar=("MIN", "MAX"),
                   help="explicit --range-num-images-per-batch for the tuned variants (default: the capped range)")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated from {', '.join(VARIANTS)} (default all)")
    p.add_argument("--reverse-first", action="store_true",
                   help="the first algorithm runs its variants in reverse order (then alternating), so two "
                        "processes of one algorithm each can alternate who goes first")
    p.add_argument("--target", type=float, default=0.80)
    p.add_argument("--device", default="cpu")
    return p.parse_args(argv)


def parse_variants(text: str) -> tuple[str, ...]:
    """``--variants`` as a tuple in table order; one clear line for an unknown name."""
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown or not names:
        raise SystemExit(f"--variants: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(VARIANTS)}")
    return tuple(v for v in VARIANTS if v in names)


def _settings(cfg: BundleConfig) -> dict[str, Any]:
    return {"num_patches_per_iter": cfg.num_patches_per_iter, "num_images_per_batch": cfg.num_images_per_batch,
            "num_crops_per_image": cfg.num_crops_per_image, "learning_rate": cfg.learning_rate,
            "roi_size": list(cfg.roi_size), "lr_warmup_samples": cfg.lr_warmup_samples}


def prepare(args: argparse.Namespace, work: Path, algo: str, variants: tuple[str, ...]) -> dict[str, Any]:
    """The generated bundle of fold 0 and a tuned copy per tuned variant; their folders and tuning records.

    The entry keeps the first tuned variant's record at its top level too (``batch``, ``recipe``,
    ``tune_command``, ``tune_wall_s``), as results written before ``--variants`` had it.
    """
    from autotune.bundles.config import load_bundle_config

    generated = work / f"{algo}_0"
    entry: dict[str, Any] = {"generated": str(generated), "tune": {},
                             "settings": {"generated": _settings(load_bundle_config(generated))}}
    for variant in (v for v in variants if v in TUNE_FLAGS):
        tuned = fresh_copy(generated, work / variant / f"{algo}_0")
        command = [sys.executable, "-m", "autotune", "tune", str(tuned), "--device", args.device, "--memory-limit",
                   args.limit, *TUNE_FLAGS[variant], "--storage", f"sqlite:///{work / f'studies_{variant}.db'}"]
        if args.range:
            command += ["--range-num-images-per-batch", *map(str, args.range)]
        t0 = time.monotonic()
        run_logged(command, work / f"tune_{algo}_{variant}.log")
        cfg = load_bundle_config(tuned)
        block = cfg.plan
        entry[variant] = str(tuned)
        entry["settings"][variant] = _settings(cfg)
        entry["tune"][variant] = {"tune_command": " ".join(command[1:]),
                                  "tune_wall_s": round(time.monotonic() - t0, 1), "batch": block.batch,
                                  "recipe": block.recipe, "handoff": block.handoff, "probes": block.probes}
        for key in ("tune_command", "tune_wall_s", "batch", "recipe"):
            entry.setdefault(key, entry["tune"][variant][key])
        if block.handoff:
            print(f"[{algo}] {variant}: {block.handoff['line']}", flush=True)
    return entry


def variants_of(entry: dict[str, Any]) -> list[str]:
    """The variants an entry holds, in table order (old results: generated, tuned)."""
    return [v for v in KNOWN_VARIANTS if v in entry.get("settings", {})]


def _batch_of(entry: dict[str, Any], variant: str) -> dict[str, Any]:
    """The tuning's batch record of a tuned variant (old results hold one, at the entry's top level)."""
    return (entry.get("tune", {}).get(variant) or entry).get("batch") or {}


def train_run(args: argparse.Namespace, bundle: Path, label: str, work: Path) -> dict[str, Any]:
    """Train a private copy of ``bundle`` for the budget; return its measurements."""
    copy = fresh_copy(bundle, work / "runs" / label)
    command = [sys.executable, "-m", "autotune.trainer", str(copy), "--mode", "fast", "--device", args.device,
               "--epochs", str(args.epochs), "--max-time", f"{args.budget:g}", "--val-every", "1"]
    load_before = os.getloadavg()
    t0 = time.monotonic()
    with LoadSampler() as load:
        run_logged(command, work / f"{label}.log")
    wall = time.monotonic() - t0
    rows = metrics_rows(copy)
    validated = [r for r in rows if r.get("mean_dice") is not None]
    reached = first_at(validated, args.target)
    steady = rows[1:] or rows
    return {
        "command": " ".join(command[1:]).replace(str(copy), "BUNDLE"),
        "epochs": len(rows),
        "steps_per_epoch": rows[0].get("steps"),
        "train_s_per_epoch": statistics.median(r["train_s"] for r in steady),
        "samples_per_s": statistics.median(r["samples_per_s"] for r in steady),
        "time_to_target_s": reached["elapsed_s"] if reached else None,
        "epoch_at_target": reached["epoch"] if reached else None,
        "best_dice": max((r["mean_dice"] for r in validated), default=None),
        "final_dice": validated[-1]["mean_dice"] if validated else None,
        "last_elapsed_s": rows[-1]["elapsed_s"] if rows else None,
        "curve": [[r["epoch"], round(r["elapsed_s"], 1), round(r["mean_dice"], 4), r["lr"]] for r in validated],
        "loss_curve": _loss_curve(rows),
        "wall_s": round(wall, 1),
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        "load_during_run": load.summary(),
    }


def _loss_curve(rows: list[dict[str, Any]]) -> list[list[float]]:
    """[epoch, wall s, mean training loss, optimizer steps] per epoch."""
    return [[r["epoch"], round(r["elapsed_s"], 1), round(r["loss"], 4), r.get("steps")] for r in rows]


def _add_loss_curves(report: dict[str, Any], work: Path) -> None:
    """Runs recorded before the loss curve was kept: read it from their metrics in ``work``."""
    for algo, entry in report["algos"].items():
        for variant, run in entry.get("runs", {}).items():
            metrics = work / "runs" / f"{algo}_{variant}" / "model_fold0" / "metrics.json"
            if "loss_curve" not in run and metrics.is_file():
                run["loss_curve"] = _loss_curve(json.loads(metrics.read_text())["rows"])


def _load_cell(run: dict[str, Any]) -> str:
    """The load during the run (mean, min-max) where it was sampled, else the 1-minute load just before it."""
    during = run.get("load_during_run")
    if during and during.get("samples"):
        return f"{during['mean']:.1f} ({during['min']:.1f}-{during['max']:.1f}) during"
    return f"{run['load_avg_before'][0]:.1f} before"


def table(report: dict[str, Any]) -> str:
    """The markdown table of a report (what goes into BENCHMARKS.md)."""
    lines = ["| algo | variant | patches/step (largest that fits) | lr | steps/epoch | epochs run | "
             "samples/s | time to Dice 0.80 | best mean Dice in the run | load average |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for algo, entry in report["algos"].items():
        for variant in variants_of(entry):
            run = entry.get("runs", {}).get(variant)
            s = entry["settings"][variant]
            fits = f" ({_batch_of(entry, variant).get('predicted_largest_fit')})" if variant != "generated" else ""
            if run is None:
                lines.append(f"| {algo} | {variant} | {s['num_patches_per_iter']}{fits} | {s['learning_rate']:.3g} "
                             "| not run | | | | | |")
                continue
            reached = (f"{run['time_to_target_s']:.0f} s (epoch {run['epoch_at_target']})"
                       if run["time_to_target_s"] else f"not in {run['last_elapsed_s']:.0f} s")
            lines.append(
                f"| {algo} | {variant} | {s['num_patches_per_iter']}{fits} | {s['learning_rate']:.3g} | "
                f"{cell(run['steps_per_epoch'], 'd')} | {run['epochs']} | {run['samples_per_s']:.2f} | {reached} | "
                f"{cell(run['best_dice'])} | {_load_cell(run)} |")
    return "\n".join(lines)


def curves(report: dict[str, Any]) -> str:
    """Validation mean Dice after each epoch, as ``wall s: Dice`` pairs, for both variants."""
    lines = ["| algo | variant | (wall s: validation mean Dice) after each epoch | training loss per epoch |",
             "|---|---|---|---|"]
    for algo, entry in report["algos"].items():
        for variant in variants_of(entry):
            run = entry.get("runs", {}).get(variant)
            if run:
                points = ", ".join(f"{c[1]:.0f}: {c[2]:.3f}" for c in run["curve"])
                losses = ", ".join(f"{c[2]:.3f}" for c in run.get("loss_curve", []))
                lines.append(f"| {algo} | {variant} | {points} | {losses} |")
    return "\n".join(lines)


def verdicts(report: dict[str, Any]) -> str:
    """The goodput rule's verdict per template (the ``handoff`` variant), as the tuning block states it."""
    lines = ["| algo | largest fit (cap) | handed over | verdict |", "|---|---:|---:|---|"]
    for algo, entry in report["algos"].items():
        tuned = entry.get("tune", {}).get("handoff")
        if tuned and tuned.get("handoff"):
            verdict = tuned["handoff"]
            lines.append(f"| {algo} | {tuned['batch'].get('largest_fit_in_range')} | {verdict.get('handed')} | "
                         f"{verdict.get('line')} |")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    """Dice against wall seconds, one panel per template, one line per variant."""
    panels = []
    for algo, entry in report["algos"].items():
        lines = []
        for variant in variants_of(entry):
            run = entry.get("runs", {}).get(variant)
            if run and run["curve"]:
                n = entry["settings"][variant]["num_patches_per_iter"]
                lines.append((f"{variant} ({n} patches/step)", [c[1] for c in run["curve"]], [c[2] for c in run["curve"]]))
        panels.append((algo, lines))
    dice_plot(path, panels, "wall s (from the run's start, caching included)", target=report["settings"]["target"])
def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    out = Path(args.out)
    if args.report_only:
        report = json.loads(out.read_text())
        _add_loss_curves(report, Path(args.work))
        write_json(out, report)
        plot(report, out.with_suffix(".png"))
        print(table(report))
        print()
        print(curves(report))
        if any("tune" in entry for entry in report["algos"].values()):
            print()
            print(verdicts(report))
        return 0
    import monai

    variants = parse_variants(args.variants)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    algos = args.algos.split(",")
    generate_bundles(args.data, work, algos, num_fold=5)
    report: dict[str, Any] = {
        "benchmark": "time to Dice: generated vs tuned bundles (largest fit under the batch cap with the lr rule; "
                     "the goodput hand-off)",
        "variants": list(variants),
        "data": args.data, "fold": 0,
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "work", "report_only")},
        "environment": environment(monai=monai.__version__),
        "command": command("benchmarks.bench_batch_scaling", argv),
        "algos": {},
    }
    for index, algo in enumerate(algos):
        entry = report["algos"][algo] = prepare(args, work, algo, variants)
        entry["runs"] = {}
        order = variants if (index + args.reverse_first) % 2 == 0 else variants[::-1]  # alternate who goes first
        entry["order"] = list(order)
        for variant in order:
            print(f"[{algo}] training {variant} for {args.budget:g} s ...", flush=True)
            entry["runs"][variant] = train_run(args, Path(entry[variant]), f"{algo}_{variant}", work)
            write_json(out, report)
            plot(report, out.with_suffix(".png"))
    print(table(report))
    print()
    print(verdicts(report))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
