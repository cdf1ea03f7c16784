"""The training runner: arguments, and the run from the first epoch to the summary.

``TrainingRun`` builds the data and the model (``autotune.trainer.setup``), checks the disk
has room (``autotune.trainer.room``), resumes (``autotune.trainer.checkpoint``), runs epochs
(``autotune.trainer.epoch``) until done, out of time, stalled or stopped by a signal
(``autotune.trainer.stop``), and writes the checkpoints, metrics and summary. ``train`` is the
entry point for the CLI and for Python. With ``nproc > 1`` it spawns that many processes
(see ``autotune.trainer.ddp``); each runs ``run_worker``. Outputs go to
``BUNDLE/model_fold<k>/``: ``best.pt``, ``last.pt``, ``metrics.csv``, ``metrics.json``,
``curves.png``, ``train_summary.json`` and, on a GPU, ``gpu_monitor.csv``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from autotune.bundles.plan import plan_of
from autotune.checks import duration, integer
from autotune.errors import ConfigError, HostWriteError, SpecError, TrainingDiverged, TrainingStopped
from autotune.files import atomic_write_json
from autotune.finite import NonFiniteSteps, StepGuard, nonfinite_parameters
from autotune.trainer import faults
from autotune.trainer.checkpoint import RunState, checkpoint_state, resume, save_checkpoint
from autotune.trainer.ddp import all_ranks_max, broadcast_flag
from autotune.trainer.epoch import EpochParts, EpochProgress, epoch_row, train_epoch, validate
from autotune.trainer.fallback import RestartRun
from autotune.trainer.faults import continue_command, holds, stop_error, with_kept, write_refusal
from autotune.trainer.learn import start_fallbacks
from autotune.trainer.memory import PhaseMemory, out_of_memory_error, training_limit
from autotune.trainer.room import check_cache_room, check_checkpoint_room, checkpoint_bytes
from autotune.trainer.setup import setup_data, setup_model
from autotune.trainer.stop import StopSignals
from autotune.utils import read_json

__all__ = ["train", "run_worker", "parse_duration", "TrainingRun"]

# curves.png is redrawn after a validation at most this often (drawing takes about a second on a CPU), and
# always when the run ends or stops
CURVES_EVERY_S = 30.0


def parse_duration(text: str | float | int) -> float:
    """``30m``, ``2h``, ``90s``, ``1.5h`` or plain seconds -> seconds (``autotune.checks.duration``).

    Raises:
        SpecError: not a duration above 0 and at most a year.
    """
    return duration(text, "--max-time")


def _check_args(epochs: int | None, max_time: float | None, val_every: int | None, nproc: int) -> None:
    for name, value in (("--epochs", epochs), ("--val-every", val_every)):
        if value is not None:
            integer(value, name, low=1, error=SpecError)
    if max_time is not None:
        duration(max_time, "--max-time")
    integer(nproc, "--nproc", low=1, high=1024, error=SpecError)


def _check_device(device: str, nproc: int) -> None:
    from autotune.device import check_device

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return  # under torchrun each rank checks its own GPU
    check_device(device)
    if nproc > 1 and str(device).startswith("cuda"):
        import torch

        if torch.cuda.device_count() < nproc:
            raise SpecError(f"--nproc {nproc} needs {nproc} GPUs; {torch.cuda.device_count()} visible")


def train(
    bundle: str | os.PathLike[str],
    *,
    device: str = "auto",
    epochs: int | None = None,
    max_time: float | None = None,
    val_every: int | None = None,
    resume: bool = False,
    mode: str = "fast",
    nproc: int = 1,
    progress: bool = True,
    memory_limit: int | str | None = None,
) -> dict[str, Any]:
    """Train a bundle; returns the run summary (also written to ``model_fold<k>/train_summary.json``).

    Args:
        bundle: the bundle folder (or its ``hyper_parameters.yaml``).
        device: ``auto`` (the first GPU, else the CPU), ``cpu``, ``cuda`` or ``cuda:N`` (with several
            processes, one GPU per rank).
        epochs: last epoch to train to (default ``num_epochs`` of the config); sets the schedule's length.
        max_time: seconds. Without ``epochs``, the schedule (warm-up, decay, validation cadence) is fitted
            to this budget from measured time and the run ends within it (``autotune.trainer.budget``);
            with ``epochs`` it is only a stop, checked at epoch ends.
        val_every: validate every K epochs (default ``num_epochs_per_validation``).
        resume: continue from ``last.pt`` (starts fresh, with a warning, when there is none).
        mode: ``fast`` (cache, thread loader, AMP, template recipe) or ``regular`` (the seed's baseline).
        nproc: processes for DistributedDataParallel (ignored when started by torchrun).
        progress: show progress bars and one line per epoch.

    Raises:
        ConfigError: a bad bundle or checkpoint. SpecError: bad arguments or device.
        DataError / InputError: unusable data.
    """
    from autotune.bundles.config import load_bundle_config
    from autotune.device import resolve_device
    from autotune.trainer.data import resolve_options

    device = resolve_device(device)
    _check_args(epochs, max_time, val_every, nproc)
    cfg = load_bundle_config(bundle)  # fail here, in one process, on a bad bundle
    _check_trained_here(bundle, cfg, memory_limit)
    _check_data(bundle, cfg)
    resolve_options(cfg, mode, "cpu")
    _check_device(device, nproc)
    limit = training_limit(cfg, device, memory_limit)
    kwargs = dict(bundle=str(bundle), device=device, epochs=epochs, max_time=max_time, val_every=val_every,
                  resume=resume, mode=mode, progress=progress, memory_limit=limit)
    if nproc > 1 and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        from autotune.trainer.ddp import spawn
        from autotune.trainer.infer import model_dir

        summary = model_dir(cfg) / "train_summary.json"
        before = _stamp(summary)
        spawn(run_worker, nproc, kwargs)
        if _stamp(summary) == before:  # rank 0 writes it last; an old one is not this run's
            raise ConfigError(f"{summary}: the training processes ended without writing their summary")
        return read_json(summary, ConfigError)
    return run_worker(**kwargs)


def _stamp(path: Any) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns


def _check_data(bundle: str | os.PathLike[str], cfg: Mapping[str, Any]) -> None:
    """The fold's cases (training and validation) against the bundle, before anything is built or written:
    the images' channels and axes, the labels' grid and values (``autotune.data.bundle_fit``).

    Raises:
        ConfigError / DataError: no datalist, a fold without cases, or a case the bundle cannot take.
    """
    from autotune.bundles.config import bundle_config_path
    from autotune.data.bundle_fit import check_cases_fit
    from autotune.trainer.data import split_datalist

    train_cases, val_cases, _note = split_datalist(cfg)
    check_cases_fit(cfg, [*train_cases, *val_cases], bundle_config_path(bundle))


def _check_trained_here(bundle: str | os.PathLike[str], cfg: Mapping[str, Any], memory_limit: Any) -> None:
    """Refuse a bundle its template family trains with its own command (``autotune.families``), naming it.

    Raises:
        ConfigError: one line with the command that trains the bundle.
    """
    import shlex

    from autotune.families import family_for

    family = family_for(cfg)
    if not family.trained_by_autotune:
        from autotune.utils import parse_bytes

        limit = str(parse_bytes(memory_limit)) if memory_limit else None
        command = shlex.join(family.training_command(bundle, limit))
        raise ConfigError(f"{bundle}: a bundle of {family.name}'s templates trains with its own script: {command}")


def run_worker(**kwargs: Any) -> dict[str, Any]:
    """Train as this process's rank (alone, spawned, or under torchrun)."""
    from autotune.trainer.ddp import cleanup, init_from_env
    from autotune.trainer.fallback import release_memory

    ctx = init_from_env(kwargs.pop("device"))
    try:
        try:
            return TrainingRun(ctx=ctx, **kwargs).run()
        except RestartRun as restart:
            left = restart.max_time_left  # the time budget left to the restarted run (None: no budget)
        release_memory(ctx.device)  # the first run's model, optimizer and data are gone with its frames
        return TrainingRun(ctx=ctx, **{**kwargs, "resume": True, "max_time": left}, restarted=True).run()
    finally:
        cleanup(ctx)


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
        self.ctx, self.mode, self.resume, self.max_time = ctx, mode, resume, max_time
        self.cfg = load_bundle_config(bundle)
        self.progress = progress and ctx.is_main
        self.total_epochs = int(epochs or self.cfg["num_epochs"])  # with a fitted schedule: the plan so far
        self.val_every = int(val_every or self.cfg.get("num_epochs_per_validation", 1) or 1)
        self.set_by = schedule_set_by(epochs, max_time)
        self.fixed_val_every = val_every is not None
        self.fit: Any = None  # the TimeFit of a run whose schedule its --max-time sets
        self.patience = int(self.cfg.get("early_stop_patience") or 0)
        self.out = model_dir(self.cfg)  # created in run(), once every check has passed
        self.metrics = MetricsLog(self.out, class_labels(self.cfg), enabled=ctx.is_main)
        self.memory_limit = memory_limit
        self.memory = PhaseMemory(ctx.device, memory_limit)
        self.state = RunState()
        self.stop = StopSignals(lambda signum: all_ranks_max(ctx, [signum])[0])
        self.epoch = 0  # the epoch in progress
        self.kept = ""  # what last.pt holds, for a fault's line ("" before the first checkpoint)
        self.best_saved = 0  # the epoch best.pt holds (0: none written)
        self.curves_at = self.t_start  # when curves.png was last drawn (monotonic seconds)
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
            tuned_peak = int(getattr(plan_of(self.cfg), "peak_bytes", None) or 0)
            free = max(0, min(free, int(self.memory_limit) - tuned_peak))
        return free

    def _setup(self) -> None:
        """Data, model and recipe, joined into the ``EpochParts`` every epoch works with."""
        from autotune.trainer.budget import TimeFit
        from autotune.trainer.timing import PhaseClock

        self.data = setup_data(self.cfg, self.ctx, self.mode, self.total_epochs, self._device_room(), self.progress)
        self.recipe = setup_model(self.cfg, self.ctx, self.mode, self.data.opts, self.data.plan)
        self.steps_per_epoch = self.data.plan.steps_per_epoch
        ctx = self.ctx
        guard = StepGuard(self.recipe.model, (lambda flag: all_ranks_max(ctx, [flag])[0]) if ctx.enabled else None)
        self.fallbacks = start_fallbacks(self.cfg, ctx, self.memory_limit, self.recipe.model, self.restarted)
        self.parts = EpochParts(
            ctx=ctx, cfg=self.cfg, recipe=self.recipe, memory=self.memory, train_loader=self.data.train_loader,
            val_loader=self.data.val_loader, train_transforms=self.data.train_transforms,
            seed=int(self.cfg.get("seed", 0)), total_epochs=self.total_epochs, progress=self.progress, guard=guard,
            clock=PhaseClock(ctx.device), fallbacks=self.fallbacks)
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
                                 total_steps=self.total_epochs * self.steps_per_epoch, cfg=self.cfg, partial=partial)
        return {**state, "memory_fallbacks": self.fallbacks.state()}

    def continue_command(self, resume: bool = True) -> str:
        """The command that continues this run."""
        left = None
        if self.fit is not None:  # a fresh run gets the whole budget again; a resumed one what was left
            left = self.fit.budget_s - (self.clock() - self.t_start) if resume else self.fit.budget_s
        return continue_command(self.cfg["bundle_root"], self.total_epochs, self.mode, self.ctx.world_size, resume,
                                left)

    def elapsed(self) -> float:
        return self.state.elapsed_before + self.clock() - self.t_start

    def memory_report(self) -> dict[str, Any]:
        """The run's peaks so far next to the tuned prediction and the limit."""
        return self.memory.report(getattr(plan_of(self.cfg), "peak_bytes", None))

    def _check_room(self) -> None:
        """Refuse, on every rank, a run whose model folder or disk cache lacks room (rank 0 decides)."""
        refusal = None
        if self.ctx.is_main:
            try:
                size = checkpoint_bytes(self.recipe.model, self.recipe.optimizer, self.recipe.scaler)
                check_checkpoint_room(self.out, size, self.continue_command(resume=self.resume))
                if self.data.opts.persistent:
                    check_cache_room(self.data.opts.cache_dir, self.data.cache_disk_bytes, self.cfg["bundle_root"])
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
        if not self.fallbacks.load(self.state.fallbacks) and self.fallbacks.from_record:
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
        try:
            with self.stop:
                stopped, epoch = self._epochs()
        except RestartRun as restart:
            restart.max_time_left = self._restart_from(restart)
            raise
        except Exception as exc:
            fault = self._fault(exc)
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
            raise self._diverged(faults.overflowed(epoch, broken))
        return epoch_row(self.parts, progress)

    def _save_last(self, epoch: int, partial: dict[str, Any] | None = None) -> None:
        save_checkpoint(self.out / "last.pt", self.checkpoint(epoch, partial))
        self.kept = holds(epoch, partial, len(self.parts.train_loader))

    def _stopped_inside(self, progress: EpochProgress) -> TrainingStopped:
        """Write the checkpoint of a stopped epoch (rank 0); the ``TrainingStopped`` to raise."""
        from autotune.trainer.ddp import all_gather_int, barrier

        rank_batches = all_gather_int(self.ctx, progress.batches)  # the same on every rank: one agreed boundary
        self.memory.read({}, "train")
        partial = {**progress.as_dict(), "rank_batches": rank_batches} if progress.batches else None
        if self.ctx.is_main:
            self._save_last(progress.epoch - 1, partial)
            self._draw_curves()
        barrier(self.ctx)
        return self._stopped(f"in epoch {progress.epoch} after batch {progress.batches} of "
                             f"{len(self.parts.train_loader)}" if progress.batches else f"before epoch {progress.epoch}")

    def _restart_from(self, restart: RestartRun) -> float | None:
        """Write the checkpoint a restart continues from (rank 0), at the pass that failed, with the split in force;
        returns the time budget left (None: none)."""
        from autotune.trainer.ddp import all_gather_int, barrier

        progress = restart.progress
        rank_batches = all_gather_int(self.ctx, progress.batches)
        self.memory.read({}, "train")
        partial = {**progress.as_dict(), "rank_batches": rank_batches}
        if self.ctx.is_main:
            self._save_last(progress.epoch - 1, partial)
            self.say_always(f"memory: restarting once from {self.out / 'last.pt'} ({self.kept}, pass "
                            f"{progress.batch_passes + 1} of its batch) in {self.fallbacks.micro_batches} micro-batches")
        barrier(self.ctx)
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
        self.say(epoch_line(row, self.total_epochs, self.state.best, self.state.best_epoch))
        if signum and row["epoch"] < self.total_epochs:  # after the last epoch the run just finishes
            self.stop.agreed = signum
            self._draw_curves()
            raise self._stopped(f"after epoch {row['epoch']}")

    def _draw_curves(self) -> None:
        """Rank 0 draws ``curves.png`` from the epochs so far (none yet: nothing)."""
        from autotune.trainer.monitor import plot_curves

        if self.ctx.is_main and self.metrics.rows:
            plot_curves(self.metrics.rows, self.out / "curves.png", f"{self.cfg['algo']} {self.mode}")
            self.curves_at = time.monotonic()

    def _diverged(self, what: str) -> TrainingDiverged:
        """The line of a run that diverged (``what``: where and how), with what was kept and what to try."""
        group = self.recipe.optimizer.param_groups[0]
        return faults.diverged_error(what, self.recipe.precision.name, faults.kept_files(self.out, self.kept,
                                     self.best_saved), self.continue_command(), self.continue_command(resume=False),
                                     float(group.get("initial_lr", group["lr"])), self.cfg["bundle_root"])

    def _fault(self, exc: Exception) -> Exception | None:
        """The one-line error for ``exc`` (out of memory; a write the host refused, with what was kept; steps that
        stayed non-finite), or None to let it through."""
        if isinstance(exc, (TrainingStopped, TrainingDiverged)):
            return None
        if isinstance(exc, NonFiniteSteps):
            return self._diverged(faults.skipped(exc, self.steps_per_epoch, self.ctx.world_size))
        oom = out_of_memory_error(exc, self.cfg, self.memory_limit, self.memory.phase, self.epoch, self.out / "last.pt")
        refusal = write_refusal(exc, self.data.opts.cache_dir) if oom is None else None
        if refusal is None:
            return oom
        return with_kept(refusal, self.out, self.kept, self.best_saved, self.continue_command(bool(self.kept)))

    def _finish(self, stopped: str, epoch: int, seconds: float, monitor: Any) -> dict[str, Any]:
        """The run's summary, written (rank 0) as ``train_summary.json`` and said in one line."""
        from autotune.cuda_alloc import alloc_conf
        from autotune.trainer.ddp import barrier
        from autotune.trainer.monitor import fmt

        out, first = self.out, self.state.epoch + 1
        summary = {
            "bundle": self.cfg["bundle_root"], "mode": self.mode, "device": self.ctx.device,
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
            "alloc_conf": alloc_conf(),  # the CUDA allocator setting it trained under (autotune.cuda_alloc)
            "gpu_monitor": str(monitor.path) if monitor.samples else None,
            **self.memory_report(), **self.fallbacks.in_force(), "memory_fallbacks": list(self.fallbacks.events),
        }
        if self.ctx.is_main:
            try:
                self._draw_curves()
                atomic_write_json(out / "train_summary.json", summary, what="the training summary")
            except HostWriteError as exc:
                raise self._fault(exc) or exc from exc
            self.say(f"done: {summary['epochs_run']} epochs ({stopped}), best mean Dice "
                     f"{fmt(self.state.best)} at epoch {self.state.best_epoch}; outputs in {out}")
        barrier(self.ctx)
        return summary
