"""What mixed precision costs on this CPU: fp32 against bf16 autocast, side by side, and the decision.

Times, in one process and alternating order, (1) one Conv3d forward (16 -> 16 channels, 3^3 kernel)
on a 2x16x48^3 input and (2) one training step (forward, DiceCE loss, backward, SGD step) of the
full-size UNet template at 2 patches of its roi, each in fp32 and under
``torch.autocast("cpu", dtype=torch.bfloat16)``. Prints a table with the oneDNN check, the timing
autotune's precision decision made (``autotune.precision``) and the precision it chose; writes JSON.
This checks the rule's premise (emulated bf16 is far slower than fp32 here), not training quality.

    python -m benchmarks.bench_precision                      # writes benchmarks/results/precision.json
    python -m benchmarks.bench_precision --report-only
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from benchmarks.common import LoadSampler, command, environment, load_cell, parser, report


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__, "precision.json")
    p.add_argument("--reps", type=int, default=3, help="timed repeats per case and precision (best kept)")
    return p.parse_args(argv)


def _conv_case() -> tuple[Any, Any]:
    import torch

    torch.manual_seed(0)
    conv = torch.nn.Conv3d(16, 16, 3, padding=1)
    x = torch.randn(2, 16, 48, 48, 48)

    def run(dtype: Any) -> None:
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            conv(x)

    return run, "Conv3d 16->16, 3^3, input 2x16x48^3, forward"


def _unet_step_case() -> tuple[Any, Any]:
    import torch

    from autotune.build import build_loss, build_network, build_optimizer
    from autotune.bundles.model import BundleConfig
    from autotune.bundles.templates import load_template
    from autotune.step import train_step

    template = load_template("unet")
    roi = [48, 64, 48]
    view = {**template["training"], "algo": "unet", "input_channels": 1, "output_classes": 3, "roi_size": roi,
            "resample_resolution": [1.0, 1.0, 1.0], "intensity_normalization": {"mode": "zscore"},
            **{key: template[key] for key in ("network", "loss", "optimizer", "lr_scheduler")}}
    cfg = BundleConfig.parse(view, "the unet template")
    torch.manual_seed(0)
    model = build_network(cfg)
    loss_fn, optimizer = build_loss(cfg), build_optimizer(cfg, model.parameters())
    image = torch.randn(2, 1, *roi)
    label = torch.randint(0, 3, (2, 1, *roi)).float()

    def run(dtype: Any) -> None:
        train_step(model, loss_fn, optimizer, image, label, dtype, None)

    return run, f"full-size UNet training step, 2 patches of {'x'.join(map(str, roi))}"


def measure(reps: int) -> dict[str, Any]:
    import torch

    from autotune import precision

    rows = []
    for make in (_conv_case, _unet_step_case):
        run, what = make()
        times: dict[str, list[float]] = {"fp32": [], "bf16": []}
        run(None)  # warm-up in fp32 (oneDNN picks kernels) and bf16
        run(torch.bfloat16)
        for rep in range(reps):
            order = ("fp32", "bf16") if rep % 2 == 0 else ("bf16", "fp32")
            for name in order:
                start = time.perf_counter()
                run(torch.bfloat16 if name == "bf16" else None)
                times[name].append(time.perf_counter() - start)
            print(f"  {what}: rep {rep + 1}/{reps} done", file=sys.stderr, flush=True)
        best = {k: min(v) for k, v in times.items()}
        rows.append({"case": what, "fp32_s": best["fp32"], "bf16_s": best["bf16"],
                     "bf16_over_fp32": best["bf16"] / best["fp32"], "all_s": times})
    native, how = precision._detected.__wrapped__()
    chosen = precision.resolve_precision(True, "cpu")
    return {"onednn_bf16_check": precision._onednn_says_bf16(), "native_bf16": native, "how": how,
            "amp_true_on_cpu_means": chosen.name, "reason": chosen.reason, "rows": rows}


def markdown_table(report: dict[str, Any]) -> str:
    """The table of a report (what BENCHMARKS.md shows)."""
    env = report["environment"]
    lines = [f"CPU: {env['cpu']} ({env['cores']} cores), torch {env['torch']}, {env['threads']} thread(s); "
             f"oneDNN bf16 check: {'yes' if report['onednn_bf16_check'] else 'no'}; "
             f"autotune's decision: `amp: true` runs in **{report['amp_true_on_cpu_means']}** ({report['how']}).",
             "", "| case | fp32 s | bf16 autocast s | bf16 / fp32 | load during |", "|---|---:|---:|---:|---:|"]
    load = load_cell(report.get("load_during_run") or {})
    for row in report["rows"]:
        lines.append(f"| {row['case']} | {row['fp32_s']:.3f} | {row['bf16_s']:.3f} | {row['bf16_over_fp32']:.1f}x "
                     f"| {load} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)

    def run() -> dict[str, Any]:
        with LoadSampler() as load:
            result = measure(args.reps)
        return {**result, "benchmark": "fp32 vs bf16 autocast on this CPU, and autotune's precision decision",
                "command": command("benchmarks.bench_precision", argv), "load_during_run": load.summary(),
                "environment": environment()}

    report(args, run, markdown_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
