"""The lean tensor tracker: live storage bytes and their peak, counted the same way for real and fake tensors.

``MemoryTracker`` is a ``TorchDispatchMode`` that adds the bytes of every new output
storage (rounded up to 512, the CUDA caching allocator's block size) to a running total,
subtracts them when the storage is freed, and keeps the peak. The CPU probe runs real
steps under it and the estimator runs fake steps under it, so both count the same way.
When recording (``record``), each convolution is kept as a ``work`` event too: where it ran, which
configuration it was (cuDNN searches an algorithm once per configuration) and its largest activation
operand, which ``autotune.probe.device_model`` sizes cuDNN's workspace by. It relies on two PyTorch
internals, each pinned by ``tests/probe/test_tracker.py``: a storage's
Python object is preserved while the storage lives (so a weak reference to it fires when
the storage is freed), and the autograd engine carries dispatch modes into backward.

This module imports torch at its top: import it inside the functions that measure, never
from a module the command line loads (``autotune --help`` stays instant).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from autotune.probe.memory import round_up

__all__ = ["Event", "MemoryTracker", "tensors_of"]

# A recorded count: ("alloc" | "grow", slot, raw bytes, op) or ("free", slot, 0, ""); a convolution:
# ("work", configuration number, bytes of its largest activation operand, op).
Event = tuple[str, int, int, str]
_CONV = torch.ops.aten.convolution.default
_CONV_BACKWARD = torch.ops.aten.convolution_backward.default


def tensors_of(*objects: Any) -> list[torch.Tensor]:
    """Every tensor in ``objects``: modules (parameters, gradients, buffers), optimizers (state),
    tensors, and lists, tuples or dicts of these."""
    found: list[torch.Tensor] = []
    stack = list(objects)
    while stack:
        obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            found.append(obj)
            if obj.is_leaf and obj.grad is not None:
                found.append(obj.grad)
        elif isinstance(obj, torch.nn.Module):
            stack.extend(obj.parameters())
            stack.extend(obj.buffers())
        elif isinstance(obj, torch.optim.Optimizer):
            stack.extend(obj.state.values())
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    return found


class MemoryTracker(TorchDispatchMode):
    """Counts live tensor storage bytes (each rounded up to 512) and the peak.

    Enter it (``with tracker:``) around the work to measure; storages that exist
    before, such as parameters and inputs, are added with ``track``. A storage is
    counted once, however many views share it; a storage that grows (``resize_``)
    adds the difference. Frees are seen through a weak reference to the storage, so
    they are counted even after the mode is left, until ``stop`` is called.

    Args:
        device_type: count only storages on this device type (``"cpu"``, ``"cuda"``); None: all.
        limit_bytes: raise ``torch.OutOfMemoryError`` the moment the running total exceeds it.

    Raises:
        torch.OutOfMemoryError: from inside the op that makes the total exceed ``limit_bytes``.
    """

    def __init__(self, device_type: str | None = None, limit_bytes: int | None = None) -> None:
        super().__init__()
        self.device_type = device_type
        self.limit_bytes = limit_bytes
        self.current_bytes = 0
        self.peak_bytes = 0
        self._reserved = 0
        self._live: dict[int, tuple[weakref.ref, int]] = {}
        # with ``record()``: what happened, in order, for ``autotune.probe.replay``
        self.events: list[Event] | None = None
        self._slots: dict[int, int] = {}
        self._next_slot = 0
        self._op = "existing"
        self._configs: dict[tuple[Any, ...], int] = {}

    def record(self) -> None:
        """Keep every count from now on as an event: ("alloc" | "grow", slot, raw bytes, op) when a
        storage is counted or grows, ("free", slot, 0, "") when it is freed; slots number storages in
        the order they were first counted. Two runs of one program at two batch sizes give the same
        events with other sizes (``autotune.probe.replay``)."""
        self.events = []

    def track(self, tensors: Iterable[torch.Tensor], label: str = "existing") -> int:
        """Count storages that already exist (parameters, gradients, state, inputs); returns the new total.
        ``label`` names them in the recorded events."""
        self._op = label
        for tensor in tensors:
            self._add(tensor)
        return self.current_bytes

    def set_reserved(self, nbytes: int) -> int:
        """Count ``nbytes`` held outside the tracked storages (e.g. a batch a loader thread
        prefetched); replaces the previous reservation. Returns the new total.

        Raises:
            torch.OutOfMemoryError: the total now exceeds ``limit_bytes``.
        """
        nbytes = round_up(max(0, int(nbytes)))
        self.current_bytes += nbytes - self._reserved
        self._reserved = nbytes
        self._update_peak()
        return self.current_bytes

    def reset_peak(self) -> None:
        """Start a new peak from the current total."""
        self.peak_bytes = self.current_bytes

    def stop(self) -> None:
        """Forget every storage: later frees no longer change the totals."""
        self._live.clear()

    def _update_peak(self) -> None:
        """Raise the peak to the current total; past ``limit_bytes`` raise ``torch.OutOfMemoryError``."""
        if self.current_bytes <= self.peak_bytes:
            return
        self.peak_bytes = self.current_bytes
        if self.limit_bytes is not None and self.current_bytes > self.limit_bytes:
            raise torch.OutOfMemoryError(
                f"tracked tensor memory {self.current_bytes} bytes exceeds the memory limit {self.limit_bytes} bytes")

    def _freed(self, key: int) -> None:
        entry = self._live.pop(key, None)
        if entry is not None:
            self.current_bytes -= entry[1]
            slot = self._slots.pop(key, None)
            if self.events is not None and slot is not None:
                self.events.append(("free", slot, 0, ""))

    def _add(self, tensor: torch.Tensor) -> None:
        if self.device_type is not None and tensor.device.type != self.device_type:
            return
        storage = tensor.untyped_storage()
        key = id(storage)
        nbytes = round_up(storage.nbytes())
        entry = self._live.get(key)
        if entry is not None:
            if nbytes <= entry[1]:
                return
            self._live[key] = (entry[0], nbytes)
            self.current_bytes += nbytes - entry[1]
            if self.events is not None and key in self._slots:
                self.events.append(("grow", self._slots[key], storage.nbytes(), self._op))
        else:
            ref = weakref.ref(storage, lambda _ref, key=key: self._freed(key))
            self._live[key] = (ref, nbytes)
            self.current_bytes += nbytes
            if self.events is not None:
                self._slots[key] = slot = self._next_slot
                self._next_slot += 1
                self.events.append(("alloc", slot, storage.nbytes(), self._op))
        self._update_peak()

    def _work(self, func: Any, args: Any, out: Any) -> None:
        """Record a convolution: its configuration (the shapes, dtype and geometry cuDNN keys its algorithm
        search by, numbered in order of first use) and its largest activation operand in bytes."""
        if func is _CONV:
            acts, key_args = [args[0], out], (args[0], args[1], *args[3:])
        else:  # convolution_backward: grad_output, input, weight, bias sizes, geometry; out: grad_input, ...
            acts, key_args = [args[0], args[1], out[0]], (args[0], args[1], args[2], *args[4:10])
        key = (func.__name__, *(("t", tuple(a.shape), str(a.dtype)) if isinstance(a, torch.Tensor)
                                else repr(a) for a in key_args))
        config = self._configs.setdefault(key, len(self._configs))
        size = max(a.numel() * a.element_size() for a in acts if isinstance(a, torch.Tensor))
        self.events.append(("work", config, int(size), func.__name__))  # type: ignore[union-attr]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self._op = func.__name__
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self._add(leaf)
        if self.events is not None and (func is _CONV or func is _CONV_BACKWARD):
            self._work(func, args, out)
        return out
