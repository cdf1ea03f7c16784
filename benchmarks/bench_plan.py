"""Plans for GPUs this machine does not have (``--strategy estimate --target-gpu``).

Part 1: for the three full templates on the hippocampus data and three catalogue targets,
the time of one plan per algorithm and the planned patches per iteration / sw batch size.
Part 2 (the exactness check): on the CPU, the estimate-only plan next to the fast search
with real probes under the same memory limit (tiny preset, so real probes stay cheap);
the goal is identical values, since on the CPU the estimate is exact. (On the CPU the probe
and the estimator count bytes with one tracker, so this checks the fake pass and the search,
not real device memory.)

    python -m benchmarks.bench_plan [--data ../shared/datasets/Task04_Hippocampus] [--out benchmarks/results/plan.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import HIPPOCAMPUS, LoadSampler, command, generate_bundles, parser, report

TARGETS = ("t4", "a100-80gb", "h100-80gb")
ALGOS = ("segresnet", "dints", "unet")


def plans_table(report: dict[str, Any]) -> str:
    """Part 1: one row per catalogue target and template (what BENCHMARKS.md shows)."""
    lines = ["| target | algo | plan seconds | patches/iter | sw batch |", "|---|---|---:|---:|---:|"]
    for r in report["plans"]:
        lines.append(f"| {r['target']} | {r['algo']} | {r['seconds']} | {r['num_patches_per_iter']} | "
                     f"{r['num_sw_batch_size']} |")
    return "\n".join(lines)


def checks_table(report: dict[str, Any]) -> str:
    """Part 2: the estimate-only plan next to the fast search with real probes, on the CPU."""
    lines = ["| limit | algo | planned N / M (seconds) | probed N / M (probes, seconds) | identical |",
             "|---:|---|---|---|---|"]
    for c in report["cpu_checks"]:
        plan, fast = c["estimate"], c["fast"]
        lines.append(f"| {c['limit_mib']} MiB | {c['algo']} | {plan['max_N']} / {plan['M']} ({plan['seconds']:.2f} s) | "
                     f"{fast['max_N']} / {fast['M']} ({fast['probes']}, {fast['seconds']:.2f} s) | "
                     f"{'yes' if c['identical'] else 'NO'} |")
    return "\n".join(lines)


def main() -> int:
    p = parser(__doc__, "plan.json")
    p.add_argument("--data", default=str(HIPPOCAMPUS))
    p.add_argument("--limits-mib", default="24,48", help="CPU limits for the exactness check")
    args = p.parse_args()
    summary = report(args, lambda: measure(args), plans_table, checks_table)
    print(f"longest plan {summary['max_plan_seconds']} s; CPU plan identical to the probed search: "
          f"{summary['all_identical']}")
    return 0


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Plan every template for each target card, then check the CPU plan against the probed search."""

    from autotune.bundles.templates import load_overrides
    from autotune.search.driver.targets import resolve_target
    from autotune.stages import tune

    rows, checks = [], []
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
        root = Path(tmp)
        full = generate_bundles(Path(args.data), root / "full", list(ALGOS), analyze_folds=5, overrides={})
        for target_name in TARGETS:
            target = resolve_target("estimate", target_name, None, "cpu")
            for algo in ALGOS:
                start = time.perf_counter()
                with LoadSampler() as load:
                    res = tune([full[algo]], storage=f"sqlite:///{root / f'{target_name}.db'}",
                                       strategy="estimate", target=target, progress=None, write_back=False)[0]
                seconds = time.perf_counter() - start
                rows.append({"target": target_name, "algo": algo, "seconds": round(seconds, 2),
                             "roi": json.loads(json.dumps(res.get("key", {}).get("roi_size"))),
                             "num_patches_per_iter": res.get("num_patches_per_iter"),
                             "num_sw_batch_size": res.get("num_sw_batch_size"),
                             "validation_device": res.get("validation_device"),
                             "estimated_points": len(res.get("trials", [])), "load_during_plan": load.summary()})
                print(f"plan {target_name:<10} {algo:<10} {seconds:6.1f} s  N={res.get('num_patches_per_iter')} "
                      f"M={res.get('num_sw_batch_size')} on {res.get('validation_device')}", flush=True)
        tiny = generate_bundles(Path(args.data), root / "tiny", list(ALGOS), analyze_folds=5,
                                overrides=load_overrides("tiny"))
        for limit_mib in [int(v) for v in args.limits_mib.split(",")]:
            limit = limit_mib * 2**20
            for algo in ALGOS:
                out = {}
                for strategy in ("estimate", "fast"):
                    start = time.perf_counter()
                    with LoadSampler() as load:
                        res = tune([tiny[algo]], device="cpu", memory_limit=limit,
                                           storage=f"sqlite:///{root / f'cpu-{strategy}.db'}", strategy=strategy,
                                           progress=None, write_back=False)[0]
                    out[strategy] = {"N": res.get("num_patches_per_iter"), "max_N": res.get("max_num_patches_per_iter"),
                                     "M": res.get("num_sw_batch_size"), "probes": res.get("probes"),
                                     "seconds": round(time.perf_counter() - start, 2), "load": load.summary()}
                same = out["estimate"]["max_N"] == out["fast"]["max_N"] and out["estimate"]["M"] == out["fast"]["M"]
                checks.append({"algo": algo, "limit_mib": limit_mib, **out, "identical": same})
                print(f"cpu {limit_mib:>4} MiB {algo:<10} plan N={out['estimate']['max_N']} M={out['estimate']['M']} "
                      f"({out['estimate']['seconds']} s) | probed N={out['fast']['max_N']} M={out['fast']['M']} "
                      f"({out['fast']['probes']} probes, {out['fast']['seconds']} s) -> "
                      f"{'identical' if same else 'DIFFERENT'}", flush=True)
    return {"plans": rows, "cpu_checks": checks, "all_identical": all(c["identical"] for c in checks),
            "max_plan_seconds": max(r["seconds"] for r in rows), "command": command("benchmarks.bench_plan")}


if __name__ == "__main__":
    sys.exit(main())
