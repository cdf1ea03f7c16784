"""One epoch of a training run: the training passes over the loader, its metrics row, validation.

``train_epoch`` runs loader batches through ``autotune.step.train_step`` in passes of
``num_patches_per_iter`` patches (as the probe does), counting memory phase by phase, until
the loader is done or a stop is agreed at a batch boundary. ``EpochProgress`` records how far
it got and the RNG states there, so a stopped epoch continues where it stopped: the loader is
seeded as at the epoch's start, the batches already trained are drawn again and skipped (the
same shuffle and crops), and the RNG states are put back. ``epoch_row`` turns a finished epoch
into its metrics row; ``validate`` adds the validation Dice and peaks to it. All act on
``EpochParts``, which the runner builds once.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from autotune.utils import bars_enabled

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig
    from autotune.bundles.tuned import TunedValues
    from autotune.finite import StepGuard
    from autotune.trainer.ddp import DistContext
    from autotune.trainer.fallback import MemoryFallbacks
    from autotune.trainer.memory import PhaseMemory
    from autotune.trainer.setup import ModelSetup
    from autotune.trainer.timing import PhaseClock

__all__ = ["EpochParts", "EpochProgress", "train_epoch", "epoch_row", "validate", "count_scaler_skip"]


@dataclass
class EpochParts:
    """What an epoch trains and validates with: built once per run by the runner.

    Attributes:
        ctx: this process's rank, world size and device.
        config: the bundle config (sliding-window settings, classes).
        tuned: the tuned values it trains with (``autotune.bundles.tuned``: the patches per pass).
        recipe: the network (``model``; ``net`` is what trains, DDP-wrapped with several processes),
            loss, optimizer, schedule, scaler, autocast dtype and NVTX ranges.
        memory: the limit and peaks per phase.
        train_loader, val_loader: the loaders; ``train_transforms``: reseeded every epoch.
        seed: the run's seed; ``total_epochs``: for the progress bar; ``progress``: show bars.
        guard: keeps non-finite steps from the weights (``autotune.finite``); None: every step applied.
        clock: times host-to-device copies and the training passes on the device's clock (None: untimed).
        fallbacks: the out-of-memory step-downs in force (``autotune.trainer.fallback``); None: an OOM ends the run.
    """

    ctx: DistContext
    config: BundleConfig
    tuned: TunedValues
    recipe: ModelSetup
    memory: PhaseMemory
    train_loader: Any
    val_loader: Any
    train_transforms: Any
    seed: int
    total_epochs: int
    progress: bool
    guard: StepGuard | None = None
    clock: PhaseClock | None = None
    fallbacks: MemoryFallbacks | None = None


@dataclass
class EpochProgress:
    """How far the training part of ``epoch`` got on this rank: loader batches done, the sums of
    its metrics row, and (when stopped inside it) the RNG states at the stop. ``passes`` counts every
    training pass, ``skipped`` those the guard kept from the weights (their loss is not in ``loss_sum``);
    ``h2d_s`` and ``compute_s`` are the seconds of host-to-device copies and of training passes;
    ``scaler_skipped`` the steps fp16's GradScaler skipped (an overflowed gradient lowers its scale);
    ``batch_passes`` the passes of the batch in progress already applied (a restart after an out-of-memory
    continues inside that batch, and ``rng`` then holds the RNG states at the batch's start)."""

    epoch: int
    batches: int = 0
    loss_sum: float = 0.0
    passes: int = 0
    skipped: int = 0
    samples: int = 0
    data_wait_s: float = 0.0
    train_s: float = 0.0
    h2d_s: float = 0.0
    compute_s: float = 0.0
    scaler_skipped: int = 0
    batch_passes: int = 0
    rng: dict[str, Any] | None = None
    complete: bool = False

    def as_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint (``weights_only`` loads it)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EpochProgress:
        """Back from ``as_dict`` (unknown keys ignored)."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def _skip_done(loader: Any, done: int) -> Iterator[Any]:
    """An iterator over ``loader`` past its first ``done`` batches (drawn, so the random crops match)."""
    if done >= len(loader):
        return iter(())
    batches = iter(loader)
    for _ in range(done):
        next(batches)
    return batches


def _train_batch(parts: EpochParts, batch: Mapping[str, Any], tracker: Any, loss_sum: Any,
                 progress: EpochProgress, scaler_skips: Any = None, skip_passes: int = 0) -> None:
    """One loader batch in passes of ``num_patches_per_iter``, each applied pass's loss added to ``loss_sum``
    (a tensor, in place) and the passes, skipped passes and samples to ``progress``; the steps the GradScaler
    skipped to ``scaler_skips`` (a device tensor, in place: counted without a synchronisation). The first
    ``skip_passes`` passes were applied before a restart and are skipped. A pass that runs out of memory is
    repeated in micro-batches (``_fitted_pass``)."""
    from autotune.step import split_patches
    from autotune.trainer.infer import plain_tensor

    device, clock = parts.ctx.device, parts.clock
    with clock.phase("h2d") if clock is not None else contextlib.nullcontext():
        images = plain_tensor(batch["image"]).to(device, non_blocking=True)
        labels = plain_tensor(batch["label"]).to(device, non_blocking=True)
    if tracker is not None:  # this batch, and the next one the thread loader holds (as the probe counts)
        tracker.track([images, labels])
        tracker.set_reserved(images.untyped_storage().nbytes() + labels.untyped_storage().nbytes())
    recipe, guard = parts.recipe, parts.guard
    progress.batch_passes = 0
    with parts.memory.tracking():
        for image, label in split_patches(images, labels, parts.tuned.num_patches_per_iter):
            if progress.batch_passes < skip_passes:
                progress.batch_passes += 1
                continue
            progress.passes += 1  # counted first: a guard that stops the run names this pass
            scale = _scale_of(recipe.scaler) if scaler_skips is not None else None
            loss = _fitted_pass(parts, image, label, progress)
            if scale is not None:
                count_scaler_skip(recipe.scaler, scale, scaler_skips)
            if recipe.scheduler is not None:  # a skipped step keeps the schedule's length, as fp16's scaler does
                recipe.scheduler.step()
            if guard is None or guard.applied:
                loss_sum += loss.float()
            else:
                progress.skipped += 1
            progress.samples += int(image.shape[0])
            progress.batch_passes += 1


def _fitted_pass(parts: EpochParts, image: Any, label: Any, progress: EpochProgress) -> Any:
    """One training pass (``autotune.step.train_step``) in the micro-batches in force; a pass that runs out of
    memory is released and repeated in more (``autotune.trainer.fallback``). Returns its loss."""
    from autotune.probe.memory import is_oom_error
    from autotune.trainer.fallback import release_memory

    fallbacks = parts.fallbacks
    while True:
        failed = False
        # the optimizer's state is made by its first step: a split fits for good only once a pass fit beside it
        with_state = bool(parts.recipe.optimizer.state)
        try:
            loss = _guarded_step(parts, image, label, fallbacks.micro_batches if fallbacks is not None else 1)
        except Exception as exc:
            if fallbacks is None or not is_oom_error(exc):
                raise
            failed = True  # handled below, once this frame no longer holds the failed step's traceback
        if not failed:
            if fallbacks is not None:
                fallbacks.fitted_pass(int(image.shape[0]), with_state)
            return loss
        _drop_failed_step(parts)
        release_memory(parts.ctx.device)
        peak = parts.memory.failed_peak()
        fallbacks.training_oom(int(image.shape[0]), peak, progress.epoch, progress.passes)


def _drop_failed_step(parts: EpochParts) -> None:
    """Forget what a failed step left: its gradients, and the buffers its forward pass changed."""
    parts.recipe.optimizer.zero_grad(set_to_none=True)
    guard = parts.guard
    if guard is not None and guard.buffers:
        import torch

        torch._foreach_copy_(guard.buffers, guard.saved)


def _guarded_step(parts: EpochParts, image: Any, label: Any, micro_batches: int) -> Any:
    """``train_step`` on one pass, timed; a run that diverged learns where the pass first went non-finite."""
    from autotune.finite import NonFiniteSteps, trace_nonfinite
    from autotune.step import train_step

    recipe, clock = parts.recipe, parts.clock
    try:
        with clock.phase("compute") if clock is not None else contextlib.nullcontext():
            return train_step(recipe.net, recipe.loss_fn, recipe.optimizer, image, label, recipe.amp_dtype,
                              recipe.scaler, parts.guard, micro_batches)
    except NonFiniteSteps as exc:  # where this pass first went non-finite, for the run's last line
        try:
            exc.first = trace_nonfinite(recipe.model, recipe.loss_fn, image, label, recipe.amp_dtype)
        except Exception:  # noqa: BLE001 - the trace only adds to the line (it may hit the memory limit)
            exc.first = ""
        raise


def _scale_of(scaler: Any) -> Any:
    """The GradScaler's current scale: a copy of its device tensor, or its initial scale (a float) before its
    first step."""
    scale = getattr(scaler, "_scale", None)
    return float(getattr(scaler, "_init_scale", 2.0**16)) if scale is None else scale.clone()


def count_scaler_skip(scaler: Any, before: Any, counter: Any) -> None:
    """Add 1 to ``counter`` (a device tensor, in place) when the step after ``before = _scale_of(scaler)``
    was skipped: GradScaler lowers its scale exactly when a gradient overflowed and it skipped the step.
    Device arithmetic only, so no synchronisation per step."""
    counter += (scaler._scale < before).int()


def train_epoch(parts: EpochParts, progress: EpochProgress, should_stop: Callable[[], int],
                on_batch: Callable[[EpochProgress], None] | None = None) -> EpochProgress:
    """Train from where ``progress`` stands to the end of its epoch, or to the first batch boundary
    where ``should_stop()`` (asked on every rank at every boundary) is non-zero; returns the progress.
    ``on_batch(progress)`` is called after every batch trained (on every rank)."""
    import torch
    from tqdm import tqdm

    from autotune.finite import NonFiniteSteps
    from autotune.trainer.checkpoint import rng_state, set_rng_state
    from autotune.trainer.fallback import RestartRun

    ctx, epoch = parts.ctx, progress.epoch
    _seed_epoch(parts, epoch)
    parts.recipe.net.train()
    tracker = parts.memory.start(parts.recipe.model, parts.recipe.optimizer, "training")
    batches = _skip_done(parts.train_loader, progress.batches)
    if progress.rng is not None:
        set_rng_state(progress.rng, ctx.device)  # where the stopped run stood after those batches
    loss_sum = torch.tensor(progress.loss_sum, dtype=torch.float32, device=ctx.device)
    scaler_skips = torch.zeros((), dtype=torch.int64, device=ctx.device) if parts.recipe.scaler is not None else None
    bar = tqdm(total=len(parts.train_loader), initial=progress.batches, desc=f"epoch {epoch}/{parts.total_epochs}",
               unit="batch", leave=False, disable=not bars_enabled(parts.progress), file=sys.stderr)
    t0, wait = time.perf_counter(), 0.0
    skip_passes, batch_rng = progress.batch_passes, None
    while not should_stop():
        t_wait = time.perf_counter()
        with parts.recipe.nvtx.range("data"):
            batch = next(batches, None)
        wait += time.perf_counter() - t_wait
        if batch is None:
            progress.complete = True
            break
        if parts.fallbacks is not None:
            batch_rng = rng_state(ctx.device)  # where a restart inside this batch continues from
        try:
            _train_batch(parts, batch, tracker, loss_sum, progress, scaler_skips, skip_passes)
        except NonFiniteSteps as exc:
            exc.epoch, exc.step = epoch, progress.passes  # where the run diverged, for its line
            bar.close()
            raise
        except RestartRun as restart:
            progress.passes -= 1  # the pass that failed is trained again after the restart
            _account(progress, loss_sum, scaler_skips, t0, wait)
            progress.rng, restart.progress = batch_rng, progress
            bar.close()
            raise
        skip_passes = 0
        _batch_done(parts, progress, bar, loss_sum, on_batch)
    progress.rng = None if progress.complete else rng_state(ctx.device)
    if ctx.device.startswith("cuda"):
        torch.cuda.synchronize(ctx.device)
    _account(progress, loss_sum, scaler_skips, t0, wait)
    if parts.clock is not None:
        phases = parts.clock.take()
        progress.h2d_s += phases["h2d"]
        progress.compute_s += phases["compute"]
    bar.close()
    return progress


def _seed_epoch(parts: EpochParts, epoch: int) -> None:
    """Seeded per epoch and rank: a resumed run draws the same shuffles and crops as an unbroken one."""
    import torch

    torch.manual_seed(parts.seed + 1000 * epoch + parts.ctx.rank)
    parts.train_transforms.set_random_state(seed=parts.seed + 1000 * epoch + parts.ctx.rank)


def _account(progress: EpochProgress, loss_sum: Any, scaler_skips: Any, t0: float, wait: float) -> None:
    """Add what this stretch of the epoch trained to ``progress``: its seconds, data waits, loss and the
    GradScaler's skipped steps."""
    progress.train_s += time.perf_counter() - t0
    progress.data_wait_s += wait
    progress.loss_sum = float(loss_sum.item())
    if scaler_skips is not None:
        progress.scaler_skipped += int(scaler_skips.item())


def _batch_done(parts: EpochParts, progress: EpochProgress, bar: Any, loss_sum: Any,
                on_batch: Callable[[EpochProgress], None] | None) -> None:
    """A loader batch trained: count it, tell ``on_batch``, move the bar (the mean loss every 10 batches)."""
    progress.batches += 1
    progress.batch_passes = 0
    if on_batch is not None:
        on_batch(progress)
    bar.update(1)
    if bar.n % 10 == 0 and parts.progress:
        bar.set_postfix(loss=f"{loss_sum.item() / max(progress.passes - progress.skipped, 1):.4f}")


def epoch_row(parts: EpochParts, progress: EpochProgress) -> dict[str, Any]:
    """The metrics row of a finished epoch (loss, timings, samples, peaks, lr), summed over the ranks."""
    from autotune.trainer.ddp import all_gather_int, all_reduce_sum

    ctx, train_s, wait = parts.ctx, progress.train_s, progress.data_wait_s
    # skipped steps are agreed over the ranks: every rank skipped the same ones
    total_loss, total_passes = all_reduce_sum(ctx, [progress.loss_sum, float(progress.passes - progress.skipped)])
    rank_samples = all_gather_int(ctx, progress.samples)
    peak_row: dict[str, Any] = {}
    parts.memory.read(peak_row, "train")
    return {
        **peak_row,
        "epoch": progress.epoch, "loss": total_loss / total_passes if total_passes else float("nan"),  # nan: all skipped
        "train_s": train_s, "data_wait_s": wait,
        "data_wait_share": wait / train_s if train_s > 0 else 0.0,
        "h2d_s": progress.h2d_s, "compute_s": progress.compute_s, "scaler_skipped_steps": progress.scaler_skipped,
        "samples": sum(rank_samples),
        "steps": progress.passes, "nonfinite_steps": progress.skipped,
        "samples_per_s": sum(rank_samples) / train_s if train_s > 0 else 0.0,
        "lr": float(parts.recipe.optimizer.param_groups[0]["lr"]), "world_size": ctx.world_size,
        "rank_samples": rank_samples,
        **(parts.fallbacks.in_force() if parts.fallbacks is not None else {}),
    }


def validate(parts: EpochParts, row: dict[str, Any], dice_columns: list[str]) -> float | None:
    """Validate after ``row["epoch"]``: per-class Dice (``dice_columns``), mean, time and peaks into
    ``row``; returns the mean Dice."""
    from autotune.trainer.infer import evaluate

    t0 = time.perf_counter()
    parts.memory.start(parts.recipe.model, parts.recipe.optimizer, "validation")
    with parts.memory.tracking():
        per_class, mean = evaluate(parts.recipe.model, parts.val_loader, parts.config, parts.ctx.device,
                                   parts.recipe.amp_dtype, parts.ctx, fallbacks=parts.fallbacks,
                                   epoch=int(row["epoch"]), memory=parts.memory)
    row["val_s"] = time.perf_counter() - t0
    parts.memory.read(row, "val")
    row.update(dict(zip(dice_columns, per_class, strict=True)))
    row["mean_dice"] = mean
    if parts.fallbacks is not None:
        row.update(parts.fallbacks.in_force())
    return mean
