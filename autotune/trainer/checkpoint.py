"""Checkpoints: atomic writes, safe loads, and putting a run back where it stopped.

A checkpoint is a dict of plain data and tensors (model, optimizer, GradScaler and
schedule state, epoch, best metric, RNG states, the network and fold it trains; ``checkpoint_state``),
written through ``autotune.files.atomic_save_torch`` (temp file, fsync, rename; a full disk is one line)
and read back once with ``weights_only=True`` into a typed ``Checkpoint``
(``read_checkpoint``; ``autotune.trainer.checkpoint_model``): a folder, an unreadable file, bare weights
or a wrong value is refused in one line naming the file and what to do. ``--resume`` checks the checkpoint
before anything is written (``check_resume``) and loads it into the run (``resume``). ``RunState`` is where a
run stands between epochs; a run stopped by a signal inside an epoch also saves how far that epoch got
(``partial``: an ``EpochProgress`` as plain data), and ``--resume`` continues from there.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import ConfigError
from autotune.files import atomic_save_torch

if TYPE_CHECKING:
    from autotune.bundles.model import BundleConfig
    from autotune.trainer.checkpoint_model import Checkpoint

__all__ = ["RunState", "save_checkpoint", "read_checkpoint", "parse_checkpoint", "check_resumable", "check_resume", "check_outputs",
           "OUTPUTS", "RESUME_FIX", "rng_state", "set_rng_state", "fit_schedule", "restore", "checkpoint_state",
           "resume"]


@dataclass
class RunState:
    """Where a training run stands: the last finished epoch, the best validation Dice so far and
    its epoch, validations since it last improved, seconds trained before this process, and how
    far the next epoch got when a signal stopped it (``EpochProgress.as_dict``; None otherwise), and the
    out-of-memory step-downs in force (``autotune.trainer.fallback.MemoryFallbacks.state``; None: none saved)."""

    epoch: int = 0
    best: float | None = None
    best_epoch: int = 0
    stale: int = 0
    elapsed_before: float = 0.0
    partial: dict[str, Any] | None = None
    fallbacks: dict[str, Any] | None = None

    def validated(self, mean: float | None, epoch: int) -> bool:
        """Count one validation; True when ``mean`` is a new best (then ``best.pt`` is due)."""
        if mean is not None and (self.best is None or mean > self.best):
            self.best, self.best_epoch, self.stale = mean, epoch, 0
            return True
        self.stale += 1
        return False


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically: never a half-written file, the old one kept on failure.

    Raises:
        HostWriteError: the host refused the write (no space, quota, read-only, permission).
    """
    atomic_save_torch(path, state, what="the checkpoint")


RESUME_FIX = "move it away, or train without --resume to start over"


def _first_line(exc: BaseException) -> str:
    """``exc`` in a few words: its type and its first sentence (for a ``weights_only`` refusal, torch's reason)."""
    text = str(exc)
    marker = "WeightsUnpickler error:"
    if marker in text:  # torch's advice comes first; the reason after the marker
        text = text.split(marker, 1)[1]
    line = next((part.strip() for part in text.splitlines() if part.strip()), "").split(". ")[0]
    line = line if len(line) <= 120 else line[:117] + "..."
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def _no_header(data: Any) -> str:
    """What a loaded file that is not a checkpoint holds, in words ('' when it may be one)."""
    import torch

    from autotune.trainer.checkpoint_model import HEADER_KEYS

    if not isinstance(data, Mapping) or HEADER_KEYS & set(data):
        return ""
    if data and all(isinstance(value, torch.Tensor) for value in data.values()):
        return f"bare weights (a state_dict of {len(data)} tensors)"
    return "a mapping"


def read_checkpoint(path: Path, fix: str = RESUME_FIX, *, mmap: bool = False) -> Checkpoint:
    """``path`` loaded once with ``weights_only=True`` (plain data and tensors only, no pickled objects) and
    parsed into a ``Checkpoint``; ``mmap`` maps the tensors instead of reading them (a check of the header).

    Raises:
        ConfigError: one line naming ``path``, what is wrong (a folder, not found, unreadable, bare weights, a
            key's value) and ``fix``.
    """
    import torch

    if path.is_dir():
        raise ConfigError(f"{path}: a folder, not a checkpoint; move it away (a run writes its checkpoint there)")
    if not path.is_file():
        what = "not a file" if os.path.lexists(path) else "not found"
        raise ConfigError(f"{path}: {what}; {fix}")
    try:
        with open(path, "rb") as handle:  # torch maps only its zip format; any other file is read (and refused)
            mmap = mmap and handle.read(4) == b"PK\x03\x04"
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # whatever the file holds: an unreadable file is one line
        raise ConfigError(f"{path}: unreadable checkpoint ({_first_line(exc)}); {fix}") from exc
    return parse_checkpoint(data, path, fix)


def parse_checkpoint(data: Any, path: Path, fix: str = RESUME_FIX) -> Checkpoint:
    """``data`` (what ``torch.load`` gave for ``path``) as a ``Checkpoint``.

    Raises:
        ConfigError: one line naming ``path``, the key and its value (or that it holds no checkpoint), and ``fix``.
    """
    from autotune.checks.typed import parse
    from autotune.trainer.checkpoint_model import Checkpoint

    other = _no_header(data)
    if other:
        raise ConfigError(f"{path}: {other} without a checkpoint's header (mode, epoch, best_metric, algo, network, "
                          f"optimizer): not a checkpoint a run continues from; {fix}")
    try:
        return parse(Checkpoint, data, str(path), fix=fix)
    except ConfigError as exc:  # a checker's refusal is said without the fix: add it
        line = str(exc)
        raise ConfigError(line if line.endswith(fix) else f"{line}; {fix}") from None


def _refuse_other_mode(checkpoint: Checkpoint, path: Path, mode: str) -> None:
    if checkpoint.mode != mode:
        raise ConfigError(f"{path} was trained in {checkpoint.mode} mode; resume with --mode {checkpoint.mode} (or "
                          f"move it away to train in {mode} mode from the start)")


def check_resumable(checkpoint: Checkpoint, path: Path, mode: str, config: BundleConfig) -> None:
    """Refuse to continue from ``checkpoint`` (read from ``path``) in ``mode`` with the bundle ``config``
    (``BundleConfig``): another mode, another network, another fold.

    Raises:
        ConfigError: one line naming ``path`` and what to do.
    """
    _refuse_other_mode(checkpoint, path, mode)
    if (checkpoint.algo, checkpoint.network) != (config.algo, config.network.name):
        raise ConfigError(f"{path} is a checkpoint of {checkpoint.signature()}, this bundle trains {config.algo} "
                          f"{config.network.name}; {RESUME_FIX}")
    if checkpoint.fold is not None and checkpoint.fold != config.fold:
        raise ConfigError(f"{path} was trained on fold {checkpoint.fold}, this bundle trains fold {config.fold}; "
                          f"{RESUME_FIX}")


def check_resume(path: Path, mode: str, config: BundleConfig) -> Checkpoint | None:
    """Before anything is written: the checkpoint ``--resume`` continues from (its header; the tensors mapped,
    not read), checked against the run; None when there is none (the run starts at epoch 1).

    Raises:
        ConfigError: a folder, an unreadable file, no checkpoint's header, a wrong value, or another run's.
    """
    if not os.path.lexists(path):
        return None
    checkpoint = read_checkpoint(path, mmap=True)
    check_resumable(checkpoint, path, mode, config)
    return checkpoint


OUTPUTS = ("best.pt", "last.pt", "metrics.csv", "metrics.json", "curves.png", "train_summary.json", "gpu_monitor.csv")


def check_outputs(folder: Path) -> None:
    """Refuse, before anything is trained, a run whose outputs (``OUTPUTS`` in ``folder``) a folder stands in
    the way of: its first write there would fail after an epoch's work.

    Raises:
        ConfigError: one line naming the path.
    """
    from autotune.files import IN_THE_WAY_FIX, in_the_way

    for name in OUTPUTS:
        reason = in_the_way(folder / name)
        if reason:
            raise ConfigError(f"{folder / name}: {reason}, where the run writes its {name}; {IN_THE_WAY_FIX}, then "
                              "run the same command again")


def rng_state(device: str | None = None) -> dict[str, Any]:
    """torch, NumPy and Python RNG states as plain data (loadable with ``weights_only=True``), and the
    CUDA generator's of ``device`` when it is a GPU."""
    import numpy as np
    import torch

    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "numpy": [name, keys.tolist(), pos, has_gauss, cached],
             "python": random.getstate()}
    if device is not None and str(device).startswith("cuda"):
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: str | None = None) -> None:
    """Put back what ``rng_state`` saved (the CUDA generator's on ``device`` when saved and a GPU)."""
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if state.get("cuda") is not None and device is not None and str(device).startswith("cuda"):
        torch.cuda.set_rng_state(state["cuda"], device)


def fit_schedule(scheduler: Any, total_steps: int) -> None:
    """After loading a schedule's state, stretch it to this run's length (``--epochs`` may differ)."""
    from autotune.schedule import fitted_schedule_of

    factor = fitted_schedule_of(scheduler)
    if factor is not None:
        factor.refit(total_steps)
    for attr in ("t_total", "T_max", "total_iters"):
        if hasattr(scheduler, attr):
            setattr(scheduler, attr, total_steps)


def _schedule_state(scheduler: Any, saved: dict[str, Any]) -> dict[str, Any]:
    """``saved`` as ``scheduler`` loads it: a checkpoint written when the schedule was MONAI's or PyTorch's own
    object (no ``lr_lambdas``) keeps its step count, and the closed form takes over from there."""
    if hasattr(scheduler, "lr_lambdas") and "lr_lambdas" not in saved:
        return {"last_epoch": saved.get("last_epoch", 0), "base_lrs": saved.get("base_lrs", scheduler.base_lrs),
                "_step_count": saved.get("_step_count", 1), "_last_lr": saved.get("_last_lr", scheduler.get_last_lr()),
                "lr_lambdas": [None] * len(scheduler.lr_lambdas)}
    return saved


def restore(path: Path, mode: str, model: Any, optimizer: Any, scaler: Any, scheduler: Any,
            total_steps: int | None) -> Checkpoint:
    """Load ``path`` into the model, optimizer, scaler and schedule; set the RNG states; return the checkpoint.
    The schedule is stretched to ``total_steps``; None keeps the length the checkpoint planned.

    Raises:
        ConfigError: unreadable, not a checkpoint, from the other mode, or not this bundle's network/optimizer.
    """
    checkpoint = read_checkpoint(path)
    _refuse_other_mode(checkpoint, path, mode)
    try:
        model.load_state_dict(checkpoint.model)
        optimizer.load_state_dict(checkpoint.optimizer)
        if scaler is not None and checkpoint.scaler:
            scaler.load_state_dict(checkpoint.scaler)
        if scheduler is not None and checkpoint.scheduler:
            scheduler.load_state_dict(_schedule_state(scheduler, dict(checkpoint.scheduler)))
            if total_steps is not None:
                fit_schedule(scheduler, total_steps)
    except (RuntimeError, KeyError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise ConfigError(f"{path} does not match this bundle's network or optimizer ({_first_line(exc)}); "
                          f"{RESUME_FIX}") from exc
    if checkpoint.rng:
        set_rng_state(checkpoint.rng)
    return checkpoint


def checkpoint_state(parts: Mapping[str, Any], state: RunState, epoch: int, *, mode: str, elapsed_s: float,
                     total_steps: int, config: BundleConfig, partial: dict[str, Any] | None = None) -> dict[str, Any]:
    """What ``save_checkpoint`` writes after ``epoch``: ``parts`` (``model``, ``optimizer``, ``scaler``,
    ``scheduler``; the last two may be None) as state dicts, ``state``, the RNG states, which network of which
    fold trains (``config``), and ``partial``: how far epoch ``epoch + 1`` got when a signal
    stopped it. ``read_checkpoint`` reads it back as a ``Checkpoint``."""
    return {
        "partial": partial,
        **{name: (parts[name].state_dict() if parts[name] is not None else None)
           for name in ("model", "optimizer", "scaler", "scheduler")},
        "epoch": epoch, "best_metric": state.best, "best_epoch": state.best_epoch,
        "stale_validations": state.stale, "mode": mode, "elapsed_s": elapsed_s,
        "total_steps": total_steps, "rng": rng_state(), "algo": config.algo, "network": config.network.name,
        "fold": config.fold,
    }


def resume(path: Path, mode: str, parts: Mapping[str, Any], total_steps: int | None,
           say: Callable[[str], None]) -> RunState:
    """The ``RunState`` saved in ``path`` with ``parts`` loaded from it (see ``restore``); a fresh one,
    said in a line, when there is no checkpoint (nothing at ``path``: a folder or any other file there is refused).

    Raises:
        ConfigError: as ``restore``.
    """
    if not os.path.lexists(path):
        say(f"no checkpoint {path} to resume from; starting at epoch 1")
        return RunState()
    saved = restore(path, mode, parts["model"], parts["optimizer"], parts["scaler"], parts["scheduler"], total_steps)
    return RunState(epoch=saved.epoch, best=saved.best_metric, best_epoch=saved.best_epoch,
                    stale=saved.stale_validations, elapsed_before=saved.elapsed_s,
                    partial=saved.partial.as_dict() if saved.partial is not None else None,
                    fallbacks=dict(saved.memory_fallbacks) if saved.memory_fallbacks is not None else None)
