"""The training runner: arguments, setup, and the run from the first epoch to the summary.

``TrainingRun`` builds the data and the model, resumes (``autotune.train.checkpoint``),
runs epochs (``autotune.train.epoch``) until done, out of time or stalled, and writes the
checkpoints, metrics and summary. ``train`` is the entry point for the CLI and for Python. With ``nproc > 1`` it spawns
that many processes (see ``autotune.train.ddp``); each runs ``run_worker``. Outputs go
to ``BUNDLE/model_fold<k>/``: ``best.pt``, ``last.pt``, ``metrics.csv``, ``metrics.json``,
``curves.png``, ``train_summary.json`` and, on a GPU, ``gpu_monitor.csv``.
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import asdict
from typing import Any

from autotune.bundles.scaling import plan_schedule
from autotune.errors import ConfigError, SpecError
from autotune.train.checkpoint import RunState, checkpoint_state, resume, save_checkpoint
from autotune.train.epoch import train_epoch, validate
from autotune.train.memory import PhaseMemory, out_of_memory_error, training_limit
from autotune.utils import atomic_write_json, read_json

__all__ = ["train", "run_worker", "parse_duration", "TrainingRun"]

_DURATION_UNITS = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
REGULAR_LR = 1e-4  # the seed baseline's Adam learning rate


def parse_duration(text: str | float | int) -> float:
    """``30m``, ``2h``, ``90s``, ``1.5h`` or plain seconds -> seconds.

    Raises:
        SpecError: not a positive duration.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*", str(text).lower())
    if not match or match.group(2) not in _DURATION_UNITS or isinstance(text, bool):
        raise SpecError(f"--max-time {text!r} is not a duration; write e.g. 90s, 30m, 2h or plain seconds")
    seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if seconds <= 0:
        raise SpecError(f"--max-time {text!r} must be longer than zero")
    return seconds


def _check_args(epochs: int | None, max_time: float | None, val_every: int | None, nproc: int) -> None:
    for name, value in (("--epochs", epochs), ("--val-every", val_every)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise SpecError(f"{name} must be a positive integer, got {value!r}")
    if max_time is not None and not float(max_time) > 0:
        raise SpecError(f"--max-time must be positive seconds, got {max_time!r}")
    if not isinstance(nproc, int) or nproc < 1:
        raise SpecError(f"--nproc must be a positive integer, got {nproc!r}")


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
        epochs: last epoch to train to (default ``num_epochs`` of the config).
        max_time: seconds; the run stops at the first epoch end past it.
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
    from autotune.train.data import resolve_options

    device = resolve_device(device)
    _check_args(epochs, max_time, val_every, nproc)
    cfg = load_bundle_config(bundle)  # fail here, in one process, on a bad bundle
    resolve_options(cfg, mode, "cpu")
    _check_device(device, nproc)
    limit = training_limit(cfg, device, memory_limit)
    kwargs = dict(bundle=str(bundle), device=device, epochs=epochs, max_time=max_time, val_every=val_every,
                  resume=resume, mode=mode, progress=progress, memory_limit=limit)
    if nproc > 1 and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        from autotune.train.ddp import spawn
        from autotune.train.infer import model_dir

        summary = model_dir(cfg) / "train_summary.json"
        summary.unlink(missing_ok=True)
        spawn(run_worker, nproc, kwargs)
        return read_json(summary, ConfigError)
    return run_worker(**kwargs)


def run_worker(**kwargs: Any) -> dict[str, Any]:
    """Train as this process's rank (alone, spawned, or under torchrun)."""
    from autotune.train.ddp import cleanup, init_from_env

    ctx = init_from_env(kwargs.pop("device"))
    try:
        return TrainingRun(ctx=ctx, **kwargs).run()
    finally:
        cleanup(ctx)


class TrainingRun:
    """One rank's training run: build everything, then epochs until done, out of time or stalled."""

    def __init__(self, *, ctx: Any, bundle: str, epochs: int | None, max_time: float | None,
                 val_every: int | None, resume: bool, mode: str, progress: bool,
                 memory_limit: int | None = None) -> None:
        from autotune.bundles.config import load_bundle_config
        from autotune.train.infer import class_labels, model_dir
        from autotune.train.monitor import MetricsLog

        self.t_start = time.monotonic()
        self.ctx, self.mode, self.resume, self.max_time = ctx, mode, resume, max_time
        self.cfg = load_bundle_config(bundle)
        self.progress = progress and ctx.is_main
        self.total_epochs = int(epochs or self.cfg["num_epochs"])
        self.val_every = int(val_every or self.cfg.get("num_epochs_per_validation", 1) or 1)
        self.patience = int(self.cfg.get("early_stop_patience") or 0)
        self.seed = int(self.cfg.get("seed", 0))
        self.out = model_dir(self.cfg)
        if ctx.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            for torn in self.out.glob(".*.pt.*.tmp"):  # left by a kill during a checkpoint write
                torn.unlink(missing_ok=True)
        self.metrics = MetricsLog(self.out, class_labels(self.cfg), enabled=ctx.is_main)
        self.memory_limit = memory_limit
        self.memory = PhaseMemory(ctx.device, memory_limit)
        self.phase = "setup"
        self.state = RunState()

    def say(self, message: str) -> None:
        if self.progress:
            print(message, flush=True)

    def _setup_data(self) -> None:
        from autotune.build import build_transforms
        from autotune.train import data

        train_cases, val_cases, self.split_note = data.split_datalist(self.cfg)
        train_cases = data.shard(train_cases, self.ctx.rank, self.ctx.world_size, self.seed, even=True)
        val_cases = data.shard(val_cases, self.ctx.rank, self.ctx.world_size, self.seed, even=False)
        fast_cache = self.mode == "fast" and (self.cfg.get("fast_training") or {}).get("cache", True)
        cache_bytes = data.estimate_cache_bytes(train_cases, self.cfg) if fast_cache else None
        free = None
        if self.ctx.device.startswith("cuda"):
            import torch

            free = int(torch.cuda.mem_get_info(self.ctx.device)[0])
            if self.memory_limit is not None:
                # Under a limit the cache may only take what the tuned peak leaves (the probe never held it).
                tuned_peak = int((self.cfg.get("tuning") or {}).get("peak_bytes") or 0)
                free = max(0, min(free, int(self.memory_limit) - tuned_peak))
        self.opts = opts = data.resolve_options(self.cfg, self.mode, self.ctx.device, cache_bytes, free)
        self.train_transforms = build_transforms(self.cfg, "train",
                                                 device=self.ctx.device if opts.cache_on_device else None)
        train_ds = data.make_dataset(train_cases, self.train_transforms, opts, "train", self.progress)
        val_ds = data.make_dataset(val_cases, build_transforms(self.cfg, "val"), opts, "val", self.progress)
        self.batch_images = int(self.cfg["num_images_per_batch"])
        self.train_loader = data.make_loader(train_ds, self.batch_images, opts, shuffle=True)
        self.val_loader = data.make_loader(val_ds, 1, opts, shuffle=False)
        # the schedule counts samples: epochs x cases x crops, in ceil(samples / N) optimizer steps
        self.plan = plan_schedule(self.cfg, len(train_ds), self.total_epochs)
        self.steps_per_epoch = self.plan.steps_per_epoch
        self.num_train_cases = len(train_ds)

    def _setup_model(self) -> None:
        import torch

        from autotune import build
        from autotune.step import make_grad_scaler
        from autotune.train.monitor import NvtxRanges

        device, cfg = self.ctx.device, self.cfg
        _seed_everything(self.seed)  # the same initial weights in every mode and on every rank
        self.model = build.build_network(cfg).to(device)
        if self.opts.template_recipe:
            self.loss_fn = build.build_loss(cfg)
            self.optimizer = build.build_optimizer(cfg, self.model.parameters())
            self.scheduler = build.build_lr_scheduler(cfg, self.optimizer, self.plan.total_steps,
                                                      self.plan.warmup_steps, self.plan.warmup_start_factor)
        else:  # the seed's baseline recipe
            from monai.losses import DiceLoss

            sigmoid = bool(cfg.get("sigmoid"))
            self.loss_fn = DiceLoss(to_onehot_y=not sigmoid, softmax=not sigmoid, sigmoid=sigmoid)
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=REGULAR_LR)
            self.scheduler = None
        if self.opts.template_recipe:  # fast mode: the precision the bundle was tuned in
            from autotune.precision import for_bundle

            self.precision, warning = for_bundle(cfg, device)
            if warning and self.ctx.is_main:
                print(f"warning: {warning}", file=sys.stderr, flush=True)
        else:
            from autotune.precision import Precision

            self.precision = Precision("fp32", "regular mode: the seed's baseline runs in fp32")
        self.amp_dtype = build.amp_dtype(cfg, device, self.precision.name)
        self.scaler = make_grad_scaler(device, self.amp_dtype)
        self.nvtx = NvtxRanges(self.opts.nvtx)
        self.nvtx.attach(self.model, self.optimizer)
        self.loss_fn = self.nvtx.wrap_loss(self.loss_fn)
        self.net = self.model
        if self.ctx.enabled:
            from torch.nn.parallel import DistributedDataParallel

            index = [torch.device(device).index] if device.startswith("cuda") else None
            self.net = DistributedDataParallel(self.model, device_ids=index,
                                               find_unused_parameters=cfg["network"]["name"] == "DiNTS")
        if device.startswith("cuda") and self.mode == "fast":
            torch.backends.cudnn.benchmark = True  # the roi is fixed, so the fastest kernels are found once

    def parts(self) -> dict[str, Any]:
        """What a checkpoint holds state dicts of (scaler and scheduler may be None)."""
        return {"model": self.model, "optimizer": self.optimizer, "scaler": self.scaler, "scheduler": self.scheduler}

    def checkpoint(self, epoch: int) -> dict[str, Any]:
        """The checkpoint after ``epoch``."""
        return checkpoint_state(self.parts(), self.state, epoch, mode=self.mode, elapsed_s=self.elapsed(),
                                total_steps=self.total_epochs * self.steps_per_epoch, cfg=self.cfg)

    def _base_lr(self) -> float:
        group = self.optimizer.param_groups[0]
        return float(group.get("initial_lr", group["lr"]))

    def elapsed(self) -> float:
        return self.state.elapsed_before + time.monotonic() - self.t_start

    def memory_report(self) -> dict[str, Any]:
        """The run's peaks so far next to the tuned prediction and the limit."""
        return self.memory.report((self.cfg.get("tuning") or {}).get("peak_bytes"))

    def run(self) -> dict[str, Any]:
        from autotune.train.ddp import barrier, broadcast_flag
        from autotune.train.monitor import GpuMonitor, epoch_line, fmt, plot_curves

        self.memory.apply_limit()
        self._setup_data()
        self._setup_model()
        self.state = (resume(self.out / "last.pt", self.mode, self.parts(), self.total_epochs * self.steps_per_epoch,
                             self.say) if self.resume else RunState())
        if self.state.epoch:
            self.metrics.load(self.state.epoch)
            self.say(f"resuming after epoch {self.state.epoch} (best mean Dice {self.state.best})")
        opts = self.opts
        cache = "off" if not opts.cache else ("disk" if opts.persistent else ("device" if opts.cache_on_device else "RAM"))
        self.say(f"{self.mode} mode on {self.ctx.device} x{self.ctx.world_size}: {self.split_note}; cache {cache}"
                 f"{' (' + opts.cache_note + ')' if opts.cache_note else ''}, "
                 f"{'ThreadDataLoader' if opts.thread_loader else f'DataLoader({opts.num_workers} workers)'}, "
                 f"{self.precision.line()}, {self.steps_per_epoch} steps/epoch of "
                 f"{self.plan.batch} patches, lr {self._base_lr():.3g}"
                 f"{f' (ramp over {self.plan.warmup_steps} steps)' if self.plan.warmup_steps else ''}")
        monitor = GpuMonitor(self.out / "gpu_monitor.csv", self.ctx.device, opts.gpu_monitor_interval_s)
        if self.ctx.is_main and opts.gpu_monitor:
            monitor.start()
        stopped, epoch, t_loop = "epochs", self.state.epoch, time.monotonic()
        try:
            for epoch in range(self.state.epoch + 1, self.total_epochs + 1):
                row = train_epoch(self, epoch)
                over = self.max_time is not None and time.monotonic() - self.t_start >= self.max_time
                time_up = broadcast_flag(self.ctx, over)
                row.update(val_s=0.0, mean_dice=None, val_peak_bytes=None, val_peak_allocated_bytes=None)
                if epoch % self.val_every == 0 or epoch == self.total_epochs or time_up:
                    validate(self, row)
                row["epoch_s"] = row["train_s"] + row["val_s"]
                row["elapsed_s"] = self.elapsed()
                if self.ctx.is_main:
                    save_checkpoint(self.out / "last.pt", self.checkpoint(epoch))
                    self.metrics.add(row, {"mode": self.mode, "precision": self.precision.name, "world_size": self.ctx.world_size,
                                           "split": self.split_note, "options": asdict(opts),
                                           "memory": self.memory_report()})
                    if row["mean_dice"] is not None or epoch == self.total_epochs:
                        plot_curves(self.metrics.rows, self.out / "curves.png", f"{self.cfg['algo']} {self.mode}")
                self.say(epoch_line(row, self.total_epochs, self.state.best, self.state.best_epoch))
                if time_up:
                    stopped = "max_time"
                    break
                if self.patience and self.state.stale >= self.patience:
                    stopped = "early_stop"
                    self.say(f"early stop: no better validation Dice in {self.state.stale} validations")
                    break
            if self.ctx.is_main and self.metrics.rows:
                plot_curves(self.metrics.rows, self.out / "curves.png", f"{self.cfg['algo']} {self.mode}")
        except Exception as exc:
            oom = out_of_memory_error(exc, self.cfg, self.memory_limit, self.phase, epoch, self.out / "last.pt")
            if oom is None:
                raise
            raise oom from exc
        finally:
            monitor.stop()
            self.nvtx.detach()
        summary = {
            "bundle": self.cfg["bundle_root"], "mode": self.mode, "device": self.ctx.device,
            "world_size": self.ctx.world_size, "first_epoch": self.state.epoch + 1, "last_epoch": epoch,
            "epochs_run": epoch - self.state.epoch, "stopped": stopped, "best_metric": self.state.best,
            "best_epoch": self.state.best_epoch, "precision": self.precision.name,
            "precision_reason": self.precision.reason, "seconds": time.monotonic() - t_loop, "split": self.split_note,
            "train_cases_per_rank": self.num_train_cases, "model_dir": str(self.out),
            **{k: str(self.out / f) for k, f in (("best_checkpoint", "best.pt"), ("last_checkpoint", "last.pt"),
                                                  ("metrics_csv", "metrics.csv"), ("metrics_json", "metrics.json"),
                                                  ("curves", "curves.png"))},
            "gpu_monitor": str(monitor.path) if monitor.samples else None,
            **self.memory_report(),
        }
        if self.ctx.is_main:
            atomic_write_json(self.out / "train_summary.json", summary)
            self.say(f"done: {summary['epochs_run']} epochs ({stopped}), best mean Dice "
                     f"{fmt(self.state.best)} at epoch {self.state.best_epoch}; outputs in {self.out}")
        barrier(self.ctx)
        return summary


def _seed_everything(seed: int) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)

