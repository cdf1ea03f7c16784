"""Wall time of a probe against the time of the work it measures (CPU, tiny bundles).

For each template (tiny preset, 32^3 roi) a probe runs in an isolated child with its default
1 warm-up + 2 measured steps and sliding-window passes. Reported (median over --repeats):
the parent's wall time; the child's own split of it (interpreter start, torch/monai
imports, model build, the train phase, the infer phase); the measured work (2 x median
step + 2 x seconds per volume); the warm-up (phase time not measured: warm-up passes,
inputs, tracker set-up); exit (wall - the child's parts: interpreter teardown, result file,
reaping); and the overhead = wall - measured work. Each column is a median over the repeats (so
the columns need not add up). Prints a table and writes JSON.

    python -m benchmarks.bench_probe_overhead
    python -m benchmarks.bench_probe_overhead --repeats 5 --algos unet
    AUTOTUNE_PROBE_ISOLATION=subprocess python -m benchmarks.bench_probe_overhead   # a fresh interpreter per probe
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import LoadSampler, parser, read_json, write_json

REPO = Path(__file__).resolve().parents[1]

PARTS = ("interpreter_start", "imports", "build", "train", "infer")


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__, "probe_overhead.json", report_only=False)
    p.add_argument("--algos", default="segresnet,dints,unet")
    p.add_argument("--repeats", type=int, default=3, help="probes per template (default 3)")
    p.add_argument("--table-from", nargs="+", default=None, help="print the fixed-cost table of result JSONs and exit")
    return p.parse_args(argv)


def overhead_table(report: dict[str, Any]) -> str:
    """Markdown table of where one probe's wall time goes, from one result JSON."""
    lines = ["| algo | wall | interpreter start | torch+monai imports | build | train phase | infer phase | "
             "measured work | overhead |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        lines.append(f"| {r['algo']} | {r['wall']:.2f} s | {r['interpreter_start']:.2f} s | {r['imports']:.2f} s | "
                     f"{r['build']:.2f} s | {r['train']:.2f} s | {r['infer']:.2f} s | {r['work']:.2f} s | "
                     f"{r['overhead']:.2f} s ({r['overhead_fraction']:.0%}) |")
    return "\n".join(lines)


def fixed_cost_table(*reports: dict[str, Any]) -> str:
    """Markdown table of the fixed cost per isolation mode, from result JSONs (one or more reports)."""
    lines = ["| isolation | algo | wall | interpreter start / fork | torch+monai imports | build | exit | "
             "fixed cost (median) | first probe's fixed cost |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for report in reports:
        for r in report["rows"]:
            lines.append(f"| {r.get('isolation', 'subprocess')} | {r['algo']} | {r['wall']:.2f} s | "
                         f"{r['interpreter_start']:.2f} s | {r['imports']:.2f} s | {r['build']:.2f} s | "
                         f"{r['exit_and_ipc']:.2f} s | **{r['fixed_cost']:.2f} s** | {r['first_run_fixed_cost']:.2f} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the probes and print the table."""
    import monai
    import torch

    from autotune.probe.isolation import isolation_mode
    from autotune.probe.runner import run_probe
    from tests.probe_fixtures import make_tiny_bundles

    args = _args(argv)
    if args.table_from:
        print(fixed_cost_table(*(read_json(Path(path)) for path in args.table_from)))
        return 0
    algos = [a for a in args.algos.split(",") if a]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench_probe_overhead_") as tmp:
        bundles = make_tiny_bundles(tmp, algos)
        for algo in algos:
            runs = []
            for _ in range(args.repeats):
                with LoadSampler() as load:
                    result = run_probe(bundles[algo], timeout=600)
                if result["status"] != "ok":
                    raise SystemExit(f"{algo}: probe {result['status']}: {result['error_tail']}")
                run = {"wall": result["wall_seconds"],
                       "work": 2 * result["step_seconds_median"] + 2 * result["sw_seconds_per_volume"],
                       **{part: result["timings"].get(part, 0.0) for part in PARTS}}
                run["overhead"] = run["wall"] - run["work"]
                run["warmup_and_setup"] = run["train"] + run["infer"] - run["work"]  # warm-up passes, inputs
                run["exit_and_ipc"] = run["wall"] - sum(run[part] for part in PARTS)  # teardown, files, reaping
                run["load_during_probe"] = load.summary()
                runs.append(run)
            row: dict[str, Any] = {"algo": algo, "repeats": args.repeats, "isolation": isolation_mode()}
            for key in PARTS + ("wall", "work", "overhead", "warmup_and_setup", "exit_and_ipc"):
                row[key] = statistics.median(run[key] for run in runs)
            # fixed cost: everything before and after the phases (start, imports, build, exit)
            row["fixed_cost"] = statistics.median(run["interpreter_start"] + run["imports"] + run["build"]
                                                  + run["exit_and_ipc"] for run in runs)
            row["first_run_fixed_cost"] = (runs[0]["interpreter_start"] + runs[0]["imports"] + runs[0]["build"]
                                           + runs[0]["exit_and_ipc"])  # with forkserver: includes the server start
            row["overhead_fraction"] = statistics.median(run["overhead"] / run["wall"] for run in runs)
            row["runs"] = runs
            rows.append(row)
            print(f"  {algo}: done", file=sys.stderr)
    report = {
        "benchmark": "probe_overhead", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "torch": torch.__version__, "monai": monai.__version__, "device": "cpu"},
        "command": "python -m benchmarks.bench_probe_overhead " + " ".join(argv if argv is not None else sys.argv[1:]),
        "rows": rows,
    }
    print(overhead_table(report))
    print()
    print(fixed_cost_table(report))
    out = Path(args.out)
    write_json(out, report)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
