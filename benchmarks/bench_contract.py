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

    python benchmarks/bench_contract.py [--data ../shared/datasets/Task04_Hippocampus] [--cases 60] [--limit 1GiB]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ALGOS = ("unet", "segresnet", "dints")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "Task04_Hippocampus"
    parser.add_argument("--data", default=str(default))
    parser.add_argument("--cases", type=int, default=60)
    parser.add_argument("--limit", default="1GiB")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--algos", default=",".join(ALGOS))
    parser.add_argument("--out", default="benchmarks/results/contract.json")
    args = parser.parse_args()

    from autotune.bundles.bundlegen import BundleGen
    from autotune.data.analyze import analyze
    from autotune.search.tune import tune_bundles
    from autotune.train.runner import train
    from autotune.utils import format_bytes, parse_bytes

    data = Path(args.data)
    dataset = json.loads((data / "dataset.json").read_text())
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-contract-") as tmp:
        root = Path(tmp)
        datalist = {"training": [{"image": str((data / e["image"]).resolve()), "label": str((data / e["label"]).resolve())}
                                 for e in dataset["training"][: args.cases]]}
        (root / "datalist.json").write_text(json.dumps(datalist))
        res = analyze(root / "datalist.json", root / "work", num_fold=1, progress=False)
        gen = BundleGen(root / "work", algos=args.algos.split(","), data_stats_filename=res.datastats,
                        data_src_cfg_name=res.data_src)
        bundles = {b["algo"]: Path(b["path"]) for b in gen.generate(root / "work", num_fold=1)}
        for algo in args.algos.split(","):
            t0 = time.perf_counter()
            # The range as given, so the batch cap (which hands a smaller batch than fits) stays out of it.
            [tuned] = tune_bundles([bundles[algo]], device="cpu", memory_limit=args.limit,
                                   storage=f"sqlite:///{root / 'studies.db'}", progress=None,
                                   specs={"universal": {"range_num_images_per_batch": [1, 64]}})
            tune_s = time.perf_counter() - t0
            row = {"algo": algo, "limit": parse_bytes(args.limit), "status": tuned["status"],
                   "num_patches_per_iter": tuned.get("num_patches_per_iter"),
                   "num_sw_batch_size": tuned.get("num_sw_batch_size"), "tuned_peak_bytes": tuned.get("peak_bytes"),
                   "budget_bytes": tuned.get("budget_bytes"), "probes": tuned.get("probes"), "tune_s": round(tune_s, 1)}
            if tuned["status"] == "tuned":
                t1 = time.perf_counter()
                try:
                    summary = train(bundles[algo], device="cpu", epochs=args.epochs, val_every=1, progress=False)
                    row.update(train_status="ok", epochs_run=summary["epochs_run"],
                               train_peak_bytes=summary["train_peak_bytes"], val_peak_bytes=summary["val_peak_bytes"],
                               memory_limit_kept=summary["memory_limit"], best_metric=summary["best_metric"],
                               train_cases=summary["train_cases_per_rank"])
                    row["train_peak_over_budget"] = summary["train_peak_bytes"] / tuned["budget_bytes"]
                    row["val_peak_over_budget"] = summary["val_peak_bytes"] / tuned["budget_bytes"]
                except Exception as exc:  # noqa: BLE001 - an OOM in training is the finding
                    row.update(train_status=f"{type(exc).__name__}: {exc}")
                row["train_s"] = round(time.perf_counter() - t1, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = {"command": "python benchmarks/bench_contract.py " + " ".join(sys.argv[1:]), "cases": args.cases,
           "limit": args.limit, "epochs": args.epochs, "load_average_at_end": os.getloadavg(), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"\n{'algo':<10} {'N':>3} {'sw':>3} {'tuned peak':>11} {'budget':>11} {'train peak':>11} {'val peak':>11} "
          f"{'train/budget':>12} {'status':<8}")
    for r in rows:
        ratio = f"{100 * r['train_peak_over_budget']:.1f}%" if r.get("train_peak_over_budget") else "-"
        print(f"{r['algo']:<10} {r['num_patches_per_iter'] or '-':>3} {r['num_sw_batch_size'] or '-':>3} "
              f"{format_bytes(r['tuned_peak_bytes']):>11} {format_bytes(r['budget_bytes']):>11} "
              f"{format_bytes(r.get('train_peak_bytes')):>11} {format_bytes(r.get('val_peak_bytes')):>11} "
              f"{ratio:>12} {r.get('train_status', r['status']):<8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
