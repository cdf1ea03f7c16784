"""A checkpoint as a typed model: ``Checkpoint``, what ``last.pt`` and ``best.pt`` must hold to be trained on from.

``autotune.trainer.checkpoint.read_checkpoint`` loads the file (``weights_only=True``) and parses it here once;
nothing after that reads the loaded dict. The header says where the run stood (``mode`` fast or regular, the
finished ``epoch`` >= 0, the ``best_metric`` finite or None and its epoch, the validations since, the seconds
trained, the schedule's steps), which run it is (``algo`` and ``network``: the network's signature; ``fold``:
the bundle's split), and how far a stopped epoch got (``partial``, an ``EpochPartial``). The state dicts
(``model``, ``optimizer``; ``scaler`` and ``scheduler`` may be None) must be mappings; the tensors in them are
checked when they are loaded into the network (``autotune.trainer.checkpoint.restore``).

This module imports pydantic (``autotune.checks.typed``); the trainer imports it only when it reads a checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import model_validator

from autotune.checks import Flag, Integer, Number, Text
from autotune.checks.typed import Checked, FileModel, refuse_key
from autotune.checks.values import Error, refuse

__all__ = ["Checkpoint", "EpochPartial", "HEADER_KEYS"]

_MANY = 10**12  # a count no run reaches (epochs, steps, samples)
Count = Annotated[int, Checked(Integer(0, _MANY))]
Seconds = Annotated[float, Checked(Number(0.0))]
_NUMPY_KEYS = 624  # a Mersenne Twister's state: 624 words (NumPy), 625 with the position (Python)


def _mapping(value: Any, where: str, error: Error) -> Any:
    """A state dict: any mapping (torch's ``OrderedDict`` with its ``_metadata`` kept as it is)."""
    if not isinstance(value, Mapping):
        refuse(error, where, value, "must be a mapping (a state_dict)")
    return value


def _byte_tensor(value: Any, where: str, error: Error) -> Any:
    import torch

    if not (isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1):
        refuse(error, where, value, "must be a generator's state (a 1-D uint8 tensor)")
    return value


def _words(value: Any, length: int) -> bool:
    return (isinstance(value, Sequence) and not isinstance(value, str) and len(value) == length
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value))


def _rng_states(value: Any, where: str, error: Error) -> Any:
    """What ``autotune.trainer.checkpoint.rng_state`` writes: torch's generator state, NumPy's
    ``[name, keys, pos, has_gauss, cached]`` and Python's ``(version, internal, gauss)`` (``cuda``: optional)."""
    rule = "must be the RNG states a checkpoint holds (torch, numpy, python; cuda optional)"
    if not (isinstance(value, Mapping) and {"torch", "numpy", "python"} <= set(value)
            and set(value) <= {"torch", "numpy", "python", "cuda"}):
        refuse(error, where, value, rule)
    numpy, python = value["numpy"], value["python"]
    if not (isinstance(numpy, Sequence) and len(numpy) == 5 and isinstance(numpy[0], str)
            and _words(numpy[1], _NUMPY_KEYS)):
        refuse(error, where, numpy, f"{rule}: numpy as [name, 624 keys, pos, has_gauss, cached]")
    if not (isinstance(python, Sequence) and len(python) == 3 and _words(python[1], _NUMPY_KEYS + 1)):
        refuse(error, where, python, f"{rule}: python as (version, 625 words, gauss)")
    _byte_tensor(value["torch"], where, error)
    if value.get("cuda") is not None:
        _byte_tensor(value["cuda"], where, error)
    return value


StateDict = Annotated[Any, Checked(_mapping)]
RngStates = Annotated[Any, Checked(_rng_states)]


class EpochPartial(FileModel):
    """How far a stopped epoch got (``autotune.trainer.epoch.EpochProgress.as_dict``) and each rank's
    batches (``rank_batches``)."""

    epoch: Annotated[int, Checked(Integer(1, _MANY))]
    batches: Count = 0
    loss_sum: Annotated[float, Checked(Number())] = 0.0
    passes: Count = 0
    skipped: Count = 0
    samples: Count = 0
    data_wait_s: Seconds = 0.0
    train_s: Seconds = 0.0
    h2d_s: Seconds = 0.0
    compute_s: Seconds = 0.0
    scaler_skipped: Count = 0
    batch_passes: Count = 0
    rng: RngStates | None = None
    complete: Annotated[bool, Checked(Flag())] = False
    rank_batches: list[Count]

    def as_dict(self) -> dict[str, Any]:
        """Plain data, as ``EpochProgress.from_dict`` and a checkpoint take it."""
        return {name: (list(value) if isinstance(value, list) else value) for name, value in self}


class Checkpoint(FileModel):
    """``last.pt`` or ``best.pt``, checked (see the module docstring)."""

    mode: Literal["fast", "regular"]
    epoch: Count
    best_metric: Annotated[float, Checked(Number(0.0))] | None = None
    best_epoch: Count = 0
    stale_validations: Count = 0
    elapsed_s: Seconds = 0.0
    total_steps: Count | None = None
    algo: Annotated[str, Checked(Text())]
    network: Annotated[str, Checked(Text())]
    fold: Annotated[int, Checked(Integer(0, 99))] | None = None
    model: StateDict
    optimizer: StateDict
    scaler: StateDict | None = None
    scheduler: StateDict | None = None
    rng: RngStates | None = None
    partial: EpochPartial | None = None
    memory_fallbacks: StateDict | None = None  # parsed by autotune.trainer.fallback.MemoryFallbacks.load

    @model_validator(mode="after")
    def _in_order(self) -> Checkpoint:
        if self.best_epoch > self.epoch:
            refuse_key("best_epoch", f"got {self.best_epoch}; must be at most the epoch it holds ({self.epoch})")
        if self.partial is not None and self.partial.epoch != self.epoch + 1:
            refuse_key("partial.epoch", f"got {self.partial.epoch}; must be the epoch after the one it holds "
                                        f"({self.epoch + 1})")
        return self

    def signature(self) -> str:
        """Which network it trains, in words: ``segresnet SegResNet``."""
        return f"{self.algo} {self.network}"


# Keys only a checkpoint has: a mapping with none of them is no checkpoint (bare weights, or another file)
HEADER_KEYS = frozenset({"mode", "epoch", "best_metric", "algo", "network", "optimizer"})
