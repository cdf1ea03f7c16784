"""The replayed training curve against direct estimates, full-size templates: one trace, every N.

For each template (the full-size bundles ``bench_search`` generates on the shared hippocampus
set) and precision, the estimator traces training once at the marker batch
(``autotune.probe.replay``) and the replay at each N is compared with a direct estimate (a trace
at that N). Both are the estimator's numbers: this checks that the replay reproduces the
estimator, not that the estimator matches a device (``calibrate_cpu.py`` does that). Prints a
table and writes ``benchmarks/results/replay_check.json``.

    OMP_NUM_THREADS=1 taskset -c 0 python -m benchmarks.check_replay
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import command, cpu_name, parser, report


def markdown_table(report: dict[str, Any]) -> str:
    """The table of a replay check (what BENCHMARKS.md shows)."""
    lines = ["| algo | precision | crops | trace s | N checked | replay = direct estimate |",
             "|---|---|---:|---:|---|---|"]
    for r in report["rows"]:
        wrong = [p["n"] for p in r["points"] if p["replay"] != p["direct"]]
        lines.append(f"| {r['algo']} | {r['precision']} | {r['crops']} | {r['trace_s']:.2f} | "
                     f"{', '.join(str(p['n']) for p in r['points'])} | "
                     f"{'all, to the byte' if not wrong else 'NO at ' + ', '.join(map(str, wrong))} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the check; returns 0 when every replay equals its direct estimate, else 1."""
    p = parser(__doc__, "replay_check.json")
    p.add_argument("--algos", default="segresnet,dints,unet")
    p.add_argument("--sizes", default="1,2,3,5,7,8,13,37,64")
    args = p.parse_args(argv)
    result = report(args, lambda: measure(args, argv), markdown_table)
    return 0 if all(pt["replay"] == pt["direct"] for r in result["rows"] for pt in r["points"]) else 1


def measure(args: argparse.Namespace, argv: list[str] | None) -> dict[str, Any]:
    """Trace each template once per precision; the replayed peak against a direct estimate at every size."""
    import torch

    from autotune.probe.estimate import estimate
    from autotune.probe.replay import marker_batch, replay_of
    from autotune.probe.runner import resolve_request
    from benchmarks.bench_search import _bundles

    algos = [a for a in args.algos.split(",") if a]
    sizes = [int(v) for v in args.sizes.split(",")]
    native_bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="check_replay_") as tmp:
        bundles = _bundles(Path(tmp), "hippocampus", algos)
        for algo in algos:
            crops = int(resolve_request(bundles[algo], check_device=False)["config"].get("num_crops_per_image", 1) or 1)
            for precision in ("bf16", "fp32"):
                start = time.perf_counter()
                curve = replay_of(estimate(bundles[algo], phases=("train",), num_patches_per_iter=marker_batch(crops),
                                           record=True, precision=precision), crops)
                trace_s = time.perf_counter() - start
                points = [{"n": n, "replay": int(curve.predict(n)),
                           "direct": int(estimate(bundles[algo], phases=("train",), num_patches_per_iter=n,
                                                  precision=precision)["train_peak_bytes"])} for n in sizes]
                rows.append({"algo": algo, "precision": precision, "crops": crops, "trace_s": round(trace_s, 2),
                             "points": points})
                print(markdown_table({"rows": rows[-1:]}).splitlines()[-1], flush=True)
    return {"rows": rows, "machine": cpu_name(), "native_bf16": native_bf16,
            "command": command("benchmarks.check_replay", argv)}


if __name__ == "__main__":
    sys.exit(main())
