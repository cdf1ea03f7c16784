"""The first few hundred optimizer steps of a bundle's fast recipe, step by step: why a run stalls.

For each variant (``NAME=PRECISION[:JSON]``, JSON overriding bundle keys such as the optimizer's
arguments, the loss or ``learning_rate``), trains the bundle's network from seed 0 on its training
fold (cached, the bundle's own random crops, the same data order in every variant) with the
template's loss, optimizer and schedule (planned for ``--sched-epochs`` epochs, as a run under
``--max-time`` with the bundle's ``num_epochs`` was), one thread, and records every ``--every`` steps:
the loss and its Dice part (the rest is the cross-entropy), the share of the batch's voxels predicted
foreground against the true share, the gradient norm and the learning rate; every ``4 x --every``
steps the validation mean Dice and predicted foreground share on the first ``--val-cases`` cases of
the validation fold. A run that predicts no foreground (share 0) while the truth holds 2 % has
collapsed to the majority class; how many steps it takes to leave that state is the stall.

    python -m benchmarks.bench_early_steps --algo unet --steps 320 \\
        --variant 'momentum 0.99=fp32:{"optimizer": {"name": "SGD", "args": {"momentum": 0.99, "nesterov": true, "weight_decay": 3.0e-05}}}' \\
        --variant 'momentum 0.9=fp32'
    python -m benchmarks.bench_early_steps --report-only --out benchmarks/results/early_steps_unet.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_early_training import make_bundle, parse_variant
from benchmarks.common import HIPPOCAMPUS, cpu_name, parser, report

REPO = Path(__file__).resolve().parents[1]

SHOWN_STEPS = (16, 64, 128, 192, 256, 320)


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__, "early_steps_unet.json")
    p.add_argument("--data", default=str(HIPPOCAMPUS))
    p.add_argument("--work", default="/tmp/autotune_bench_early", help="scratch folder (its bundles are reused)")
    p.add_argument("--algo", default="unet", choices=("unet", "segresnet", "dints"))
    p.add_argument("--variant", action="append", default=[], help="NAME=PRECISION[:JSON overrides]")
    p.add_argument("--steps", type=int, default=320)
    p.add_argument("--every", type=int, default=16)
    p.add_argument("--sched-epochs", type=int, default=300, help="epochs the schedule is planned for (default 300)")
    p.add_argument("--val-cases", type=int, default=8)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one variant, print JSON rows
    return p.parse_args(argv)


def _setup(bundle: Path, variant: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The variant's data, network, loss, optimizer and schedule, seeded as every variant is."""
    import numpy as np
    import torch
    from monai.data import CacheDataset, DataLoader

    import autotune.build as build
    from autotune.bundles.config import load_bundle_config
    from autotune.bundles.scaling import plan_schedule
    from autotune.trainer import data as tdata

    torch.set_num_threads(1)
    cfg = {**load_bundle_config(bundle), **variant["overrides"]}
    train_cases, val_cases, _ = tdata.split_datalist(cfg)
    transforms = build.build_transforms(cfg, "train")
    train_ds = CacheDataset(train_cases, transforms, cache_rate=1.0, num_workers=0, progress=False)
    val_ds = CacheDataset(val_cases[:args.val_cases], build.build_transforms(cfg, "val"), cache_rate=1.0,
                          num_workers=0, progress=False)
    torch.manual_seed(0)
    np.random.seed(0)
    net = build.build_network(cfg)
    optimizer = build.build_optimizer(cfg, net.parameters())
    plan = plan_schedule(cfg, len(train_ds), args.sched_epochs)
    transforms.set_random_state(seed=0)
    return {"cfg": cfg, "val_ds": val_ds, "net": net, "loss_fn": build.build_loss(cfg), "optimizer": optimizer,
            "scheduler": build.build_lr_scheduler(cfg, optimizer, plan.total_steps, plan.warmup_steps,
                                                  plan.warmup_start_factor),
            "dtype": {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[variant["precision"]],
            "loader": DataLoader(train_ds, batch_size=int(cfg["num_images_per_batch"]), shuffle=True, num_workers=0)}


def _validate(parts: dict[str, Any]) -> tuple[float, float]:
    """Mean Dice on the validation cases and the share of their voxels predicted foreground."""
    import numpy as np
    import torch

    from autotune.step import make_dice_metric, score_case, sliding_window_predict

    net, cfg = parts["net"], parts["cfg"]
    net.eval()
    metric, scores, shares = make_dice_metric(cfg), [], []
    for item in parts["val_ds"]:
        image, label = item["image"].unsqueeze(0).as_tensor(), item["label"].unsqueeze(0).as_tensor()
        logits = sliding_window_predict(net, image, cfg["roi_size"], 4, "cpu", 0.5, parts["dtype"])
        shares.append(float((logits.argmax(1) > 0).float().mean()))
        scores.append(score_case(logits, label, cfg, metric))
    net.train()
    return float(torch.nanmean(torch.cat(scores))), float(np.mean(shares))


def _record(step: int, loss: Any, logits: Any, labels: Any, grad_norm: float, lr: float, dice_part: Any) -> dict[str, Any]:
    """One step's row: the loss split into its Dice and cross-entropy terms, foreground predicted and true."""
    import torch

    with torch.no_grad():
        dice_loss = float(dice_part(logits.detach().float(), labels))
        return {"step": step, "loss": float(loss.detach()), "dice_loss": dice_loss, "ce": float(loss.detach()) - dice_loss,
                "fg_pred": float((logits.argmax(1) > 0).float().mean()), "fg_true": float((labels > 0).float().mean()),
                "grad_norm": grad_norm, "lr": lr, "val_dice": None, "val_fg": None}


def run_variant(bundle: Path, variant: dict[str, Any], args: argparse.Namespace) -> None:
    """Train ``variant`` for ``--steps`` steps in this process, printing one JSON row per record."""
    import torch
    from monai.losses import DiceLoss

    from autotune.autocast import autocast

    parts = _setup(bundle, variant, args)
    net, optimizer, scheduler = parts["net"], parts["optimizer"], parts["scheduler"]
    dice_part = DiceLoss(include_background=(parts["cfg"]["loss"].get("args") or {}).get("include_background", True),
                         to_onehot_y=True, softmax=True, smooth_nr=1e-5, smooth_dr=1e-5)
    step, t0 = 0, time.monotonic()
    while step < args.steps:
        for batch in parts["loader"]:
            images, labels = batch["image"].as_tensor(), batch["label"].as_tensor()
            optimizer.zero_grad(set_to_none=True)
            with autocast("cpu", parts["dtype"]):
                logits = net(images)
                loss = parts["loss_fn"](logits, labels)
            loss.backward()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(net.parameters(), float("inf")))
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            step += 1
            if step % args.every == 0 or step == 1:
                row = _record(step, loss, logits, labels, grad_norm, optimizer.param_groups[0]["lr"], dice_part)
                if step % (4 * args.every) == 0:
                    row["val_dice"], row["val_fg"] = _validate(parts)
                row["seconds"] = round(time.monotonic() - t0, 1)
                print(json.dumps(row), flush=True)
            if step >= args.steps:
                break


def run(args: argparse.Namespace) -> dict[str, Any]:
    import monai
    import torch

    from autotune.precision import cpu_bf16_native

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    make_bundle(args, work)  # the variants (child processes) train copies of it
    results = []
    for text in args.variant:
        variant = parse_variant(text)
        argv = [sys.executable, "-m", __spec__.name, "--one", text, "--work", str(work), "--algo", args.algo, "--data", args.data,
                "--steps", str(args.steps), "--every", str(args.every), "--sched-epochs", str(args.sched_epochs),
                "--val-cases", str(args.val_cases)]
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        out = subprocess.run(argv, capture_output=True, text=True, env=env, check=True).stdout
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        results.append({**variant, "rows": rows})
    native, why = cpu_bf16_native()
    return {"benchmark": "early steps", "algo": args.algo, "data": args.data, "steps": args.steps,
            "sched_epochs": args.sched_epochs, "val_cases": args.val_cases,
            "environment": {"cpu": cpu_name(), "cores": os.cpu_count(), "native_bf16": native, "bf16_check": why,
                            "torch": torch.__version__, "monai": monai.__version__, "date": time.strftime("%Y-%m-%d")},
            "results": results}


def _at(rows: list[dict[str, Any]], step: int) -> dict[str, Any] | None:
    return next((r for r in rows if r["step"] == step), None)


def table(report: dict[str, Any]) -> str:
    """Per variant and step: predicted/true foreground share on the training batch, the loss's Dice part and
    the validation mean Dice (markdown)."""
    steps = [s for s in SHOWN_STEPS if s <= report["steps"]]
    lines = ["| variant | precision | " + " | ".join(f"step {s}" for s in steps) + " |",
             "|" + "---|" * (2 + len(steps))]
    for r in report["results"]:
        cells = []
        for step in steps:
            row = _at(r["rows"], step)
            if row is None:
                cells.append("not run")
                continue
            cell = f"fg {100 * row['fg_pred']:.1f}/{100 * row['fg_true']:.1f} %, Dice loss {row['dice_loss']:.2f}"
            if row.get("val_dice") is not None:
                cell += f", **val {row['val_dice']:.2f}**"
            cells.append(cell)
        lines.append("| " + " | ".join([r["name"], r["precision"], *cells]) + " |")
    env = report["environment"]
    lines.append("")
    lines.append(f"CPU: {env['cpu']} ({env['cores']} cores), native bf16: {'yes' if env['native_bf16'] else 'no'}; "
                 f"{report['algo']}, one thread, seed 0, schedule planned for {report['sched_epochs']} epochs; "
                 f"fg: voxels predicted foreground / truly foreground in the training batch; val: mean Dice on "
                 f"{report['val_cases']} validation cases.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.one is not None:
        run_variant(Path(args.work) / f"{args.algo}_0", parse_variant(args.one), args)
        return 0
    report(args, lambda: run(args), table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
