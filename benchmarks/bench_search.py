"""Search benchmark: `fast` against Auto3DSeg-style `tpe` (20 trials), against the truth.

For each template (tiny preset, 32^3, synthetic demo data) and three memory limits, the
true largest patches-per-iteration under the budget (limit less the 10% margin) is found
by exhaustive probing (N = 1, 2, ... until one does not fit); then each strategy runs on
a fresh SQLite study, and we record the real probes it used, its wall time and whether it
found the true maximum. Everything runs in one process, side by side, on the CPU.

    python benchmarks/bench_search.py [--algos segresnet,dints,unet] [--tpe-trials 20] [--out benchmarks/results/search.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

MARGIN = 0.10


def make_bundles(root: Path, algos: list[str]) -> dict[str, Path]:
    from autotune.bundles.bundlegen import BundleGen
    from autotune.commands.bundles import load_overrides
    from autotune.data.analyze import analyze
    from autotune.data.synthetic import make_demo_dataset

    data = make_demo_dataset(root / "data", cases=2, size=32, classes=2, seed=0)
    res = analyze(data, root / "work", num_fold=1, progress=False)
    gen = BundleGen(root / "work", algos=algos, data_stats_filename=res.datastats, data_src_cfg_name=res.data_src)
    return {b["algo"]: Path(b["path"]) for b in gen.generate(root / "work", num_fold=1, overrides=load_overrides("tiny"))}


def exhaustive_max(bundle: Path, limit: int, hi: int) -> tuple[int, int, float]:
    """Probe N = 1, 2, ... (training phase) until one does not fit; returns (max, probes, seconds)."""
    from autotune.probe.runner import run_probe

    budget = int(limit * (1 - MARGIN))
    start = time.perf_counter()
    best, probes = 0, 0
    for n in range(1, hi + 1):
        res = run_probe(bundle, num_patches_per_iter=n, device="cpu", memory_limit=limit, phases=("train",))
        probes += 1
        if res["status"] == "ok" and res["peak_bytes"] <= budget:
            best = n
        else:
            break
    return best, probes, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", default="segresnet,dints,unet")
    parser.add_argument("--points", default="2.5,5.5,9.5", help="limits as patches' worth of estimated memory")
    parser.add_argument("--tpe-trials", type=int, default=20)
    parser.add_argument("--out", default="benchmarks/results/search.json")
    args = parser.parse_args()

    from autotune.probe.estimate import fit_memory_model
    from autotune.search.tune import tune_bundles

    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    points = [float(p) for p in args.points.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        root = Path(tmp)
        bundles = make_bundles(root, algos)
        for algo in algos:
            bundle = bundles[algo]
            model = fit_memory_model(bundle, phase="train", device="cpu")
            for k, point in enumerate(points):
                limit = int((model.intercept + point * model.slope) / (1 - MARGIN))
                true_max, ex_probes, ex_seconds = exhaustive_max(bundle, limit, 64)
                row = {"algo": algo, "limit_bytes": limit, "true_max": true_max, "exhaustive_probes": ex_probes,
                       "exhaustive_seconds": round(ex_seconds, 2)}
                for strategy, specs in (("fast", None), ("tpe", {"universal": {"num_trials": args.tpe_trials}})):
                    storage = f"sqlite:///{root / f'{algo}-{k}-{strategy}.db'}"
                    start = time.perf_counter()
                    res = tune_bundles([bundle], specs, device="cpu", memory_limit=limit, storage=storage,
                                       strategy=strategy, margin=MARGIN, progress=None, write_back=False)[0]
                    seconds = time.perf_counter() - start
                    found = res.get("max_num_patches_per_iter")
                    import optuna

                    trials = optuna.load_study(study_name=res["study_name"], storage=storage).get_trials()
                    train_probes = sum(1 for t in trials if t.user_attrs.get("phases") == ["train"])
                    row[strategy] = {
                        "probes": res.get("probes"),
                        "train_probes": train_probes,
                        "seconds": round(seconds, 2),
                        "max_found": found,
                        "chosen": res.get("num_patches_per_iter"),
                        "sw_batch": res.get("num_sw_batch_size"),
                        "exact": found == true_max,
                    }
                rows.append(row)
                f, t = row["fast"], row["tpe"]
                print(f"{algo:<10} limit {limit / 2**20:7.1f} MiB  true max {true_max:>3} | fast: max {f['max_found']!s:>3} "
                      f"({'exact' if f['exact'] else 'WRONG'}) {f['probes']} probes ({f['train_probes']} training) "
                      f"{f['seconds']:6.1f} s | tpe-{args.tpe_trials}: max {t['max_found']!s:>3} "
                      f"({'exact' if t['exact'] else 'not exact'}) {t['probes']} probes {t['seconds']:6.1f} s",
                      flush=True)
    fast_s = sum(r["fast"]["seconds"] for r in rows)
    tpe_s = sum(r["tpe"]["seconds"] for r in rows)
    summary = {
        "rows": rows,
        "fast_exact_everywhere": all(r["fast"]["exact"] for r in rows),
        "fast_max_training_probes": max(r["fast"]["train_probes"] for r in rows),
        "tpe_exact_count": sum(r["tpe"]["exact"] for r in rows),
        "fast_seconds_total": round(fast_s, 1),
        "tpe_seconds_total": round(tpe_s, 1),
        "tpe_over_fast_wall_ratio": round(tpe_s / fast_s, 2) if fast_s else None,
        "command": " ".join(["python", *sys.argv]),
    }
    print()
    print(f"{'algo':<10} {'limit MiB':>9} {'true':>5} {'fast max':>8} {'fast probes':>11} {'fast s':>7} "
          f"{'tpe max':>7} {'tpe probes':>10} {'tpe s':>7}")
    for r in rows:
        print(f"{r['algo']:<10} {r['limit_bytes'] / 2**20:9.1f} {r['true_max']:>5} {r['fast']['max_found']!s:>8} "
              f"{r['fast']['train_probes']:>5} ({r['fast']['probes']:>3}) {r['fast']['seconds']:>7.1f} "
              f"{r['tpe']['max_found']!s:>7} {r['tpe']['probes']:>10} {r['tpe']['seconds']:>7.1f}")
    print(f"fast exact everywhere: {summary['fast_exact_everywhere']}; most training probes: "
          f"{summary['fast_max_training_probes']}; tpe exact in {summary['tpe_exact_count']}/{len(rows)}; "
          f"wall: fast {fast_s:.0f} s, tpe {tpe_s:.0f} s ({summary['tpe_over_fast_wall_ratio']}x)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
