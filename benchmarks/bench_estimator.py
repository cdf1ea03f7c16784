"""Estimate vs measured peak memory, and estimate time vs step time (CPU, tiny bundles).

For each template (tiny preset, 32^3 roi), batch size N (and sliding-window batch M = N)
and AMP on/off: one real probe (isolated child, 1 warm-up + 2 measured steps, tracked tensor
peak) and one estimate (FakeTensorMode, in process). Reports |estimate - measured| / measured
for the train and infer phases, the time of one estimate against one measured training
step, and for the largest N the error of the affine fit (two estimates at N=1, 2) against
the measured peak. Prints a table and writes JSON.

    python -m benchmarks.bench_estimator                       # N = 1, 4
    python -m benchmarks.bench_estimator --sizes 1,2,8 --algos unet
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import LoadSampler, write_json

REPO = Path(__file__).resolve().parents[1]


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algos", default="segresnet,dints,unet")
    p.add_argument("--sizes", default="1,4", help="comma-separated N (= M) values (default 1,4)")
    p.add_argument("--amp", default="on,off", help="on, off or on,off (default both)")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "estimator.json"))
    return p.parse_args(argv)


def _rel(estimated: float, measured: float) -> float:
    return abs(estimated - measured) / measured


def markdown_table(report: dict[str, Any]) -> str:
    """The markdown table of an estimator report (what BENCHMARKS.md shows)."""
    lines = ["| algo | amp | N = M | train measured | train est. error | train fit error | infer measured | "
             "infer est. error | infer fit error | one estimate | one measured step |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        lines.append(f"| {r['algo']} | {'on' if r['amp'] else 'off'} | {r['n']} | {r['train_measured'] / 2**20:.2f} MiB | "
                     f"{abs(r['train_error']):.3%} | {abs(r['train_fit_error']):.3%} | "
                     f"{r['infer_measured'] / 2**20:.2f} MiB | {abs(r['infer_error']):.3%} | "
                     f"{abs(r['infer_fit_error']):.2%} | {r['estimate_seconds']:.2f} s | {r['step_seconds']:.3f} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; returns 0 when every error is within 5%, else 1."""
    import monai
    import torch

    from autotune.bundles.config import load_bundle_config
    from autotune.probe.estimate import estimate, fit_memory_model
    from autotune.probe.runner import run_probe
    from tests.probe_fixtures import make_tiny_bundles

    args = _args(argv)
    algos = [a for a in args.algos.split(",") if a]
    sizes = [int(v) for v in args.sizes.split(",")]
    amps = [v == "on" for v in args.amp.split(",")]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench_estimator_") as tmp:
        bundles = make_tiny_bundles(tmp, algos)
        for algo in algos:
            for amp in amps:
                cfg = {**load_bundle_config(bundles[algo]), "amp": amp}
                fits = {phase: fit_memory_model(cfg, phase=phase) for phase in ("train", "infer")}
                for n in sizes:
                    with LoadSampler() as load:
                        measured = run_probe(cfg, num_patches_per_iter=n, num_sw_batch_size=n, timeout=600)
                    if measured["status"] != "ok":
                        raise SystemExit(f"{algo} amp={amp} N={n}: probe {measured['status']}: {measured['error_tail']}")
                    start = time.perf_counter()
                    est = estimate(cfg, num_patches_per_iter=n, num_sw_batch_size=n)
                    est_seconds = time.perf_counter() - start
                    row = {
                        "algo": algo, "amp": amp, "n": n,
                        "train_measured": measured["train_peak_bytes"], "train_estimated": est["train_peak_bytes"],
                        "infer_measured": measured["infer_peak_bytes"], "infer_estimated": est["infer_peak_bytes"],
                        "train_fit": fits["train"].predict(n), "infer_fit": fits["infer"].predict(n),
                        "estimate_seconds": est_seconds, "step_seconds": measured["step_seconds_median"],
                        "sw_seconds_per_volume": measured["sw_seconds_per_volume"],
                        "probe_wall_seconds": measured["wall_seconds"],
                        "load_during_probe": load.summary(),
                    }
                    for phase in ("train", "infer"):
                        row[f"{phase}_error"] = _rel(row[f"{phase}_estimated"], row[f"{phase}_measured"])
                        row[f"{phase}_fit_error"] = _rel(row[f"{phase}_fit"], row[f"{phase}_measured"])
                    rows.append(row)
                    print(f"  {algo} amp={'on' if amp else 'off'} N={n}: done", file=sys.stderr)
    worst = max(max(r["train_error"], r["infer_error"]) for r in rows)
    report = {
        "benchmark": "estimator", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "torch": torch.__version__, "monai": monai.__version__, "device": "cpu"},
        "command": "python -m benchmarks.bench_estimator " + " ".join(argv if argv is not None else sys.argv[1:]),
        "worst_error": worst, "rows": rows,
    }
    print(markdown_table(report))
    print(f"worst estimate error {worst:.4%} (goal 5%)")
    out = Path(args.out)
    write_json(out, report)
    print(f"wrote {out}")
    return 0 if worst <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
