"""The fast recipe's first epochs, seeded: per-epoch Dice of recipe and precision variants of one bundle.

Every variant trains a private copy of the same bundle (fold 0 of 5 of the dataset, the full-size
template, seed 0: the same initial weights and the same data order in every variant) in fast mode for
``--epochs`` epochs with validation after every epoch, its schedule planned for ``--epochs``. A
variant is ``NAME=PRECISION`` or ``NAME=PRECISION:JSON`` where JSON overrides bundle keys (e.g. the
optimizer's arguments); variants run ``--parallel`` at a time, each on one thread. Reports per
variant the mean Dice after chosen epochs, the first epoch whose Dice reaches 0.1 (the end of the
all-background stall), the best Dice, and for each low-precision variant its largest per-epoch
distance from the fp32 variant of the same recipe. It measures learning, not speed.

    python -m benchmarks.bench_early_training --algo unet --epochs 20 \\
        --variant 'momentum 0.9=fp32' --variant 'momentum 0.99=fp32:{"optimizer": {"name": "SGD", "args": {"momentum": 0.99, "nesterov": true, "weight_decay": 3.0e-05}}}'
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import HIPPOCAMPUS, LoadSampler, cpu_name, parser, read_json, report

REPO = Path(__file__).resolve().parents[1]

SHOWN_EPOCHS = (1, 2, 3, 5, 10, 15, 20, 30)
ESCAPE_DICE = 0.1


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__, "early_training_unet.json")
    p.add_argument("--data", default=str(HIPPOCAMPUS))
    p.add_argument("--work", default="/tmp/autotune_bench_early", help="scratch folder (its bundles are reused)")
    p.add_argument("--algo", default="unet", choices=("unet", "segresnet", "dints"))
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--variant", action="append", default=[], help="NAME=PRECISION[:JSON overrides]")
    p.add_argument("--parallel", type=int, default=2, help="variants trained at once, one thread each")
    return p.parse_args(argv)


def parse_variant(text: str) -> dict[str, Any]:
    """``NAME=PRECISION[:JSON]`` -> {"name", "precision", "overrides"}."""
    name, _, rest = text.partition("=")
    precision, _, overrides = rest.partition(":")
    if not name or precision not in ("fp32", "bf16", "fp16"):
        raise SystemExit(f"--variant {text!r}: expected NAME=fp32|bf16|fp16[:JSON]")
    return {"name": name, "precision": precision, "overrides": json.loads(overrides) if overrides else {}}


def make_bundle(args: argparse.Namespace, work: Path) -> Path:
    from autotune.data.analyze import analyze
    from autotune.facade.bundlegen import BundleGen

    bundle = work / f"{args.algo}_0"
    if not bundle.is_dir():
        result = analyze(args.data, work, num_fold=5, progress=False)
        gen = BundleGen(work, algos=args.algo, data_stats_filename=result.datastats, data_src_cfg_name=result.data_src)
        gen.generate(work, num_fold=5, overrides={"early_stop_patience": 0})
    return bundle


def start(bundle: Path, variant: dict[str, Any], args: argparse.Namespace, work: Path) -> tuple[Any, Path]:
    from autotune.bundles.config import update_bundle_config

    copy = work / "runs" / variant["name"].replace(" ", "_") / variant["precision"]
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(bundle, copy)
    if variant["overrides"]:
        update_bundle_config(copy, variant["overrides"])
    argv = [sys.executable, "-m", "autotune.trainer", str(copy), "--device", "cpu", "--epochs", str(args.epochs),
            "--val-every", "1", "--precision", variant["precision"], "-q"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    log = open(copy.parent / f"{variant['precision']}.log", "w")  # noqa: SIM115 - lives as long as the child
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env), copy


def result_of(copy: Path, variant: dict[str, Any], seconds: float, load: dict[str, Any]) -> dict[str, Any]:
    model = copy / "model_fold0"
    rows = read_json(model / "metrics.json")["rows"]
    summary = read_json(model / "train_summary.json")
    dice = [r["mean_dice"] for r in rows]
    escape = next((r["epoch"] for r in rows if (r["mean_dice"] or 0.0) >= ESCAPE_DICE), None)
    return {**variant, "precision_used": summary["precision"], "dice": dice, "loss": [r["loss"] for r in rows],
            "lr": [r["lr"] for r in rows], "nonfinite_steps": summary.get("nonfinite_steps"),
            "escape_epoch": escape, "best": max((d for d in dice if d is not None), default=None),
            "wall_s": round(seconds, 1), "load": load}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import monai
    import torch

    from autotune.precision import cpu_bf16_native

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    bundle = make_bundle(args, work)
    variants = [parse_variant(v) for v in args.variant]
    results: list[dict[str, Any]] = []
    for first in range(0, len(variants), max(1, args.parallel)):
        group = variants[first:first + max(1, args.parallel)]
        t0 = time.monotonic()
        with LoadSampler() as load:
            running = [(v, *start(bundle, v, args, work)) for v in group]
            for variant, proc, _ in running:
                if proc.wait() != 0:
                    raise SystemExit(f"variant {variant['name']} ({variant['precision']}) failed; see its log")
        results += [result_of(copy, v, time.monotonic() - t0, load.summary()) for v, _, copy in running]
    native, why = cpu_bf16_native()
    return {"benchmark": "early training, seeded", "algo": args.algo, "data": args.data, "epochs": args.epochs,
            "environment": {"cpu": cpu_name(), "cores": os.cpu_count(), "native_bf16": native, "bf16_check": why,
                            "torch": torch.__version__, "monai": monai.__version__, "date": time.strftime("%Y-%m-%d")},
            "results": results}


def _cell(value: Any) -> str:
    return "–" if value is None else f"{value:.3f}"


def table(report: dict[str, Any]) -> str:
    """Mean Dice after chosen epochs per variant (markdown), each low precision against fp32 of its recipe."""
    epochs = sorted({e for e in SHOWN_EPOCHS if e <= report["epochs"]} | {report["epochs"]})
    lines = ["| variant | precision | " + " | ".join(f"epoch {e}" for e in epochs)
             + f" | first epoch >= {ESCAPE_DICE} | best | max per-epoch distance from fp32 |",
             "|" + "---|" * (len(epochs) + 5)]
    fp32 = {r["name"]: r for r in report["results"] if r["precision"] == "fp32"}
    for r in report["results"]:
        ref = fp32.get(r["name"])
        distance = "–"
        if ref is not None and ref is not r:
            pairs = [(a, b) for a, b in zip(r["dice"], ref["dice"], strict=False) if a is not None and b is not None]
            distance = f"{max(abs(a - b) for a, b in pairs):.3f}" if pairs else "–"
        cells = [r["name"], r["precision_used"], *(_cell(r["dice"][e - 1] if e <= len(r["dice"]) else None) for e in epochs),
                 str(r["escape_epoch"] or "not reached"), _cell(r["best"]), distance]
        lines.append("| " + " | ".join(cells) + " |")
    env = report["environment"]
    lines.append("")
    lines.append(f"CPU: {env['cpu']} ({env['cores']} cores), native bf16: {'yes' if env['native_bf16'] else 'no'}; "
                 f"torch {env['torch']}, MONAI {env['monai']}; {report['algo']}, {report['epochs']} epochs, seed 0.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    report(args, lambda: run(args), table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
