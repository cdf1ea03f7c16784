"""MONAI's SegResNet trained by MONAI's own train.py: as generated, tuned (default hand-off), tuned (largest).

    nice -n 10 python -m benchmarks.bench_monai_handoff --wall 1500
    python -m benchmarks.bench_monai_handoff --report-only

1. **Data**: the first ``--cases`` cases (by file name) of Task04_Hippocampus, ``autotune.analyze`` with 5
   folds: fold 0 trains on 80 and validates on 20 of 100.
2. **Bundles**: ``autotune.BundleGen`` with MONAI's official templates (``../shared/monai/algorithm_templates``),
   as docs/monai-bundles.md shows, three times into three folders: ``generated`` (``generate(num_fold=5)``,
   no tuning), ``goodput`` (``gpu_customization=True`` with the seed's specs, ``memory_limit`` 4GiB on the
   CPU, the default hand-off) and ``largest`` (the same with ``handoff="largest"``; one storage, so it
   reads the first tuning's probes back and decides again).
3. **Training**: fold 0 of each, MONAI's ``scripts/train.py run`` through ``python -m autotune.launch
   --memory-limit 4GiB --device cpu``, the three side by side, started together and stopped by SIGTERM
   after ``--wall`` seconds (the launcher keeps its record). The same run options for all three: validation
   every epoch (``--num_epochs_per_validation=1``), ``--num_workers`` loader workers, one torch thread
   (``OMP_NUM_THREADS=1``), MONAI's seeded mode (``--determ=True``: equal data and initial weights, so a
   difference comes from the bundles, not the draw).
4. **Dice against wall**: each row of MONAI's ``accuracy_history.csv`` (mean validation Dice), stamped
   with the wall since its launch started when it appeared (polled every 2 s). The ratio: the wall the
   generated bundle took to its best Dice over the wall the other took to reach that Dice (>= 1.0: no
   slower).

Writes ``benchmarks/results/monai_handoff.json`` after every poll (a cut-off run keeps what it had) and a PNG
of Dice against wall beside it.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    LoadSampler,
    cell,
    dice_plot,
    environment,
    parser,
    read_json,
    write_json,
)

REPO = Path(__file__).resolve().parents[1]

DEFAULT_DATA = REPO.parent / "shared" / "datasets" / "Task04_Hippocampus"
DEFAULT_TEMPLATES = REPO.parent / "shared" / "monai" / "algorithm_templates"
VARIANTS = ("generated", "goodput", "largest")
#: the seed's gpu_customization_specs (docs/monai-bundles.md)
SPECS = {"universal": {"num_trials": 20, "range_num_images_per_batch": [1, 20], "range_num_sw_batch_size": [1, 40]}}


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__, "monai_handoff.json")
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.add_argument("--templates", default=str(DEFAULT_TEMPLATES))
    p.add_argument("--work", default="/tmp/autotune_bench_monai_handoff", help="scratch folder (replaced)")
    p.add_argument("--cases", type=int, default=100, help="the first N cases by file name")
    p.add_argument("--limit", default="4GiB", help="the memory limit to tune at and to train under")
    p.add_argument("--wall", type=float, default=1500, help="wall seconds each training runs (side by side)")
    p.add_argument("--num-workers", type=int, default=1, help="MONAI's loader workers, the same for all three")
    p.add_argument("--timeout", type=float, default=3600, help="seconds before a tuning probe is killed")
    p.add_argument("--variants", default=",".join(VARIANTS), help="a subset, for a trial of the script itself")
    p.add_argument("--keep-storage", action="store_true",
                   help="keep --work's analysis and tuning storage (the bundles are generated and trained afresh)")
    return p.parse_args(argv)


def prepare_data(data: Path, work: Path, cases: int) -> Any:
    """The first ``cases`` cases as a datalist, analysed with 5 folds."""
    import autotune

    names = sorted(p.name for p in (data / "imagesTr").glob("*.nii.gz"))[:cases]
    datalist = {"training": [{"image": f"imagesTr/{n}", "label": f"labelsTr/{n}"} for n in names]}
    (work / "datalist_input.json").write_text(json.dumps(datalist, indent=1))
    (work / "input.yaml").write_text(f"modality: MRI\ndatalist: {work / 'datalist_input.json'}\ndataroot: {data}\n")
    return autotune.analyze(work / "input.yaml", work, num_fold=5, progress=False)


def generate(variant: str, work: Path, analysed: Any, args: argparse.Namespace, storage: str) -> Path:
    """One variant's fold-0 bundle, generated (and tuned) by ``autotune.BundleGen`` in its own folder."""
    import autotune

    folder = work / variant
    folder.mkdir()
    gen = autotune.BundleGen(algo_path=str(folder), algos="segresnet", data_stats_filename=analysed.datastats,
                             data_src_cfg_name=analysed.data_src, templates_path_or_url=args.templates)
    tune = {} if variant == "generated" else {
        "gpu_customization": True, "gpu_customization_specs": SPECS, "device": "cpu", "memory_limit": args.limit,
        "storage": storage, "timeout": args.timeout, "handoff": variant, "progress": print}
    cwd = os.getcwd()
    os.chdir(folder)  # SegResNet's algo writes runner.log into the working folder
    try:
        bundles = gen.generate(str(folder), num_fold=5, **tune)
    finally:
        os.chdir(cwd)
    return Path(next(b for b in bundles if b.endswith("segresnet_0")))


def bundle_facts(bundle: Path) -> dict[str, Any]:
    """What the bundle trains with, and the hand-off's verdict when it was tuned."""
    import yaml

    hyper = yaml.safe_load((bundle / "configs" / "hyper_parameters.yaml").read_text())
    inferrer = hyper.get("sliding_inferrer") or {}
    facts: dict[str, Any] = {
        "bundle": str(bundle), "batch_size": hyper.get("batch_size"), "num_crops_per_image":
        hyper.get("num_crops_per_image"), "learning_rate": hyper.get("learning_rate"),
        "auto_scale_allowed": hyper.get("auto_scale_allowed"), "sw_batch_size": inferrer.get("sw_batch_size", 1),
        "roi_size": hyper.get("roi_size")}
    tuning = bundle / "autotune" / "tuning.yaml"
    if tuning.is_file():
        plan = yaml.safe_load(tuning.read_text())
        handoff = plan.get("handoff") or {}
        facts.update(handed=plan.get("num_patches_per_iter"), largest_fit=plan.get("max_num_patches_per_iter"),
                     verdict=handoff.get("line"), rule=handoff.get("rule"), tuned_peak_bytes=plan.get("peak_bytes"),
                     lr=(plan.get("recipe") or {}).get("learning_rate"), probes=plan.get("probes"),
                     tuning_wall_s=plan.get("wall_seconds"))
    return facts


def _command(bundle: Path, args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "autotune.launch", "--memory-limit", args.limit, "--device", "cpu", "--",
            str(bundle / "scripts" / "train.py"), "run",
            f"--config_file={bundle / 'configs' / 'hyper_parameters.yaml'}", "--num_epochs_per_validation=1",
            f"--num_workers={args.num_workers}", "--determ=True"]


def _history(bundle: Path) -> list[dict[str, Any]]:
    """The rows of MONAI's accuracy_history.csv (epoch, metric, ...) so far."""
    path = bundle / "model" / "accuracy_history.csv"
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        rows = [r for r in csv.reader(handle, delimiter="\t") if r]
    if not rows:
        return []
    header, out = rows[0], []
    for row in rows[1:]:
        item = dict(zip(header, row, strict=False))
        try:
            item["metric"], item["epoch"] = float(item["metric"]), int(item["epoch"])
        except (KeyError, ValueError):
            continue
        out.append(item)
    return out


def train_side_by_side(bundles: dict[str, Path], args: argparse.Namespace, report: dict[str, Any],
                       out: Path) -> None:
    """Start the three launches together; stamp each new CSV row; SIGTERM each after ``--wall``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs, logs, started = {}, {}, {}
    for variant, bundle in bundles.items():
        logs[variant] = open(bundle.parent / "train.log", "w")  # noqa: SIM115 - closed when the run ends
        procs[variant] = subprocess.Popen(_command(bundle, args), stdout=logs[variant], stderr=subprocess.STDOUT,
                                          env=env, cwd=str(bundle), start_new_session=True)
        started[variant] = time.monotonic()
        report["runs"][variant]["curve"] = []
    with LoadSampler() as load:
        while any(p.poll() is None for p in procs.values()):
            for variant, proc in procs.items():
                now = time.monotonic() - started[variant]
                seen = report["runs"][variant]["curve"]
                for row in _history(bundles[variant])[len(seen):]:
                    seen.append({"wall_s": round(now, 1), "epoch": row["epoch"], "dice": row["metric"],
                                 "epoch_time": row.get("epoch_time"), "time": row.get("time")})
                if proc.poll() is None and now >= args.wall:
                    proc.send_signal(signal.SIGTERM)
            report["load"] = load.summary()
            write_json(out, report)
            time.sleep(2.0)
    for variant, proc in procs.items():
        logs[variant].close()
        run = report["runs"][variant]
        run["exit_code"] = proc.returncode
        record = bundles[variant] / "autotune" / "launch.json"
        run["launch"] = read_json(record) if record.is_file() else None
        run["wall_s"] = round(args.wall, 1)


def first_reaching(curve: list[dict[str, Any]], dice: float) -> float | None:
    """The wall at which ``curve`` first reaches ``dice`` (None: never)."""
    return next((point["wall_s"] for point in curve if point["dice"] >= dice - 1e-9), None)


def summarise(report: dict[str, Any]) -> dict[str, Any]:
    """The generated bundle's best Dice and the wall it took; each variant's wall to it and the ratio."""
    base = (report["runs"].get("generated") or {}).get("curve")
    if not base:
        return {}
    best = max(point["dice"] for point in base)
    took = first_reaching(base, best)
    summary: dict[str, Any] = {"generated_best_dice": best, "generated_wall_s": took}
    for variant in VARIANTS[1:]:
        curve = report["runs"].get(variant, {}).get("curve") or []
        reached = first_reaching(curve, best)
        summary[variant] = {"wall_to_generated_best_s": reached,
                            "ratio": round(took / reached, 3) if reached and took else None,
                            "best_dice": max((p["dice"] for p in curve), default=None)}
    return summary


def table(report: dict[str, Any]) -> str:
    """The markdown table: per bundle, what it trains with, epochs, best Dice, wall to the generated's best."""
    summary = report.get("summary") or {}
    lines = ["| bundle | batch (patches/step) | lr | sw batch | epochs validated | s/epoch (median) | best Dice "
             "| wall to generated's best | ratio |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for variant in VARIANTS:
        run = report["runs"].get(variant)
        if not run:
            continue
        facts, curve = run.get("facts") or {}, run.get("curve") or []
        batch = (facts.get("batch_size") or 1) * (facts.get("num_crops_per_image") or 1)
        walls = [b["wall_s"] - a["wall_s"] for a, b in zip(curve, curve[1:], strict=False)]
        per_epoch = sorted(walls)[len(walls) // 2] if walls else None
        best = max((p["dice"] for p in curve), default=None)
        if variant == "generated":
            reach, ratio = summary.get("generated_wall_s"), 1.0 if curve else None
        else:
            reach, ratio = (summary.get(variant) or {}).get("wall_to_generated_best_s"), \
                (summary.get(variant) or {}).get("ratio")
        lines.append(f"| {variant} | {batch} | {facts.get('learning_rate')} | {facts.get('sw_batch_size')} | "
                     f"{len(curve)} | {cell(per_epoch, '.0f')} | {cell(best, '.4f')} | "
                     f"{cell(reach, '.0f') + ' s' if reach is not None else 'not reached'} | {cell(ratio, '.2f')} |")
    return "\n".join(lines) + "\n"


def curves(report: dict[str, Any]) -> str:
    """Dice against wall, one column per bundle (the rows as MONAI's accuracy_history.csv wrote them)."""
    lines = ["| bundle | (wall s, mean Dice) per validation |", "|---|---|"]
    for variant in [v for v in VARIANTS if v in report["runs"]]:
        curve = report["runs"][variant].get("curve") or []
        cells = ", ".join(f"({p['wall_s']:.0f}, {p['dice']:.4f})" for p in curve)
        lines.append(f"| {variant} | {cells or '-'} |")
    return "\n".join(lines) + "\n"


def launch_table(report: dict[str, Any]) -> str:
    """Per bundle: the hand-off's verdict, the tuned peak against MONAI's train.py's under the launcher, and how
    the launcher's record ended (each run is stopped by SIGTERM at the end of its wall)."""
    lines = ["| bundle | hand-off | tuned peak (probe), B | train.py's training peak, B | difference | launcher record "
             "| processes stopped |", "|---|---|---:|---:|---:|---|---:|"]
    for variant in [v for v in VARIANTS if v in report["runs"]]:
        run = report["runs"][variant]
        facts, record = run.get("facts") or {}, run.get("launch") or {}
        tuned, peak = facts.get("tuned_peak_bytes"), record.get("train_peak_bytes")
        diff = f"{(peak - tuned) / tuned:+.2%}" if tuned and peak else "-"
        ended = f"{record.get('status')}, {record.get('signal')}, exit {record.get('exit_code')}" if record else "-"
        lines.append(f"| {variant} | {facts.get('verdict') or 'as generated (not tuned)'} | "
                     f"{cell(tuned, ',')} | {cell(peak, ',')} | {diff} | {ended} | "
                     f"{record.get('stopped_processes', '-')} |")
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    """MONAI's validation Dice against minutes since launch, one line per variant, the stop dashed."""
    lines = []
    for variant in VARIANTS:
        run = report["runs"].get(variant) or {}
        curve, facts = run.get("curve") or [], run.get("facts") or {}
        batch = (facts.get("batch_size") or 1) * (facts.get("num_crops_per_image") or 1)
        empty = "" if curve else f": no validation within {report['wall_s'] / 60:.0f} min"
        lines.append((f"{variant} (batch {batch}, lr {facts.get('learning_rate')}){empty}",
                      [p["wall_s"] / 60 for p in curve], [p["dice"] for p in curve]))
    dice_plot(path, [("MONAI SegResNet, Task04_Hippocampus fold 0, CPU fp32", lines)],
              "wall since launch (min), three runs side by side; dashed: the stop", stop=report["wall_s"] / 60,
              ylabel="mean validation Dice (MONAI's accuracy_history.csv)")
def machine() -> dict[str, Any]:
    import torch

    return environment(bf16_native=bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
                       precision="fp32 (MONAI's scripts turn AMP off without CUDA)")


def run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from autotune.auto3dseg import identify

    work = Path(args.work)
    if args.keep_storage:  # the tuned variants answer from the earlier run's studies: no probe
        for variant in VARIANTS:
            shutil.rmtree(work / variant, ignore_errors=True)
    else:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"command": " ".join(["python", *sys.argv]), "machine": machine(), "cases": args.cases,
                              "limit": args.limit, "wall_s": args.wall, "num_workers": args.num_workers,
                              "date": time.strftime("%Y-%m-%d"), "runs": {}}
    analysed = prepare_data(Path(args.data), work, args.cases)
    storage = f"sqlite:///{work / 'studies.db'}"
    bundles = {}
    for variant in [v for v in VARIANTS if v in args.variants.split(",")]:
        started = time.perf_counter()
        bundles[variant] = generate(variant, work, analysed, args, storage)
        report["runs"][variant] = {"facts": bundle_facts(bundles[variant]),
                                   "generate_s": round(time.perf_counter() - started, 1)}
        write_json(out, report)
    report["template"] = identify(next(iter(bundles.values()))).label
    train_side_by_side(bundles, args, report, out)
    report["summary"] = summarise(report)
    return report


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    out = Path(args.out)
    report = read_json(out) if args.report_only else run(args, out)
    report["summary"] = summarise(report)
    write_json(out, report)
    plot(report, out.with_suffix(".png"))
    print(table(report))
    print(curves(report))
    print(launch_table(report))
    print(json.dumps(report["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
