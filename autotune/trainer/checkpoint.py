"""Checkpoints: atomic writes, safe loads, and putting a run back where it stopped.

A checkpoint is a dict of plain data and tensors (model, optimizer, GradScaler and
schedule state, epoch, best metric, RNG states; ``checkpoint_state``), written through
``autotune.files.atomic_save_torch`` (temp file, fsync, rename; a full disk is one line)
and read back with ``weights_only=True`` (``resume``). ``RunState`` is where a run stands
between epochs; a run stopped by a signal inside an epoch also saves how far that epoch got
(``partial``: an ``EpochProgress`` as plain data), and ``--resume`` continues from there.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError
from autotune.files import atomic_save_torch

__all__ = ["RunState", "save_checkpoint", "load_checkpoint", "rng_state", "set_rng_state", "fit_schedule", "restore",
           "checkpoint_state", "resume"]


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


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True`` (plain data and tensors only, no pickled objects)."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ConfigError(f"{path}: unreadable checkpoint ({type(exc).__name__}); delete it or train without --resume") from exc


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
            total_steps: int | None) -> dict[str, Any]:
    """Load ``path`` into the model, optimizer, scaler and schedule; set the RNG states; return the checkpoint.
    The schedule is stretched to ``total_steps``; None keeps the length the checkpoint planned.

    Raises:
        ConfigError: unreadable, from the other mode, or not this bundle's network/optimizer.
    """
    state = load_checkpoint(path)
    if state.get("mode") != mode:
        raise ConfigError(f"{path} was trained in {state.get('mode')} mode; resume with --mode {state.get('mode')}")
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        if scheduler is not None and state.get("scheduler"):
            scheduler.load_state_dict(_schedule_state(scheduler, dict(state["scheduler"])))
            if total_steps is not None:
                fit_schedule(scheduler, total_steps)
    except (RuntimeError, KeyError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{path} does not match this bundle's network or optimizer ({first}); "
                          "train without --resume") from exc
    if state.get("rng"):
        set_rng_state(state["rng"])
    return state


def checkpoint_state(parts: Mapping[str, Any], state: RunState, epoch: int, *, mode: str, elapsed_s: float,
                     total_steps: int, cfg: Mapping[str, Any], partial: dict[str, Any] | None = None) -> dict[str, Any]:
    """What ``save_checkpoint`` writes after ``epoch``: ``parts`` (``model``, ``optimizer``, ``scaler``,
    ``scheduler``; the last two may be None) as state dicts, ``state``, the RNG states, and ``partial``:
    how far epoch ``epoch + 1`` got when a signal stopped it."""
    return {
        "partial": partial,
        **{name: (parts[name].state_dict() if parts[name] is not None else None)
           for name in ("model", "optimizer", "scaler", "scheduler")},
        "epoch": epoch, "best_metric": state.best, "best_epoch": state.best_epoch,
        "stale_validations": state.stale, "mode": mode, "elapsed_s": elapsed_s,
        "total_steps": total_steps, "rng": rng_state(), "algo": cfg["algo"], "network": cfg["network"]["name"],
    }


def resume(path: Path, mode: str, parts: Mapping[str, Any], total_steps: int | None,
           say: Callable[[str], None]) -> RunState:
    """The ``RunState`` saved in ``path`` with ``parts`` loaded from it (see ``restore``); a fresh one,
    said in a line, when there is no checkpoint.

    Raises:
        ConfigError: as ``restore``.
    """
    if not path.is_file():
        say(f"no checkpoint {path} to resume from; starting at epoch 1")
        return RunState()
    saved = restore(path, mode, parts["model"], parts["optimizer"], parts["scaler"], parts["scheduler"], total_steps)
    return RunState(epoch=int(saved["epoch"]), best=saved.get("best_metric"), best_epoch=int(saved.get("best_epoch", 0)),
                    stale=int(saved.get("stale_validations", 0)), elapsed_before=float(saved.get("elapsed_s", 0.0)),
                    partial=saved.get("partial"), fallbacks=saved.get("memory_fallbacks"))
