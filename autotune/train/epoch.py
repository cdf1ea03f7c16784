"""One epoch of a training run: the training passes over the loader, and validation.

``train_epoch`` runs every loader batch through ``autotune.step.train_step`` in passes of
``num_patches_per_iter`` patches (as the probe does), counting memory phase by phase,
and returns the epoch's metrics row; ``validate`` adds the validation Dice and peaks to
it and writes ``best.pt`` on a new best. Both act on a ``TrainingRun`` that is set up.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from autotune.train.checkpoint import save_checkpoint
from autotune.utils import bars_enabled

if TYPE_CHECKING:  # pragma: no cover
    from autotune.train.runner import TrainingRun

__all__ = ["train_epoch", "validate"]


def train_epoch(run: TrainingRun, epoch: int) -> dict[str, Any]:
    """Train ``run`` for ``epoch``; returns the metrics row (loss, timings, samples, peaks, lr)."""
    import torch
    from tqdm import tqdm

    from autotune.step import split_patches, train_step
    from autotune.train.ddp import all_gather_int, all_reduce_sum
    from autotune.train.infer import plain_tensor

    ctx = run.ctx
    device, per_pass = ctx.device, int(run.cfg["num_patches_per_iter"])
    # Seeded per epoch: a resumed run draws the same shuffles and crops as an unbroken one.
    torch.manual_seed(run.seed + 1000 * epoch + ctx.rank)
    run.train_transforms.set_random_state(seed=run.seed + 1000 * epoch + ctx.rank)
    run.net.train()
    run.phase = "training"
    tracker = run.memory.start(run.model, run.optimizer)
    loss_sum, passes, samples, wait = torch.zeros((), device=device), 0, 0, 0.0
    bar = tqdm(total=len(run.train_loader), desc=f"epoch {epoch}/{run.total_epochs}", unit="batch",
               leave=False, disable=not bars_enabled(run.progress), file=sys.stderr)
    t0 = time.perf_counter()
    batches = iter(run.train_loader)
    while True:
        t_wait = time.perf_counter()
        with run.nvtx.range("data"):
            batch = next(batches, None)
        wait += time.perf_counter() - t_wait
        if batch is None:
            break
        images = plain_tensor(batch["image"]).to(device, non_blocking=True)
        labels = plain_tensor(batch["label"]).to(device, non_blocking=True)
        if tracker is not None:  # this batch, and the next one the thread loader holds (as the probe counts)
            tracker.track([images, labels])
            tracker.set_reserved(images.untyped_storage().nbytes() + labels.untyped_storage().nbytes())
        with run.memory.tracking():
            for image, label in split_patches(images, labels, per_pass):
                loss = train_step(run.net, run.loss_fn, run.optimizer, image, label, run.amp_dtype, run.scaler)
                if run.scheduler is not None:
                    run.scheduler.step()
                loss_sum += loss.float()
                passes, samples = passes + 1, samples + int(image.shape[0])
        bar.update(1)
        if bar.n % 10 == 0 and run.progress:
            bar.set_postfix(loss=f"{loss_sum.item() / max(passes, 1):.4f}")
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    train_s = time.perf_counter() - t0
    bar.close()
    total_loss, total_passes = all_reduce_sum(ctx, [float(loss_sum.item()), float(passes)])
    rank_samples = all_gather_int(ctx, samples)
    peak_row: dict[str, Any] = {}
    run.memory.read(peak_row, "train")
    return {
        **peak_row,
        "epoch": epoch, "loss": total_loss / max(total_passes, 1), "train_s": train_s, "data_wait_s": wait,
        "data_wait_share": wait / train_s if train_s > 0 else 0.0, "samples": sum(rank_samples),
        "steps": int(total_passes) // ctx.world_size,
        "samples_per_s": sum(rank_samples) / train_s if train_s > 0 else 0.0,
        "lr": float(run.optimizer.param_groups[0]["lr"]), "world_size": ctx.world_size,
        "rank_samples": rank_samples,
    }


def validate(run: TrainingRun, row: dict[str, Any]) -> None:
    """Validate ``run`` after ``row["epoch"]``: per-class and mean Dice, time and peaks into ``row``;
    a new best is saved as ``best.pt`` (by the main rank)."""
    from autotune.train.infer import evaluate

    t0 = time.perf_counter()
    run.phase = "validation"
    run.memory.start(run.model, run.optimizer)
    with run.memory.tracking():
        per_class, mean = evaluate(run.model, run.val_loader, run.cfg, run.ctx.device, run.amp_dtype, run.ctx)
    row["val_s"] = time.perf_counter() - t0
    run.memory.read(row, "val")
    row.update({c: v for c, v in zip(run.metrics.dice_columns, per_class, strict=True)})
    row["mean_dice"] = mean
    if run.state.validated(mean, row["epoch"]) and run.ctx.is_main:
        save_checkpoint(run.out / "best.pt", run.checkpoint(row["epoch"]))
