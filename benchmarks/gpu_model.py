"""The first GPU run's 16 points: the estimator's gap to CUDA term by term, and the device model out of sample
(each point predicted from the others, and the schemes of ``autotune.calibrate.validate``).

    python -m benchmarks.gpu_model [--run benchmarks/results/gpu_check_nvidia-h200.json]
                                   [--out benchmarks/results/gpu_model.json]

Input: the committed run (the peaks the H200 measured: ``max_memory_allocated`` and
``max_memory_reserved`` per point and phase). The estimator's traces are made again here, on the
CPU with CUDA hidden (``gpu_install.reestimate``: the same deterministic CT set and bundles), so the
figures are the estimator's at this commit, never copied from the run.

- **Accounting** (the device model fitted to all 16 points): per point and phase, the estimator's
  tensor storages, what the simulated allocator adds to reserve them (rounding, segments, cached
  blocks; without cuDNN's release and with it), what training's cached blocks add to validation
  (validation simulated after training against validation alone), cuDNN's workspace (the model
  with its factor against without), and the model's allocated and reserved peaks against the
  measured ones. The counted terms that turn out small are printed too: the sliding window's
  output and count buffers, and autocast's fp16 weight copies (both already counted by the fake
  pass).
- **Leave one out**: each point's ``max_memory_reserved`` predicted from the other points only by the
  device model (workspace factor per template and phase: the mean of the template's other points'
  factors). The goals: every point within 10%, no under-prediction by more than 2% of the card, the
  worst over-prediction 15% at most.
- **Out of sample**: the summaries of every scheme ``autotune.calibrate.validate`` computes (leave one
  point, scale, phase or template out).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from autotune.utils import format_bytes  # noqa: E402
from benchmarks.common import parser, write_json
from benchmarks.gpu_install import ct_of, points_of, reestimate

HERE = Path(__file__).resolve().parent
RUN = HERE / "results" / "gpu_check_nvidia-h200.json"
OUT = HERE / "results" / "gpu_model.json"
GOALS = {"within": 0.10, "under_of_card": 0.02, "over": 0.15}


def out_of_sample_report(fit: dict[str, Any]) -> dict[str, Any]:
    """Every scheme's summary of the device model held out (rows kept for the JSON)."""
    validation = fit["out_of_sample_rows"]
    loto = validation["leave_one_template_out"]
    device, template_out = "device model, template's factor (v2 and v3 alike)", "leave one template out"
    schemes = [
        ("leave one point out", device, validation["leave_one_out"]["summary"]),
        ("leave one scale out", device, validation["leave_one_scale_out"]["summary"]),
        ("leave one phase out", "device model, the other phase's factor (not used)",
         validation["leave_one_phase_out"]["summary"]),
        *((template_out, name, loto[model]["summary"]) for model, name in (
            ("largest", "v2: the largest factor measured (old: MONAI's templates)"),
            ("pooled", "pooled: the mean factor of the other templates"),
            ("raw", "raw estimator, tensors only"),
            ("allocator", "v3 outside the domain: the allocator's rules (chosen)"))),
    ]
    return {"schemes": [{"scheme": scheme, "model": model, "summary": summary} for scheme, model, summary in schemes],
            "rows": dict(validation), "bounds": fit["bounds"], "verdict": fit["verdict"]}


def oos_table(report: dict[str, Any]) -> str:
    """Markdown: every out-of-sample scheme of the device model."""
    lines = ["| held out | model | within 10% | worst over | worst under | worst under, share of the card |",
             "|---|---|---:|---:|---:|---:|"]
    for entry in report["out_of_sample"]["schemes"]:
        s = entry["summary"]
        lines.append(f"| {entry['scheme']} | {entry['model']} | {s['within']} of {s['points']} | {_pct(s['max_over'])} | "
                     f"{_pct(s['max_under'])} | {100 * -s['max_under_of_card']:.1f}% |")
    return "\n".join(lines)


def _weight_copy_bytes(bundle: str) -> int:
    """autocast's fp16 copies of the weights: 2 bytes a parameter (what its cache holds in a forward pass)."""
    from autotune.build import build_network
    from autotune.probe.runner import resolve_request

    net = build_network(resolve_request(bundle, check_device=False)["config"])
    return 2 * sum(p.numel() for p in net.parameters())


def account(points: list[Any], factors: dict[str, dict[str, float]], bundles: dict[str, str]) -> list[dict[str, Any]]:
    """Per point and phase, the terms of the device model (module docstring) against the measured peaks."""
    from autotune.probe.device_model import predict_reserved

    weights = {algo: _weight_copy_bytes(path) for algo, path in bundles.items()}
    out = []
    for p in points:
        w = factors[p.algo]
        bare = predict_reserved(p.train_events, p.infer_events, {"train": 0.0, "infer": 0.0}, release=False, band=(1.0,))
        released = predict_reserved(p.train_events, p.infer_events, {"train": 0.0, "infer": 0.0}, band=(1.0,))
        full = predict_reserved(p.train_events, p.infer_events, w)
        alone = predict_reserved(None, p.infer_events, w)["infer"]
        sw = sum(size for kind, _, size, op in p.infer_events if kind == "alloc" and op == "zeros.default")
        for phase in ("train", "infer"):
            out.append({
                "algo": p.algo, "n": p.n, "m": p.m, "phase": phase, "factor": w[phase],
                "estimate_bytes": p.estimate[phase],
                "allocator_bytes": int(bare[phase]["reserved"] - p.estimate[phase]),
                "release_bytes": int(released[phase]["reserved"] - bare[phase]["reserved"]),
                "workspace_bytes": int(full[phase]["reserved"] - released[phase]["reserved"]),
                "training_cache_bytes": int(full["infer"]["reserved"] - alone["reserved"]) if phase == "infer" else None,
                "sliding_window_buffers_bytes": sw if phase == "infer" else None,
                "weight_copies_bytes": weights[p.algo],
                "model_allocated_bytes": int(full[phase]["allocated"]), "allocated_bytes": int(p.allocated[phase]),
                "model_reserved_bytes": int(full[phase]["reserved"]), "reserved_bytes": int(p.reserved[phase]),
            })
    return out


def run(path: Path) -> dict[str, Any]:
    from autotune.calibrate.fit import fit_model, model_points

    merged = json.loads(path.read_text(encoding="utf-8"))
    memory = merged["memory"]
    card = int(memory["gpu"]["torch_total_memory"])
    estimates = reestimate(memory, record=True)
    points = points_of(memory)
    mpoints = model_points(points, estimates)
    fit = fit_model(mpoints, card)
    bundles = _local_bundles(memory)  # the run's bundle paths were on the GPU machine: made again here
    report = {
        "run": str(path.relative_to(HERE.parent)) if path.is_relative_to(HERE.parent) else str(path),
        "gpu": memory["gpu"], "card_bytes": card, "goals": GOALS, "workspace": fit["workspace"],
        "point_factors": fit["point_factors"],
        "new": {"fitted": fit["fitted"], "leave_one_out": fit["leave_one_out"], "summary": fit["summary"],
                "by_template": fit["by_template"]},
        "accounting": account(mpoints, fit["workspace"], bundles),
        "emulated_vs_device_estimate": [{"algo": p["algo"], "n": p["n"], **(p.get("estimate_emulated") or {})
                                         .get("over_device_estimate", {})} for p in points],
        "out_of_sample": out_of_sample_report(fit),
    }
    return report


def _local_bundles(memory: dict[str, Any]) -> dict[str, str]:
    """Bundles of the run's templates made here (full size, CT set): for the parameter counts."""
    import tempfile

    from autotune.calibrate.data import generate, make_ct_dataset

    ct = ct_of(memory)
    work = Path(tempfile.mkdtemp(prefix="gpu_model_"))
    source = make_ct_dataset(work / "ct", 1, ct["shape"], ct["spacing"])
    made = generate(work / "work", source, sorted({p["algo"] for p in points_of(memory)}),
                    tiny=ct.get("preset") == "tiny" or bool(memory.get("dry_run")))
    return {algo: str(path) for algo, path in made.items()}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}%"


def loo_table(report: dict[str, Any]) -> str:
    """Markdown: each point's measured reserved peak and the device model's leave-one-out prediction."""
    lines = ["| template | N | M | phase | measured reserved | device model | error |",
             "|---|---:|---:|---|---:|---:|---:|"]
    for r in report["new"]["leave_one_out"]:
        lines.append(f"| {r['algo']} | {r['n']} | {r['m']} | {r['phase']} | {format_bytes(r['reserved_bytes'])} | "
                     f"{format_bytes(r['predicted_bytes'])} | {_pct(r['error'])} |")
    s = report["new"]["summary"]["leave_one_out"]
    lines.append(f"| **{s['within']} of {s['points']} within 10%** | | | | worst over {_pct(s['max_over'])} | "
                 f"worst under {_pct(s['max_under'])} | under by {100 * -s['max_under_of_card']:.1f}% of the card |")
    return "\n".join(lines)


def accounting_table(report: dict[str, Any]) -> str:
    """Markdown: the device model's terms per point (fitted to all 16) against the measured peaks."""
    lines = ["| template | N | M | phase | tensors (estimate) | + allocator | + cuDNN release | + workspace (w) | "
             "validation after training, less alone | model allocated / measured | model reserved / measured |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for a in report["accounting"]:
        cache = format_bytes(a["training_cache_bytes"]) if a["training_cache_bytes"] is not None else "-"
        lines.append(
            f"| {a['algo']} | {a['n']} | {a['m']} | {a['phase']} | {format_bytes(a['estimate_bytes'])} | "
            f"{format_bytes(a['allocator_bytes'])} | {format_bytes(a['release_bytes'])} | "
            f"{format_bytes(a['workspace_bytes'])} ({a['factor']:.2f}) | {cache} | "
            f"{format_bytes(a['model_allocated_bytes'])} / {format_bytes(a['allocated_bytes'])} "
            f"({_pct(a['model_allocated_bytes'] / a['allocated_bytes'] - 1)}) | "
            f"{format_bytes(a['model_reserved_bytes'])} / {format_bytes(a['reserved_bytes'])} "
            f"({_pct(a['model_reserved_bytes'] / a['reserved_bytes'] - 1)}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, report_only=False)
    p.add_argument("--run", default=str(RUN), help="the installed GPU run (benchmarks/results/gpu_check_<gpu>.json)")
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch is imported: a machine without a GPU planning for one
    report = run(Path(args.run))
    write_json(Path(args.out), report)
    print(accounting_table(report))
    print()
    print(loo_table(report))
    print()
    print(oos_table(report))
    small = report["accounting"]
    print(f"\ncounted by the fake pass already: sliding-window output and count buffers up to "
          f"{format_bytes(max(a['sliding_window_buffers_bytes'] or 0 for a in small))}, autocast's fp16 weight copies "
          f"up to {format_bytes(max(a['weight_copies_bytes'] for a in small))}")
    print(f"workspace factors: {report['workspace']}\n-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
