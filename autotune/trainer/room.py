"""Room on the disk before training starts: for the checkpoints, and for the disk cache.

A checkpoint holds the model's state (parameters and buffers), the optimizer's state (for
Adam two tensors the size of each parameter, for SGD with momentum one, ...), the
GradScaler's and the schedule's few numbers and the RNG states; its size is known before
the first step. At the peak of a run three of them share the model folder: ``best.pt``,
``last.pt`` and the next ``last.pt`` while it is written (the old one goes only at the
rename). ``check_checkpoint_room`` refuses a run whose folder lacks that room, in one line;
``check_cache_room`` does the same for a ``PersistentDataset`` cache.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from autotune.errors import HostWriteError
from autotune.files import free_bytes, sizes_note, tensor_bytes

__all__ = ["checkpoint_bytes", "optimizer_state_bytes", "check_checkpoint_room", "check_cache_room",
           "CHECKPOINTS_AT_PEAK"]

CHECKPOINTS_AT_PEAK = 3  # best.pt, last.pt, and the next last.pt before its rename
_PER_TENSOR_BYTES = 512  # the zip entry, its alignment and the pickle record of one tensor
_FIXED_BYTES = 64 * 1024  # RNG states, schedule, scaler, metadata
_OTHER_OUTPUTS_BYTES = 1 << 20  # metrics.csv/json, curves.png, train_summary.json
# Tensors per parameter an optimizer keeps once it has stepped (before its first step its state is empty).
_STATE_SLOTS = {"Adam": 2, "AdamW": 2, "NAdam": 2, "RAdam": 2, "Adamax": 2, "Novograd": 1, "Adagrad": 1,
                "RMSprop": 1, "Adadelta": 2, "SGD": 1}


def optimizer_state_bytes(optimizer: Any) -> tuple[int, int]:
    """(bytes, tensors) of the optimizer's state: what it holds, or, before its first step, the
    state its kind keeps (Adam-family 2 per parameter; SGD 1 with momentum; unknown kinds 2)."""
    if any(optimizer.state.values()):
        state = [v for per_param in optimizer.state.values() for v in per_param.values()]
        return tensor_bytes(state), sum(1 for v in state if hasattr(v, "element_size"))
    params = [p for group in optimizer.param_groups for p in group["params"]]
    slots = _STATE_SLOTS.get(type(optimizer).__name__, 2)
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    if type(optimizer).__name__ == "SGD" and not group.get("momentum"):
        slots = 0
    slots += 1 if group.get("amsgrad") or (group.get("momentum") and type(optimizer).__name__ == "RMSprop") else 0
    return slots * tensor_bytes(params), (slots + 1) * len(params)  # + a step counter per parameter


def checkpoint_bytes(model: Any, optimizer: Any, scaler: Any = None) -> int:
    """About how many bytes ``torch.save`` writes for this run's checkpoint."""
    model_state = model.state_dict()
    state_bytes, state_tensors = optimizer_state_bytes(optimizer)
    scaler_bytes = tensor_bytes(scaler.state_dict()) if scaler is not None else 0
    tensors = len(model_state) + state_tensors
    return tensor_bytes(model_state) + state_bytes + scaler_bytes + tensors * _PER_TENSOR_BYTES + _FIXED_BYTES


def _existing_bytes(paths: Iterable[Path]) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file())


def check_checkpoint_room(folder: Path, size: int, then: str) -> None:
    """Refuse (one line) when ``folder`` lacks room for the checkpoints at a run's peak.

    The checkpoints already there count as room taken: only the rest must be free.

    Raises:
        HostWriteError: not enough free space; ``then`` is what to run once there is.
    """
    needed = CHECKPOINTS_AT_PEAK * size + _OTHER_OUTPUTS_BYTES
    needed -= _existing_bytes([folder / "best.pt", folder / "last.pt"])
    free = free_bytes(folder)
    if free is not None and free < needed:
        raise HostWriteError(what="the checkpoints (best.pt, last.pt and the next last.pt while it is written) in",
                             path=str(folder), reason="not enough free space for a run",
                             sizes=sizes_note(needed, free), kept="the folder as it is, nothing trained",
                             then=f"free space or train elsewhere, then run '{then}'")


def check_cache_room(cache_dir: Path, cache_bytes: int, bundle: str) -> None:
    """Refuse (one line) when ``cache_dir`` lacks room for a ``PersistentDataset`` of ``cache_bytes``
    (the items already cached there count as room taken).

    Raises:
        HostWriteError: not enough free space.
    """
    needed = cache_bytes - _existing_bytes(cache_dir.rglob("*.pt") if cache_dir.is_dir() else [])
    free = free_bytes(cache_dir)
    if free is not None and free < needed:
        raise HostWriteError(what="the disk cache (PersistentDataset) in", path=str(cache_dir),
                             reason="not enough free space for the cached cases", sizes=sizes_note(needed, free),
                             kept="the folder as it is, nothing trained",
                             then=(f"free space, or set fast_training.cache_dir in {bundle}'s config to a larger "
                                   "disk, or persistent_cache: false, then train again"))
