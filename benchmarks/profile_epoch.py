"""Where a fast epoch's time goes: one training epoch and one validation of each full-size template, by part.

Each template's bundle is generated for fold 0 of 5 of the dataset (the full-size template, nothing tuned)
and set up exactly as ``autotune train --mode fast`` sets it up (``autotune.trainer.setup``: cache, thread
loader, the machine's default precision, the template's recipe). Then, in this process, with every core:

- ``setup``: caching the fold's cases and building the model (what the run pays before its first batch);
- ``augmentation``: the random transforms (crops, flips, intensity) over one epoch's cases, alone: with
  the thread loader they run beside the step, on the same cores;
- one epoch: per batch, the wait for the loader, then forward (network and loss), backward and the
  optimizer's step, each timed (on CUDA after a synchronisation);
- one validation: per case, the sliding-window forward and the metric;
- ``torch.profiler`` over ``--profile-steps`` steps after the epoch: the operators' share of the step's
  self time, grouped (convolutions, normalisation, activations, optimizer, ...).

Prints two tables and writes JSON:

    python -m benchmarks.profile_epoch                         # unet, segresnet, dints; machine's precision
    python -m benchmarks.profile_epoch --algos unet --precision fp32
    python -m benchmarks.profile_epoch --report-only
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.common import environment, generate_bundles, parser, report

DEFAULT_DATA = "/work/shared/datasets/Task04_Hippocampus"
PARTS = ("data_wait_s", "forward_s", "backward_s", "optimizer_s")
#: torch.profiler operator names (substrings, first match wins) -> the group the table shows
OP_GROUPS = (
    ("convolution_backward", "conv backward"), ("conv", "conv forward"), ("norm", "normalisation"),
    ("prelu", "activation"), ("relu", "activation"), ("leaky", "activation"), ("softmax", "loss"),
    ("log_softmax", "loss"), ("nll", "loss"), ("foreach", "optimizer"), ("sgd", "optimizer"), ("adam", "optimizer"),
    ("copy_", "copies/casts"), ("to_copy", "copies/casts"), ("cat", "concat/pad"), ("pad", "concat/pad"),
)


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__, "profile_epoch_cpu.json")
    p.add_argument("--data", default=DEFAULT_DATA, help="dataset: Decathlon folder, input.yaml or datalist")
    p.add_argument("--work", default="/tmp/autotune_profile_epoch", help="scratch folder (bundles are generated here)")
    p.add_argument("--algos", default="unet,segresnet,dints")
    p.add_argument("--precision", default="auto", help="auto (the machine's default per template), fp32 or bf16")
    p.add_argument("--max-batches", type=int, default=0, help="train at most this many batches (0: the epoch)")
    p.add_argument("--max-val-cases", type=int, default=0, help="validate at most this many cases (0: all)")
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--device", default="cpu")
    return p.parse_args(argv)


class _Timer:
    """Wall seconds per part, synchronising CUDA before each reading."""

    def __init__(self, device: str) -> None:
        import torch

        self.sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        self.sums: dict[str, float] = defaultdict(float)
        self.t = time.perf_counter()

    def mark(self, part: str | None) -> None:
        self.sync()
        now = time.perf_counter()
        if part is not None:
            self.sums[part] += now - self.t
        self.t = now


def _setup(bundle: Path, device: str) -> tuple[Any, Any, Any, dict[str, float]]:
    """The bundle's config, data and model as ``autotune train --mode fast`` builds them; the seconds each took."""
    from autotune.bundles.config import load_bundle_config
    from autotune.trainer.ddp import DistContext
    from autotune.trainer.setup import setup_data, setup_model

    config = load_bundle_config(str(bundle))
    ctx = DistContext(device=device)
    t0 = time.perf_counter()
    data = setup_data(config, ctx, "fast", int(config.num_epochs), None, progress=False)
    t1 = time.perf_counter()
    recipe = setup_model(config, ctx, "fast", data.opts, data.plan)
    return config, data, recipe, {"cache_s": t1 - t0, "model_s": time.perf_counter() - t1}


def _step(recipe: Any, image: Any, label: Any, timer: _Timer) -> None:
    """One training pass in parts: forward (network and loss under the run's autocast), backward, optimizer."""
    from autotune.autocast import autocast

    recipe.optimizer.zero_grad(set_to_none=True)
    with autocast(image.device.type, recipe.amp_dtype):
        loss = recipe.loss_fn(recipe.net(image), label)
    timer.mark("forward_s")
    loss.backward()
    timer.mark("backward_s")
    recipe.optimizer.step()
    if recipe.scheduler is not None:
        recipe.scheduler.step()
    timer.mark("optimizer_s")


def _epoch(config: Any, data: Any, recipe: Any, device: str, max_batches: int) -> dict[str, Any]:
    """One training epoch timed by part (the loader's wait, forward, backward, optimizer)."""
    from autotune.step import split_patches
    from autotune.trainer.infer import plain_tensor

    recipe.net.train()
    timer, batches, patches = _Timer(device), 0, 0
    t0 = time.perf_counter()
    for batch in data.train_loader:
        timer.mark("data_wait_s")
        images = plain_tensor(batch["image"]).to(device)
        labels = plain_tensor(batch["label"]).to(device)
        timer.mark("h2d_s")
        for image, label in split_patches(images, labels, config.tuned.num_patches_per_iter):
            _step(recipe, image, label, timer)
            patches += int(image.shape[0])
        batches += 1
        if max_batches and batches >= max_batches:
            break
    seconds = time.perf_counter() - t0
    scale = len(data.train_loader) / batches  # a partial epoch's parts scaled to the whole
    return {"batches": batches, "of_batches": len(data.train_loader), "patches": patches,
            "epoch_s": seconds * scale, "samples_per_s": patches / seconds,
            **{part: timer.sums[part] * scale for part in (*PARTS, "h2d_s")}}


def _augmentation(data: Any, cases: int) -> float:
    """Seconds the random transforms take over ``cases`` cached cases, alone (no step beside them)."""
    dataset = _dataset(data)
    t0 = time.perf_counter()
    for index in range(cases):
        dataset[index % len(dataset)]
    return time.perf_counter() - t0


def _validation(config: Any, data: Any, recipe: Any, device: str, max_cases: int) -> dict[str, Any]:
    """One validation timed by part: the sliding-window forward and the metric, per case."""
    import torch

    from autotune.step import make_dice_metric, score_case, sliding_window_predict
    from autotune.trainer.infer import plain_tensor, predict_args

    recipe.model.eval()
    metric, timer, cases = make_dice_metric(config), _Timer(device), 0
    volume_device = config.tuned.validation_device.volume_device(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        for batch in data.val_loader:
            timer.mark("data_s")
            image = plain_tensor(batch["image"]).to(volume_device)
            label = plain_tensor(batch["label"]).to(volume_device)
            logits = sliding_window_predict(recipe.model, image, device=device, amp_dtype=recipe.amp_dtype,
                                            **predict_args(config))
            timer.mark("windows_s")
            score_case(logits, label, config, metric)
            timer.mark("metric_s")
            cases += 1
            if max_cases and cases >= max_cases:
                break
    scale = len(data.val_loader) / cases
    return {"cases": cases, "of_cases": len(data.val_loader), "val_s": (time.perf_counter() - t0) * scale,
            **{k: timer.sums[k] * scale for k in ("data_s", "windows_s", "metric_s")}}


def _dataset(data: Any) -> Any:
    loader = data.train_loader
    return (loader.loader if hasattr(loader, "loader") else loader).dataset


def _op_shares(config: Any, data: Any, recipe: Any, device: str, steps: int) -> dict[str, float]:
    """torch.profiler over ``steps`` training passes: each operator group's share of the self time."""
    from torch.profiler import ProfilerActivity, profile

    from autotune.trainer.infer import plain_tensor

    batch = next(iter(data.train_loader))
    image = plain_tensor(batch["image"]).to(device)[: config.tuned.num_patches_per_iter]
    label = plain_tensor(batch["label"]).to(device)[: config.tuned.num_patches_per_iter]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    recipe.net.train()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            _step(recipe, image, label, _Timer(device))
    groups: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        name = event.key.lower()
        group = next((g for key, g in OP_GROUPS if key in name), "other")
        groups[group] += float(event.self_cpu_time_total)
    total = sum(groups.values()) or 1.0
    return {g: v / total for g, v in sorted(groups.items(), key=lambda kv: -kv[1])}


def profile_algo(bundle: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement of one template's bundle."""
    from autotune.precision import precision_scope

    with precision_scope(args.precision):
        config, data, recipe, setup = _setup(bundle, args.device)
        augmentation_s = _augmentation(data, len(_dataset(data)))
        epoch = _epoch(config, data, recipe, args.device, args.max_batches)
        validation = _validation(config, data, recipe, args.device, args.max_val_cases)
        shares = _op_shares(config, data, recipe, args.device, args.profile_steps)
    return {"bundle": str(bundle), "precision": recipe.precision.name, "roi_size": list(config.roi_size),
            "num_patches_per_iter": config.tuned.num_patches_per_iter, "setup": setup,
            "augmentation_s": augmentation_s, "epoch": epoch, "validation": validation, "op_shares": shares}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import monai
    import torch

    from autotune.precision import cpu_bf16_native

    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    bundles = generate_bundles(args.data, work, algos, num_fold=5, overrides={"early_stop_patience": 0})
    results = {algo: profile_algo(bundles[algo], args) for algo in algos}
    return {"benchmark": "where a fast epoch's time goes", "data": args.data,
            "settings": {k: v for k, v in vars(args).items() if k not in ("out", "work", "report_only")},
            "environment": environment(native_bf16=list(cpu_bf16_native()), monai=monai.__version__,
                                       threads=torch.get_num_threads(), date=time.strftime("%Y-%m-%d")),
            "results": results}


def _pct(part: float, whole: float) -> str:
    return f"{part:.1f} ({100 * part / whole:.0f} %)" if whole else "-"


def table(report: dict[str, Any]) -> str:
    """One row per template: set-up, the epoch's parts, the augmentation alone and validation's parts."""
    lines = ["| template | precision | roi | patches/step | cache + model s | epoch s | data wait | forward | backward "
             "| optimizer | augmentation alone | validation s | windows | metric |", "|" + "---|" * 14]
    for algo, r in report["results"].items():
        e, v, s = r["epoch"], r["validation"], r["setup"]
        partial = "" if e["batches"] == e["of_batches"] else f" ({e['batches']} of {e['of_batches']} batches, scaled)"
        lines.append("| " + " | ".join([
            algo, r["precision"], "x".join(map(str, r["roi_size"])), str(r["num_patches_per_iter"]),
            f"{s['cache_s']:.1f} + {s['model_s']:.1f}", f"{e['epoch_s']:.1f}{partial}",
            *(_pct(e[p], e["epoch_s"]) for p in PARTS),
            f"{r['augmentation_s']:.1f}" if r["augmentation_s"] is not None else "-",
            f"{v['val_s']:.1f}", _pct(v["windows_s"], v["val_s"]), _pct(v["metric_s"], v["val_s"])]) + " |")
    return "\n".join(lines)


def op_table(report: dict[str, Any]) -> str:
    """The operator groups' share of a training step's self time (torch.profiler), per template."""
    groups = sorted({g for r in report["results"].values() for g in r["op_shares"]})
    lines = ["| template | " + " | ".join(groups) + " |", "|" + "---|" * (1 + len(groups))]
    for algo, r in report["results"].items():
        lines.append(f"| {algo} | " + " | ".join(f"{100 * r['op_shares'].get(g, 0.0):.0f} %" for g in groups) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    report(args, lambda: run(args), table, op_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
