"""The CPU's calibration: the estimator's measured error against real CPU probes, as a stated bound.

On a GPU, ``benchmarks/gpu_check.py`` fits a calibration from real probes and states the
estimator's worst over-prediction (``fit.max_over_prediction``); the fast search then skips
the probe one above a measured fit when the estimate there exceeds the budget by more than
that bound (``autotune/search/curves/edge.py``). This script does the same for the CPU, where
"memory" is the tracked tensor peak: for each template at full size (the shared hippocampus
set, ``common.full_size_bundles``) and with the tiny preset, in both precisions the CPU trains in (``amp`` on: bf16
where the CPU runs it natively, else fp32; ``amp`` off: fp32), at several batch sizes, one
real probe (isolated child, tracked peak per phase) and one estimate (FakeTensorMode) of the
same point. The bound is the worst estimate / measured - 1 over every point and phase (0
where no estimate was above its measurement), overall and per template (``fit.by_template``). It writes the points and the bound to
``autotune/probe/calibrations/cpu.json`` (shipped in the wheel; ``--out`` elsewhere) and
prints a table.

    python -m benchmarks.calibrate_cpu                                  # full-size and tiny, N = 1, 3
    python -m benchmarks.calibrate_cpu --sizes 1,2,5 --out /tmp/cpu.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import parser

REPO = Path(__file__).resolve().parents[1]


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__, report_only=False)
    p.add_argument("--algos", default="segresnet,dints,unet")
    p.add_argument("--sizes", default="1,3", help="comma-separated N (= sliding-window M) values")
    p.add_argument("--presets", default="full,tiny", help="full, tiny or full,tiny")
    p.add_argument("--amp", default="on,off")
    p.add_argument("--out", default=str(REPO / "autotune" / "probe" / "calibrations" / "cpu.json"))
    p.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "cpu_calibration.json"))
    return p.parse_args(argv)


def bound_of(points: list[dict[str, Any]]) -> dict[str, float]:
    """The worst over- and under-prediction (estimate / measured - 1, and 1 - that) over the points."""
    ratios = [p["estimate_bytes"] / p["measured_bytes"] for p in points if p["measured_bytes"] > 0]
    return {"max_over_prediction": max(0.0, max(ratios) - 1.0), "max_under_prediction": max(0.0, 1.0 - min(ratios))}


def by_template(points: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The bound of each template's own points: a template the estimator traces exactly is not held to
    another template's error."""
    algos = sorted({p["algo"] for p in points})
    return {a: {**bound_of([p for p in points if p["algo"] == a]), "points": sum(p["algo"] == a for p in points)}
            for a in algos}


def markdown_table(record: dict[str, Any]) -> str:
    """One row per preset, template and precision: the points' peaks and the estimator's worst errors."""
    lines = ["| preset | algo | precision | N = M | train measured | infer measured | worst over-prediction | "
             "worst under-prediction |", "|---|---|---|---|---|---|---:|---:|"]
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for p in record["points"]:
        groups.setdefault((p["preset"], p["algo"], p["precision"]), []).append(p)
    for (preset, algo, precision), points in groups.items():
        ns = sorted({p["n"] for p in points})

        def peaks(phase: str, points: list[dict[str, Any]] = points) -> str:
            return " / ".join(f"{p['measured_bytes'] / 2**20:.1f}" for p in sorted(points, key=lambda q: q["n"])
                              if p["phase"] == phase) + " MiB"
        fit = bound_of(points)
        lines.append(f"| {preset} | {algo} | {precision} | {', '.join(map(str, ns))} | {peaks('train')} | "
                     f"{peaks('infer')} | {fit['max_over_prediction']:.4%} | {fit['max_under_prediction']:.4%} |")
    fit = record["fit"]
    for algo, own in (fit.get("by_template") or {}).items():
        lines.append(f"| **{algo}** | | | | | | **{own['max_over_prediction']:.4%}** (its stated bound) | "
                     f"{own['max_under_prediction']:.4%} |")
    lines.append(f"| **all** | | | | | | **{fit['max_over_prediction']:.4%}** (the bound for other templates) | "
                 f"{fit['max_under_prediction']:.4%} |")
    return "\n".join(lines)


def _measure(args: Any, algos: list[str], sizes: list[int], amps: list[bool]) -> list[dict[str, Any]]:
    """Probe and estimate every preset, template, precision and N; one point per phase."""
    from autotune.bundles.config import load_bundle_config
    from autotune.precision import resolve_precision
    from autotune.probe.estimate import estimate
    from autotune.probe.runner import run_probe

    points: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="calibrate_cpu_") as tmp:
        sets: dict[str, dict[str, Path]] = {}
        if "full" in args.presets:
            from benchmarks.common import full_size_bundles

            sets["full"] = full_size_bundles(Path(tmp) / "full", "hippocampus", algos)
        if "tiny" in args.presets:
            from benchmarks.tiny_bundles import make_tiny_bundles

            sets["tiny"] = make_tiny_bundles(Path(tmp) / "tiny", algos)
        for preset, bundles in sets.items():
            for algo in algos:
                for amp in amps:
                    cfg = load_bundle_config(bundles[algo]).with_values(amp=amp)
                    precision = resolve_precision(amp, "cpu").name
                    for n in sizes:
                        t0 = time.perf_counter()
                        measured = run_probe(cfg, num_patches_per_iter=n, num_sw_batch_size=n, timeout=900)
                        if measured["status"] != "ok":
                            raise SystemExit(f"{preset} {algo} amp={amp} N={n}: probe {measured['status']}: "
                                             f"{measured.get('error_tail')}")
                        est = estimate(cfg, num_patches_per_iter=n, num_sw_batch_size=n)
                        for phase in ("train", "infer"):
                            points.append({"preset": preset, "algo": algo, "amp": amp, "precision": precision,
                                           "phase": phase, "n": n,
                                           "measured_bytes": int(measured[f"{phase}_peak_bytes"]),
                                           "estimate_bytes": int(est[f"{phase}_peak_bytes"])})
                        print(f"  {preset} {algo} {precision} N={n}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return points


def main(argv: list[str] | None = None) -> int:
    import torch

    from autotune.files import atomic_write_json

    args = _args(argv)
    algos = [a for a in args.algos.split(",") if a]
    sizes = [int(v) for v in args.sizes.split(",")]
    amps = [v == "on" for v in args.amp.split(",")]
    points = _measure(args, algos, sizes, amps)
    fit = bound_of(points)
    record = {
        "calibration_version": 1,  # the allowance alone (no device model): version 1's format
        "gpu_name": "cpu",
        "device": "cpu",
        "memory": "tracked tensor bytes (the CPU probe's and the estimator's one tracker), not RSS",
        "torch": torch.__version__,
        "processor": platform.processor() or platform.machine(),
        "cpu_bf16_native": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        "measured_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": "python -m benchmarks.calibrate_cpu " + " ".join(argv if argv is not None else sys.argv[1:]),
        "allowance": {"context_bytes": 0, "cudnn_workspace_bytes": 0, "allocator_slack_fraction": 0.0},
        "fit": {"max_over_prediction": fit["max_over_prediction"], "max_under_prediction": fit["max_under_prediction"],
                "points": len(points), "by_template": by_template(points)},
        "points": points,
    }
    print(markdown_table(record))
    own = ", ".join(f"{algo} {b['max_over_prediction']:.4%}" for algo, b in record["fit"]["by_template"].items())
    print(f"stated bound (worst over-prediction): {fit['max_over_prediction']:.4%} ({own}); "
          f"worst under-prediction {fit['max_under_prediction']:.4%}; {len(points)} points")
    out = atomic_write_json(Path(args.out), record)
    copy = atomic_write_json(Path(args.results), record)  # BENCHMARKS.md's table reads this copy
    print(f"wrote {out} and {copy}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
