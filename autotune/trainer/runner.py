"""The training runner: the arguments, the processes, and the run (``autotune.trainer.training_run.TrainingRun``,
which builds the data and the model, runs the epochs and writes the checkpoints, metrics and summary).

``train`` is the entry point for the CLI and for Python. With ``nproc > 1`` it spawns that many processes
(see ``autotune.trainer.ddp``); each runs ``run_worker``, which restarts the run once from a checkpoint when an
out-of-memory asks for it (``autotune.trainer.fallback.RestartRun``). Outputs go to
``BUNDLE/model_fold<k>/``: ``best.pt``, ``last.pt``, ``metrics.csv``, ``metrics.json``,
``curves.png``, ``train_summary.json`` and, on a GPU, ``gpu_monitor.csv``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from autotune.checks import duration, integer
from autotune.errors import ConfigError, SpecError
from autotune.trainer.fallback import RestartRun
from autotune.trainer.memory import training_limit
from autotune.trainer.training_run import TrainingRun
from autotune.utils import read_json

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

__all__ = ["train", "run_worker", "parse_duration", "TrainingRun"]


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
        resume: continue from ``last.pt`` (starts fresh, with a warning, when there is none); it is checked
            before anything is written, and one that cannot be read is refused.
        mode: ``fast`` (cache, thread loader, AMP, template recipe) or ``regular`` (the seed's baseline).
        nproc: processes for DistributedDataParallel (ignored when started by torchrun).
        progress: show progress bars and one line per epoch.

    Only one run of a bundle's fold trains at a time: the model folder's lock (``autotune.trainer.lock``) is held
    from before the first write to the end; a second run is refused.

    Raises:
        ConfigError: a bad bundle or checkpoint; another run of the bundle is training. SpecError: bad arguments
            or device.
        DataError / InputError: unusable data.
    """
    from autotune.bundles.config import load_bundle_config
    from autotune.device import resolve_device
    from autotune.trainer.data import resolve_options

    device = resolve_device(device)
    _check_args(epochs, max_time, val_every, nproc)
    config = load_bundle_config(bundle)  # fail here, in one process, on a bad bundle
    _ = config.tuned  # and on a batch stated inconsistently (autotune.bundles.tuned)
    _check_trained_here(bundle, config, memory_limit)
    _check_data(bundle, config)
    resolve_options(config, mode, "cpu")
    _check_device(device, nproc)
    limit = training_limit(config, device, memory_limit)
    kwargs = dict(bundle=str(bundle), device=device, epochs=epochs, max_time=max_time, val_every=val_every,
                  resume=resume, mode=mode, progress=progress, memory_limit=limit)
    return _train_holding_the_lock(bundle, config, nproc, kwargs)


def _train_holding_the_lock(bundle: str | os.PathLike[str], config: BundleConfig, nproc: int, kwargs: dict[str, Any]
                            ) -> dict[str, Any]:
    """Train (``run_worker`` here, or in ``nproc`` spawned ranks) holding the lock of the bundle's model folder
    (``autotune.trainer.lock``), having checked, before anything is written, the checkpoint ``--resume`` continues
    from and that no folder stands where an output goes. Returns the run's summary.

    Raises:
        ConfigError: another run holds the lock; the checkpoint or an output's place is refused; the spawned ranks
            ended without writing their summary.
    """
    from autotune.trainer.checkpoint import check_outputs, check_resume
    from autotune.trainer.infer import model_dir
    from autotune.trainer.lock import training_lock

    out = model_dir(config)
    with training_lock(out, str(bundle)):
        if kwargs["resume"]:
            check_resume(out / "last.pt", kwargs["mode"], config)
        check_outputs(out)
        if nproc > 1 and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            from autotune.trainer.ddp import spawn

            summary = out / "train_summary.json"
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


def _check_data(bundle: str | os.PathLike[str], config: BundleConfig) -> None:
    """The fold's cases (training and validation) against the bundle, before anything is built or written:
    the images' channels and axes, the labels' grid and values (``autotune.data.bundle_fit``).

    Raises:
        ConfigError / DataError: no datalist, a fold without cases, or a case the bundle cannot take.
    """
    from autotune.bundles.config import bundle_config_path
    from autotune.data.bundle_fit import check_cases_fit
    from autotune.data.split import split_datalist

    train_cases, val_cases, _note = split_datalist(config)
    check_cases_fit(config, [*train_cases, *val_cases], bundle_config_path(bundle))


def _check_trained_here(bundle: str | os.PathLike[str], config: BundleConfig, memory_limit: Any) -> None:
    """Refuse a bundle its template family trains with its own command (``autotune.families``), naming it.

    Raises:
        ConfigError: one line with the command that trains the bundle.
    """
    import shlex

    from autotune.families import family_for

    family = family_for(config)
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
