"""How a training run ends on a fault, in one line that says what was kept and what to run.

A stop signal (``TrainingStopped``, exit 128 + the signal's number) and a write the host
refused (``HostWriteError``, exit 4) both name ``last.pt`` and what it holds, and the
``autotune train ... --resume`` command that continues the run. A run that diverged
(``TrainingDiverged``, exit 5) names the checkpoints kept and what to try.
"""

from __future__ import annotations

import math
import os
import shlex
import signal
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.errors import HostWriteError, TrainingDiverged, TrainingStopped
from autotune.files import IN_THE_WAY_FIX, host_refusal, refused
from autotune.finite import NonFiniteSteps

__all__ = ["continue_command", "holds", "stop_error", "write_refusal", "kept_files", "with_kept", "continue_from",
           "skipped", "overflowed", "diverged_error", "run_diverged", "run_fault"]


def continue_command(bundle_root: str, total_epochs: int, mode: str, world_size: int, resume: bool = True,
                     max_time_left: float | None = None) -> str:
    """The ``autotune train`` command that continues (``resume``) or restarts a run (under torchrun, the
    torchrun command with its own options left as ``...``); a run whose schedule its time budget sets
    continues with the time it had left (``max_time_left`` seconds), else to its epoch count."""
    length = (["--max-time", f"{max(1, math.ceil(max_time_left))}s"] if max_time_left is not None
              else ["--epochs", str(total_epochs)])
    options = [*(["--resume"] if resume else []), *length, *(["--mode", mode] if mode != "fast" else [])]
    if "TORCHELASTIC_RUN_ID" in os.environ:
        launcher = os.environ.get("AUTOTUNE_LAUNCHER") or "torchrun"  # set by autotune.trainer.torchrun
        return f"{launcher} ... -m autotune.trainer {shlex.join([str(bundle_root), *options])}"
    return shlex.join(["autotune", "train", str(bundle_root), *options,
                       *(["--nproc", str(world_size)] if world_size > 1 else [])])


def holds(epoch: int, partial: Mapping[str, Any] | None, batches_per_epoch: int) -> str:
    """What a checkpoint after ``epoch`` (with ``partial``: how far the next epoch got) holds, in words."""
    if partial and int(partial.get("batches", 0)):
        return f"epoch {epoch + 1} up to batch {partial['batches']} of {batches_per_epoch}"
    return f"epoch {epoch}"


def stop_error(signum: int, where: str, last: Path, kept: str, command: str) -> TrainingStopped:
    """The line a run stopped by ``signum`` ends with; its exit code is the shell's, 128 + ``signum``."""
    return TrainingStopped(f"{signal.Signals(signum).name} received: stopped {where}; {last} holds {kept}; "
                           f"continue with '{command}'", exit_code=128 + int(signum))


def write_refusal(exc: BaseException, cache_dir: Path) -> HostWriteError | None:
    """``exc`` as a refused write: itself when a ``HostWriteError``, or the disk cache's own write
    (MONAI's ``PersistentDataset``, through the system temp folder) that the host refused; else None."""
    if isinstance(exc, HostWriteError):
        return exc
    cause = host_refusal(exc, (cache_dir, tempfile.gettempdir()))
    return refused(cause, "the disk cache (PersistentDataset) in", cache_dir) if cause is not None else None


def kept_files(out: Path, kept: str, best_saved: int) -> str:
    """The checkpoints kept in ``out`` in words (``last.pt`` holding ``kept``, ``best.pt`` of epoch
    ``best_saved``, 0 for none); '' for none."""
    names = [f"{out / 'last.pt'} ({kept})"] if kept else []
    if best_saved and (out / "best.pt").is_file():
        names.append(f"{out / 'best.pt'} (epoch {best_saved})")
    return ", ".join(names)


def with_kept(refusal: HostWriteError, out: Path, kept: str, best_saved: int, command: str) -> HostWriteError:
    """``refusal`` naming the checkpoints kept in ``out`` (see ``kept_files``) and ``command``, to run once
    space is freed (or the folder in the file's way moved)."""
    fix = IN_THE_WAY_FIX if refusal.then.startswith(IN_THE_WAY_FIX) else "free space"
    return refusal.with_outcome(kept=kept_files(out, kept, best_saved), then=f"{fix}, then run '{command}'")


def continue_from(run: Any) -> str:
    """What a line that ends a ``TrainingRun`` says to continue it: ``last.pt`` and what it holds with the
    ``--resume`` command when a checkpoint was written, else that none was and the command that starts again."""
    if run.kept:
        return f"{run.out / 'last.pt'} holds {run.kept}; continue with '{run.continue_command()}'"
    return f"no checkpoint was written; start again with '{run.continue_command(resume=False)}'"


def skipped(exc: NonFiniteSteps, steps_per_epoch: int, world_size: int) -> str:
    """What the steps a run skipped in a row held, and where it stopped (for ``diverged_error``)."""
    steps = f"{steps_per_epoch}" if world_size == 1 else f"{steps_per_epoch} on each rank"
    first = f"; first non-finite: {exc.first}" if exc.first else ""
    return (f"{exc.reason} in {exc.in_a_row} steps in a row, none applied to the weights; stopped in epoch "
            f"{exc.epoch} at step {exc.step} of {steps}{first}")


def overflowed(epoch: int, broken: list[str]) -> str:
    """The weights an applied step left non-finite in ``epoch`` (``broken``: their names), in words."""
    more = ", ..." if len(broken) > 3 else ""
    return f"the weights became non-finite in epoch {epoch} ({', '.join(broken[:3])}{more}): a finite step overflowed them"


def diverged_error(what: str, precision: str, kept: str, resume_command: str, fresh_command: str,
                   learning_rate: float, bundle_root: str) -> TrainingDiverged:
    """The line a diverged run ends with (exit code 5): ``what`` happened and where, the precision, the
    checkpoints ``kept`` (``kept_files``) and what to try: fp32 first when the run autocasts, a lower
    learning rate in a fresh run (``--resume`` would take the optimizer's learning rate from the checkpoint)."""
    from autotune.bundles.config import CONFIG_RELPATH

    config = Path(bundle_root) / CONFIG_RELPATH
    lower = f"a lower learning_rate (now {learning_rate:g}) in {config} and a fresh run ('{fresh_command}')"
    if precision != "fp32":
        resume = f"{resume_command} --precision fp32" if kept else f"{fresh_command} --precision fp32"
        advice = f"fp32 ('{resume}'), or {lower}"
    else:
        advice = f"{lower}, or check the data"
    return TrainingDiverged(f"{what} (precision {precision}); kept: {kept or 'nothing'}; try {advice}")


def run_diverged(run: Any, what: str) -> TrainingDiverged:
    """The line of a ``TrainingRun`` that diverged (``what``: where and how), with what was kept and what to try."""
    group = run.recipe.optimizer.param_groups[0]
    return diverged_error(what, run.recipe.precision.name, kept_files(run.out, run.kept, run.best_saved),
                          run.continue_command(), run.continue_command(resume=False),
                          float(group.get("initial_lr", group["lr"])), run.config.bundle_root)


def run_fault(run: Any, exc: Exception) -> Exception | None:
    """The one-line error a ``TrainingRun`` ends with for ``exc``: out of memory with nothing left to step down to
    (what was tried), a write the host refused (with what was kept), steps that stayed non-finite; None to let
    ``exc`` through."""
    from autotune.trainer.memory import out_of_memory_error

    if isinstance(exc, (TrainingStopped, TrainingDiverged)):
        return None
    if isinstance(exc, NonFiniteSteps):
        return run_diverged(run, skipped(exc, run.steps_per_epoch, run.ctx.world_size))
    oom = out_of_memory_error(exc, run.config, run.memory_limit, run.memory.phase, run.epoch, continue_from(run))
    refusal = write_refusal(exc, run.data.opts.cache_dir) if oom is None else None
    if refusal is None:
        return oom
    return with_kept(refusal, run.out, run.kept, run.best_saved, run.continue_command(bool(run.kept)))
