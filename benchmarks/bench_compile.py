"""Does ``torch.compile`` pay within a run's budget? Eager against compiled training steps, per template.

For each full-size template's bundle (fold 0 of the dataset, nothing tuned), set up as ``autotune train
--mode fast`` sets it up (the machine's default precision unless ``--precision``), the same batch is
stepped ``--steps`` times eagerly, then through ``torch.compile`` (``autotune.trainer.compiled``, the
trainer's own wrapper) from freshly built weights. Reported: the first step of each (compiled: tracing and
compiling included), the median of the steps after it, the compiled step's speed-up, and the steps after
which compiling has paid for itself (its extra first-step seconds over the seconds it saves per step),
against the steps a run of ``--budget`` seconds takes eagerly.

    python -m benchmarks.bench_compile --algos unet                 # the machine's default precision
    python -m benchmarks.bench_compile --algos unet --precision bf16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import environment, generate_bundles, parser, report

DEFAULT_DATA = "/work/shared/datasets/Task04_Hippocampus"


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__, "compile_cpu.json")
    p.add_argument("--data", default=DEFAULT_DATA)
    p.add_argument("--work", default="/tmp/autotune_bench_compile")
    p.add_argument("--algos", default="unet")
    p.add_argument("--precision", default="auto")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--budget", type=float, default=600.0, help="a run's wall seconds, for the break-even column")
    p.add_argument("--device", default="cpu")
    return p.parse_args(argv)


def _steps(bundle: Path, device: str, steps: int, compile_it: bool) -> dict[str, Any]:
    """``steps`` training steps of one batch (fresh weights), eager or compiled: each step's seconds."""
    import torch

    from autotune.step import train_step
    from autotune.trainer.compiled import compiled_net
    from benchmarks.profile_epoch import _setup

    config, data, recipe, _ = _setup(bundle, device)
    net, record = compiled_net(recipe.model, compile_it)
    batch = next(iter(data.train_loader))
    n = config.tuned.num_patches_per_iter
    image, label = batch["image"].as_tensor()[:n].to(device), batch["label"].as_tensor()[:n].to(device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        train_step(net, recipe.loss_fn, recipe.optimizer, image, label, recipe.amp_dtype, recipe.scaler)
        sync()
        times.append(time.perf_counter() - t0)
    return {"precision": recipe.precision.name, "steps_s": times, "first_s": times[0],
            "median_s": statistics.median(times[1:]), "compile": record.as_dict()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from autotune.precision import cpu_bf16_native, precision_scope

    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    bundles = generate_bundles(args.data, Path(args.work), algos, num_fold=5)
    results = {}
    with precision_scope(args.precision):
        for algo in algos:
            eager = _steps(bundles[algo], args.device, args.steps, False)
            compiled = _steps(bundles[algo], args.device, args.steps, True)
            saved = eager["median_s"] - compiled["median_s"]
            extra = compiled["first_s"] - eager["first_s"]
            results[algo] = {"eager": eager, "compiled": compiled, "speedup": eager["median_s"] / compiled["median_s"],
                             "break_even_steps": extra / saved if saved > 0 else None,
                             "budget_steps_eager": args.budget / eager["median_s"]}
    return {"benchmark": "torch.compile, eager against compiled steps", "settings": vars(args) | {"out": None},
            "environment": environment(native_bf16=list(cpu_bf16_native()), date=time.strftime("%Y-%m-%d")),
            "results": results}


def table(report: dict[str, Any]) -> str:
    lines = ["| template | precision | eager first step s | eager step s | compiled first step s | compiled step s "
             "| speed-up | pays after steps | steps in the budget (eager) |", "|" + "---|" * 9]
    for algo, r in report["results"].items():
        e, c = r["eager"], r["compiled"]
        even = f"{r['break_even_steps']:.0f}" if r["break_even_steps"] is not None else "never"
        if not c["compile"]["used"]:
            even = f"(eager: {c['compile']['reason'][:60]})"
        lines.append(f"| {algo} | {e['precision']} | {e['first_s']:.2f} | {e['median_s']:.3f} | {c['first_s']:.1f} | "
                     f"{c['median_s']:.3f} | {r['speedup']:.2f}x | {even} | {r['budget_steps_eager']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    report(args, lambda: run(args), table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
