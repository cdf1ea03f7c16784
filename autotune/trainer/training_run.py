"""One rank's training run, from the first epoch to the summary: ``TrainingRun``.

It builds the data and the model (``autotune.trainer.setup``), checks the disk has room
(``autotune.trainer.room``), resumes (``autotune.trainer.checkpoint``), runs epochs
(``autotune.trainer.epoch``) until done, out of time, stalled or stopped by a signal
(``autotune.trainer.stop``), steps down after an out-of-memory (``autotune.trainer.fallback``), and writes
the checkpoints, metrics and summary. ``autotune.trainer.runner`` starts it (``run_worker``).
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict
from typing import Any

from autotune.errors import HostWriteError, TrainingStopped
from autotune.files import atomic_write_json
from autotune.finite import StepGuard, nonfinite_parameters
from autotune.trainer import faults
from autotune.trainer.checkpoint import RunState, checkpoint_state, resume, save_checkpoint
from autotune.trainer.ddp import all_ranks_max, broadcast_flag
from autotune.trainer.epoch import EpochParts, EpochProgress, epoch_row, train_epoch, validate
from autotune.trainer.fallback import RestartRun
from autotune.trainer.faults import continue_command, holds, stop_error
from autotune.trainer.learn import start_fallbacks
from autotune.trainer.memory import PhaseMemory
from autotune.trainer.room import check_cache_room, check_checkpoint_room, checkpoint_bytes
from autotune.trainer.setup import setup_data, setup_model
from autotune.trainer.stop import StopSignals

__all__ = ["TrainingRun", "CURVES_EVERY_S"]

# curves.png is redrawn after a validation at most this often (drawing takes about a second on a CPU), and
# always when the run ends or stops
CURVES_EVERY_S = 30.0


class TrainingRun:
    """One rank's training run: build everything, then epochs until done, out of time, stalled or stopped.

    Faults end the run with one line: out of memory (``TrainingOutOfMemory``), a write the host
    refused (``HostWriteError``, with what was kept), a stop signal (``TrainingStopped``, after a
    checkpoint that ``--resume`` continues from exactly; see ``autotune.trainer.stop``).
    """

    # The clock of the time budget and of the run's elapsed seconds (a test may give the run its own).
    clock = staticmethod(time.monotonic)

    def __init__(self, *, ctx: Any, bundle: str, epochs: int | None, max_time: float | None,
                 val_every: int | None, resume: bool, mode: str, progress: bool,
                 memory_limit: int | None = None, restarted: bool = False) -> None:
        from autotune.bundles.config import load_bundle_config
        from autotune.trainer.budget import schedule_set_by
        from autotune.trainer.infer import class_labels, model_dir
        from autotune.trainer.monitor import MetricsLog

        self.t_start = self.clock()
        self.t_created = time.monotonic()  # the wall clock of setup_s (the run's own clock may be a test's)
        self.ctx, self.mode, self.resume, self.max_time = ctx, mode, resume, max_time
        self.config = load_bundle_config(bundle)
        self.tuned = self.config.tuned  # what it trains and infers with (autotune.bundles.tuned)
        self.progress = progress and ctx.is_main
        self.total_epochs = int(epochs or self.config.num_epochs)  # with a fitted schedule: the plan so far
        self.val_every = int(val_every or self.config.num_epochs_per_validation)
        self.set_by = schedule_set_by(epochs, max_time)
        self.fixed_val_every = val_every is not None
        self.fit: Any = None  # the TimeFit of a run whose schedule its --max-time sets
        self.patience = self.config.early_stop_patience or 0
        self.out = model_dir(self.config)  # created in run(), once every check has passed
        self.metrics = MetricsLog(self.out, class_labels(self.config), enabled=ctx.is_main)
        self.memory_limit = memory_limit
        self.memory = PhaseMemory(ctx.device, memory_limit)
        self.state = RunState()
        self.stop = StopSignals(lambda signum: all_ranks_max(ctx, [signum])[0])
        self.epoch = 0  # the epoch in progress
        self.kept = ""  # what last.pt holds, for a fault's line ("" before the first checkpoint)
        self.best_saved = 0  # the epoch best.pt holds (0: none written)
        self.curves_at = self.t_start  # when curves.png was last drawn (monotonic seconds)
        self.setup_s = 0.0  # seconds from the start to the first batch (set by run())
        self.restarted = restarted  # this run is the restart after an out-of-memory (autotune.trainer.fallback)

    def say(self, message: str) -> None:
        if self.progress:
            print(message, flush=True)

    def _device_room(self) -> int | None:
        """Free GPU memory the data cache may take (None on the CPU)."""
        if not self.ctx.device.startswith("cuda"):
            return None
        import torch

        free = int(torch.cuda.mem_get_info(self.ctx.device)[0])
        if self.memory_limit is not None:
            # Under a limit the cache may only take what the tuned peak leaves (the probe never held it).
            free = max(0, min(free, int(self.memory_limit) - int(self.tuned.tuned_peak_bytes or 0)))
        return free

    def _setup(self) -> None:
        """Data, model and recipe, joined into the ``EpochParts`` every epoch works with."""
        from autotune.trainer.budget import TimeFit
        from autotune.trainer.timing import PhaseClock

        self.data = setup_data(self.config, self.ctx, self.mode, self.total_epochs, self._device_room(), self.progress)
        self.recipe = setup_model(self.config, self.ctx, self.mode, self.data.opts, self.data.plan)
        self.steps_per_epoch = self.data.plan.steps_per_epoch
        ctx = self.ctx
        guard = StepGuard(self.recipe.model, (lambda flag: all_ranks_max(ctx, [flag])[0]) if ctx.enabled else None)
        self.fallbacks = start_fallbacks(self.config, ctx, self.memory_limit, self.recipe.model, self.restarted)
        self.parts = EpochParts(
            ctx=ctx, config=self.config, tuned=self.tuned, recipe=self.recipe, memory=self.memory,
            train_loader=self.data.train_loader, val_loader=self.data.val_loader, seed=self.config.seed,
            train_transforms=self.data.train_transforms, total_epochs=self.total_epochs, progress=self.progress,
            guard=guard, clock=PhaseClock(ctx.device), fallbacks=self.fallbacks)
        if self.set_by == "max_time":
            self.fit = TimeFit(budget_s=float(self.max_time), batches_per_epoch=len(self.data.train_loader),
                               planned_epochs=self.total_epochs, val_every=self.val_every,
                               fixed_val_every=self.fixed_val_every)

    def state_parts(self) -> dict[str, Any]:
        """What a checkpoint holds state dicts of (scaler and scheduler may be None)."""
        recipe = self.recipe
        return {"model": recipe.model, "optimizer": recipe.optimizer, "scaler": recipe.scaler,
                "scheduler": recipe.scheduler}

    def checkpoint(self, epoch: int, partial: dict[str, Any] | None = None) -> dict[str, Any]:
        """The checkpoint after ``epoch`` (and ``partial``: how far the next epoch got)."""
        state = checkpoint_state(self.state_parts(), self.state, epoch, mode=self.mode, elapsed_s=self.elapsed(),
                                 total_steps=self.total_epochs * self.steps_per_epoch, config=self.config,
                                 partial=partial)
        return {**state, "memory_fallbacks": self.fallbacks.state()}

    def continue_command(self, resume: bool = True) -> str:
        """The command that continues this run."""
        left = None
        if self.fit is not None:  # a fresh run gets the whole budget again; a resumed one what was left
            left = self.fit.budget_s - (self.clock() - self.t_start) if resume else self.fit.budget_s
        return continue_command(self.config.bundle_root, self.total_epochs, self.mode, self.ctx.world_size, resume,
                                left)

    def elapsed(self) -> float:
        return self.state.elapsed_before + self.clock() - self.t_start

    def memory_report(self) -> dict[str, Any]:
        """The run's peaks so far next to the tuned prediction and the limit."""
        return self.memory.report(self.tuned.tuned_peak_bytes)

    def _check_room(self) -> None:
        """Refuse, on every rank, a run whose model folder or disk cache lacks room (rank 0 decides)."""
        refusal = None
        if self.ctx.is_main:
            try:
                size = checkpoint_bytes(self.recipe.model, self.recipe.optimizer, self.recipe.scaler)
                check_checkpoint_room(self.out, size, self.continue_command(resume=self.resume))
                if self.data.opts.persistent:
                    check_cache_room(self.data.opts.cache_dir, self.data.cache_disk_bytes,
                                      self.config.bundle_root)
            except HostWriteError as exc:
                refusal = exc
        if broadcast_flag(self.ctx, refusal is not None):
            raise refusal or HostWriteError("rank 0 found too little free space for this run (see its line)")

    def run(self) -> dict[str, Any]:
        from autotune.trainer.monitor import GpuMonitor, start_line

        self.memory.apply_limit()
        self._setup()
        # a fitted schedule keeps the length its checkpoint planned until this run has timed its first batches
        self.state = (resume(self.out / "last.pt", self.mode, self.state_parts(),
                             None if self.fit else self.total_epochs * self.steps_per_epoch, self.say)
                      if self.resume else RunState())
        if not self.fallbacks.load(self.state.fallbacks, str(self.out / "last.pt")) and self.fallbacks.from_record:
            self.say_always(self.fallbacks.from_record)
        if self.state.epoch or self.state.partial:
            self.metrics.load(self.state.epoch)
            self.kept = holds(self.state.epoch, self.state.partial, len(self.parts.train_loader))
            self.best_saved = self.state.best_epoch if (self.out / "best.pt").is_file() else 0
            self.say(f"resuming after {self.kept} (best mean Dice {self.state.best})")
        group = self.recipe.optimizer.param_groups[0]
        self.say(start_line(self.mode, self.ctx, self.data, self.recipe.precision.line(),
                            float(group.get("initial_lr", group["lr"])), self.schedule_note()))
        self._check_room()
        if self.ctx.is_main:  # the first write of the run
            self.out.mkdir(parents=True, exist_ok=True)
            for torn in self.out.glob(".*.pt.*.tmp"):  # left by a kill during a checkpoint write
                torn.unlink(missing_ok=True)
        opts = self.data.opts
        monitor = GpuMonitor(self.out / "gpu_monitor.csv", self.ctx.device, opts.gpu_monitor_interval_s)
        if self.ctx.is_main and opts.gpu_monitor:
            monitor.start()
        t_loop = time.monotonic()
        self.setup_s = t_loop - self.t_created  # data, cache, model, resume and checks: before the first batch
        try:
            with self.stop:
                stopped, epoch = self._epochs()
        except RestartRun as restart:
            restart.max_time_left = self._restart_from(restart)
            raise
        except Exception as exc:
            fault = faults.run_fault(self, exc)
            if fault is None:
                raise
            raise fault from exc
        finally:
            monitor.stop()
            self.recipe.nvtx.detach()
        return self._finish(stopped, epoch, time.monotonic() - t_loop, monitor)

    def schedule_note(self) -> str:
        """How the schedule's length is set, for the start line."""
        if self.fit is not None:
            return (f"schedule fitted to --max-time {self.max_time:g}s (planned after the first "
                    f"{self.fit_batches()} batches)")
        return f"schedule over {self.total_epochs} epochs ({'--epochs' if self.set_by == 'epochs' else 'num_epochs'})"

    @staticmethod
    def fit_batches() -> int:
        from autotune.trainer.budget import FIRST_FIT_BATCHES

        return FIRST_FIT_BATCHES + 1

    def _apply_plan(self, planned: int) -> None:
        """Plan ``planned`` epochs (agreed over the ranks): the schedule's length, the cadence, the bar."""
        from autotune.schedule import fitted_schedule_of

        planned, cadence = all_ranks_max(self.ctx, [planned, self.fit.val_every])
        self.fit.planned_epochs, self.fit.val_every = planned, cadence
        self.total_epochs = self.parts.total_epochs = planned
        self.val_every = cadence
        factor = fitted_schedule_of(self.recipe.scheduler)
        if factor is not None:
            factor.refit(planned * self.steps_per_epoch)

    def _on_batch(self, progress: Any) -> None:
        """The first plan of a fitted schedule, once the first batches are timed."""
        now = self.clock()
        planned = self.fit.batch_done(now, now - self.t_start, progress.epoch, progress.batches)
        if planned is not None:
            self._apply_plan(planned)

    def _epochs(self) -> tuple[str, int]:
        """Train epochs until the last, the time limit or an early stop: (why it stopped, last epoch)."""
        epoch = self.state.epoch
        while epoch < self.total_epochs:
            epoch = self.epoch = epoch + 1
            started = self.clock()
            row = self._train(epoch)
            if self.fit is not None:  # plan again: the last epoch is the one after which no other fits
                now = self.clock()
                self._apply_plan(self.fit.epoch_done(epoch, now - started, now - self.t_start))
                time_up = epoch >= self.total_epochs
            else:
                over = self.max_time is not None and self.clock() - self.t_start >= self.max_time
                time_up = broadcast_flag(self.ctx, over)
            row.update(val_s=0.0, mean_dice=None, val_peak_bytes=None, val_peak_allocated_bytes=None,
                       planned_epochs=self.total_epochs)
            new_best = False
            if epoch % self.val_every == 0 or epoch >= self.total_epochs or time_up:
                started = self.clock()
                new_best = self.state.validated(validate(self.parts, row, self.metrics.dice_columns), epoch)
                if self.fit is not None:
                    self.fit.validated(self.clock() - started)
            row["epoch_s"] = row["train_s"] + row["val_s"]
            row["elapsed_s"] = self.elapsed()
            self._end_epoch(row, new_best)
            if time_up:
                return "max_time", epoch
            if self.patience and self.state.stale >= self.patience:
                self.say(f"early stop: no better validation Dice in {self.state.stale} validations")
                return "early_stop", epoch
        return "epochs", epoch

    def _train(self, epoch: int) -> dict[str, Any]:
        """Train ``epoch`` (from where a stopped run left it) and return its row; a stop signal inside
        it writes the checkpoint of how far it got and raises ``TrainingStopped``."""
        partial, self.state.partial = self.state.partial, None
        if partial and len(partial.get("rank_batches") or [0]) != self.ctx.world_size:
            if self.ctx.is_main:
                print(f"warning: the stopped run had {len(partial['rank_batches'])} processes, this one "
                      f"{self.ctx.world_size}: epoch {epoch} starts again from its first batch", file=sys.stderr)
            partial = None
        progress = (EpochProgress.from_dict(partial) if partial and int(partial["epoch"]) == epoch
                    else EpochProgress(epoch))
        on_batch = self._on_batch if self.fit is not None and not self.fit.refits else None
        progress = train_epoch(self.parts, progress, self.stop.requested_everywhere, on_batch)
        if not progress.complete:
            raise self._stopped_inside(progress)
        broken = nonfinite_parameters(self.recipe.model)  # an applied step can still overflow the weights
        if broken:
            raise faults.run_diverged(self, faults.overflowed(epoch, broken))
        return epoch_row(self.parts, progress)

    def _save_last(self, epoch: int, partial: dict[str, Any] | None = None) -> None:
        save_checkpoint(self.out / "last.pt", self.checkpoint(epoch, partial))
        self.kept = holds(epoch, partial, len(self.parts.train_loader))

    def _save_inside(self, progress: EpochProgress, always: bool) -> dict[str, Any] | None:
        """Rank 0 writes ``last.pt`` at how far ``progress``'s epoch got (``always``: even before its first batch);
        the ranks agree on the boundary first (one collective) and wait for the write. Returns the partial."""
        from autotune.trainer.ddp import all_gather_int, barrier

        rank_batches = all_gather_int(self.ctx, progress.batches)  # the same on every rank: one agreed boundary
        self.memory.read({}, "train")
        partial = {**progress.as_dict(), "rank_batches": rank_batches} if progress.batches or always else None
        if self.ctx.is_main:
            self._save_last(progress.epoch - 1, partial)
            self._draw_curves()
        barrier(self.ctx)
        return partial

    def _stopped_inside(self, progress: EpochProgress) -> TrainingStopped:
        """Write the checkpoint of a stopped epoch (rank 0); the ``TrainingStopped`` to raise."""
        self._save_inside(progress, always=False)
        return self._stopped(f"in epoch {progress.epoch} after batch {progress.batches} of "
                             f"{len(self.parts.train_loader)}" if progress.batches else f"before epoch {progress.epoch}")

    def _restart_from(self, restart: RestartRun) -> float | None:
        """Write the checkpoint a restart continues from (rank 0), at the pass that failed, with the split in force;
        returns the time budget left (None: none)."""
        progress = restart.progress
        self._save_inside(progress, always=True)
        self.say_always(f"memory: restarting once from {self.out / 'last.pt'} ({self.kept}, pass "
                        f"{progress.batch_passes + 1} of its batch) in {self.fallbacks.micro_batches} micro-batches")
        return None if self.max_time is None else max(1.0, self.max_time - (self.clock() - self.t_start))

    def say_always(self, line: str) -> None:
        """A line rank 0 prints to stderr whether or not progress is shown (a step-down, a restart)."""
        if self.ctx.is_main:
            print(line, file=sys.stderr, flush=True)

    def _stopped(self, where: str) -> TrainingStopped:
        return stop_error(self.stop.agreed, where, self.out / "last.pt", self.kept, self.continue_command())

    def _end_epoch(self, row: dict[str, Any], new_best: bool) -> None:
        """Rank 0 writes the epoch's checkpoints and records; then every rank learns whether that failed
        and whether a stop signal came (one collective), and stops together."""
        from autotune.trainer.monitor import epoch_line

        failure: HostWriteError | None = None
        if self.ctx.is_main:
            try:
                if new_best:
                    save_checkpoint(self.out / "best.pt", self.checkpoint(row["epoch"]))
                    self.best_saved = row["epoch"]
                self._save_last(row["epoch"])
                self.metrics.add(row, {"mode": self.mode, "precision": self.recipe.precision.name,
                                       "world_size": self.ctx.world_size, "split": self.data.split_note,
                                       "options": asdict(self.data.opts), "memory": self.memory_report()})
                if row["mean_dice"] is not None and time.monotonic() - self.curves_at >= CURVES_EVERY_S:
                    self._draw_curves()
            except HostWriteError as exc:
                failure = exc
        failed, signum = all_ranks_max(self.ctx, [int(failure is not None), self.stop.signum or 0])
        if failed:
            raise failure or HostWriteError("rank 0 could not write the epoch's outputs (see its line)")
        self.kept = holds(row["epoch"], None, len(self.parts.train_loader))  # every rank: rank 0 wrote last.pt
        self.say(epoch_line(row, self.total_epochs, self.state.best, self.state.best_epoch))
        if signum and row["epoch"] < self.total_epochs:  # after the last epoch the run just finishes
            self.stop.agreed = signum
            self._draw_curves()
            raise self._stopped(f"after epoch {row['epoch']}")

    def _draw_curves(self) -> None:
        """Rank 0 draws ``curves.png`` from the epochs so far (none yet: nothing)."""
        from autotune.trainer.monitor import plot_curves

        if self.ctx.is_main and self.metrics.rows:
            plot_curves(self.metrics.rows, self.out / "curves.png", f"{self.config.algo} {self.mode}")
            self.curves_at = time.monotonic()

    def _techniques(self) -> dict[str, Any]:
        """What the run trained with: cache, loader, precision and ``torch.compile`` (with its first call's cost)."""
        opts, compiled = self.data.opts, self.recipe.compiled
        return {"cache": opts.cache_place(), "loader": opts.loader_name(), "precision": self.recipe.precision.name,
                "compile": compiled.as_dict() if compiled is not None else None}

    def _finish(self, stopped: str, epoch: int, seconds: float, monitor: Any) -> dict[str, Any]:
        """The run's summary, written (rank 0) as ``train_summary.json`` and said in one line."""
        from autotune.cuda_alloc import alloc_conf
        from autotune.trainer.ddp import barrier
        from autotune.trainer.monitor import fmt

        out, first = self.out, self.state.epoch + 1
        summary = {
            "bundle": self.config.bundle_root, "mode": self.mode, "device": self.ctx.device,
            "world_size": self.ctx.world_size, "first_epoch": first, "last_epoch": epoch,
            "epochs_run": epoch - self.state.epoch, "stopped": stopped, "best_metric": self.state.best,
            "best_epoch": self.state.best_epoch, "precision": self.recipe.precision.name,
            "precision_reason": self.recipe.precision.reason, "seconds": seconds, "split": self.data.split_note,
            "schedule": self.fit.record() if self.fit is not None else {
                "set_by": self.set_by, "planned_epochs": self.total_epochs, "val_every": self.val_every},
            "train_cases_per_rank": self.data.num_train_cases, "model_dir": str(out),
            **{k: str(out / f) for k, f in (("best_checkpoint", "best.pt"), ("last_checkpoint", "last.pt"),
                                             ("metrics_csv", "metrics.csv"), ("metrics_json", "metrics.json"),
                                             ("curves", "curves.png"))},
            "nonfinite_steps": sum(int(r.get("nonfinite_steps") or 0) for r in self.metrics.rows if r["epoch"] >= first),
            "setup_s": round(self.setup_s, 2), "techniques": self._techniques(),
            "alloc_conf": alloc_conf(),  # the CUDA allocator setting it trained under (autotune.cuda_alloc)
            "gpu_monitor": str(monitor.path) if monitor.samples else None,
            **self.memory_report(), **self.fallbacks.in_force(), "memory_fallbacks": list(self.fallbacks.events),
        }
        if self.ctx.is_main:
            try:
                self._draw_curves()
                atomic_write_json(out / "train_summary.json", summary, what="the training summary")
            except HostWriteError as exc:
                raise faults.run_fault(self, exc) or exc from exc
            self.say(f"done: {summary['epochs_run']} epochs ({stopped}), best mean Dice "
                     f"{fmt(self.state.best)} at epoch {self.state.best_epoch}; outputs in {out}")
        barrier(self.ctx)
        return summary
