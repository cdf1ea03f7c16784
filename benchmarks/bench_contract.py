"""The memory contract end to end on the CPU: tune at L, train at L with validation, compare the peaks.

Full-size templates (no preset) on the first CASES cases of the hippocampus set, a fixed
limit chosen by hand (1 GiB: it binds for all three templates here), ``autotune``'s fast
tuner over the range 1-64 given explicitly (so the batch cap by the training set, which
hands training a smaller batch than fits, does not apply), then 2 epochs of fast training with validation every epoch under the same limit
(the tuning block's limit, which training keeps by default). Reports per template the
tuned batch, the tuned peak and budget, and the training and validation peaks (tracked
tensor bytes, the same count as the probe's), with the training peak over the budget
(goal: 80-100%, and no OOM).

On the CPU the probe, the estimator and training count bytes with one tracker: this checks
that training allocates what the probe allocated (loader batch, prefetched batch,
validation), not real device memory.

    python -m benchmarks.bench_contract [--data ../shared/datasets/Task04_Hippocampus] [--cases 60] [--limit 1GiB]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import HIPPOCAMPUS, LoadSampler, command, first_cases, generate_bundles, parser, report

ALGOS = ("unet", "segresnet", "dints")


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.2f} MiB"


def markdown_table(report: dict[str, Any]) -> str:
    """The markdown table of a report (what BENCHMARKS.md shows); a training peak off the tuned one by
    a little shows the difference in brackets."""
    lines = ["| algo | tuned N | tuned peak | budget | training peak | validation peak | training / budget | OOM |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in report["rows"]:
        train_peak = _mib(r.get("train_peak_bytes"))
        if r.get("train_peak_bytes") is not None and r.get("tuned_peak_bytes") is not None:
            diff = r["train_peak_bytes"] - r["tuned_peak_bytes"]
            if diff:
                train_peak += f" ({diff / 1024:+.0f} KiB)"
        ratio = f"{100 * r['train_peak_over_budget']:.1f}%" if r.get("train_peak_over_budget") else "-"
        status = r.get("train_status")
        oom = "-" if status is None else ("no" if status == "ok" else f"yes ({status})")
        lines.append(f"| {r['algo']} | {r['num_patches_per_iter'] or '-'} | {_mib(r.get('tuned_peak_bytes'))} | "
                     f"{_mib(r.get('budget_bytes'))} | {train_peak} | {_mib(r.get('val_peak_bytes'))} | {ratio} | {oom} |")
    return "\n".join(lines)


def _args() -> argparse.Namespace:
    p = parser(__doc__, "contract.json")
    p.add_argument("--data", default=str(HIPPOCAMPUS))
    p.add_argument("--cases", type=int, default=60)
    p.add_argument("--limit", default="1GiB")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--algos", default=",".join(ALGOS))
    return p.parse_args()


def _train_under_contract(row: dict[str, Any], bundle: Path, tuned: dict[str, Any], epochs: int) -> None:
    """Train the tuned bundle at its limit; its peaks against the budget go into ``row``."""
    from autotune.trainer.runner import train

    t1 = time.perf_counter()
    try:
        with LoadSampler() as load:
            summary = train(bundle, device="cpu", epochs=epochs, val_every=1, progress=False)
        row.update(train_status="ok", epochs_run=summary["epochs_run"],
                   train_peak_bytes=summary["train_peak_bytes"], val_peak_bytes=summary["val_peak_bytes"],
                   memory_limit_kept=summary["memory_limit"], best_metric=summary["best_metric"],
                   train_cases=summary["train_cases_per_rank"])
        row["train_peak_over_budget"] = summary["train_peak_bytes"] / tuned["budget_bytes"]
        row["val_peak_over_budget"] = summary["val_peak_bytes"] / tuned["budget_bytes"]
    except Exception as exc:  # noqa: BLE001 - an OOM in training is the finding
        row.update(train_status=f"{type(exc).__name__}: {exc}")
    row["train_s"] = round(time.perf_counter() - t1, 1)
    row["load_during_train"] = load.summary()


def main() -> int:
    args = _args()
    report(args, lambda: measure(args), markdown_table)
    return 0


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Tune each template at the limit, then train it there; the rows and the run's settings."""
    from autotune.stages import tune
    from autotune.utils import parse_bytes

    data = Path(args.data)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-contract-") as tmp:
        root = Path(tmp)
        bundles = generate_bundles(first_cases(data, args.cases, root), root / "work", args.algos.split(","))
        for algo in args.algos.split(","):
            t0 = time.perf_counter()
            # The range as given, so the batch cap (which hands a smaller batch than fits) stays out of it.
            with LoadSampler() as load:
                [tuned] = tune([bundles[algo]], device="cpu", memory_limit=args.limit,
                                       storage=f"sqlite:///{root / 'studies.db'}", progress=None,
                                       specs={"universal": {"range_num_images_per_batch": [1, 64]}})
            tune_s = time.perf_counter() - t0
            row = {"algo": algo, "limit": parse_bytes(args.limit), "status": tuned["status"],
                   "num_patches_per_iter": tuned.get("num_patches_per_iter"),
                   "num_sw_batch_size": tuned.get("num_sw_batch_size"), "tuned_peak_bytes": tuned.get("peak_bytes"),
                   "budget_bytes": tuned.get("budget_bytes"), "probes": tuned.get("probes"), "tune_s": round(tune_s, 1),
                   "load_during_tune": load.summary()}
            if tuned["status"] == "tuned":
                _train_under_contract(row, bundles[algo], tuned, args.epochs)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {"command": command("benchmarks.bench_contract"), "cases": args.cases, "limit": args.limit,
            "epochs": args.epochs, "load_average_at_end": os.getloadavg(), "rows": rows}


if __name__ == "__main__":
    sys.exit(main())
