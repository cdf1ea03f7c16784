"""The estimator's training peak at every batch size from one trace.

A training step allocates the same storages in the same order at every batch size N
(``autotune.probe.estimate`` records them: ``MemoryTracker.record``); what changes with N is
their sizes, and each is either proportional to the patches in the forward pass (activations,
their gradients, the cast inputs) or independent of them (weights, gradients, optimizer state,
scalars). The loader batches hold lcm(N, crops) patches (``autotune.tunables.loader_batch_patches``).
So one trace at a *marker* batch, a prime times the crops per image, tells every storage's
kind: its bytes are a multiple of the prime only when it grows with the batch (no constant
storage of a segmentation network holds a prime's multiple of elements for a prime this large).
Replaying the events with each size scaled to N (then rounded up to the tracker's 512 bytes)
gives the tracker's peak at N, the same number a trace at N gives: pinned for each template at
N = 1..64, bf16 and fp32, in ``tests/probe/test_replay.py``. The estimator then costs one trace
per key instead of one per N, and the curve is exact at every N, not interpolated.

The trace's ``work`` events (convolutions: ``MemoryTracker``) count no storage; their sizes scale the
same way, so ``events_at(n)`` gives the whole trace at any N for the allocator's simulation
(``autotune.probe.device_model``).

A trace that does not replay (events out of order, a size that cannot scale) raises
``ReplayError``; the search then estimates point by point (``autotune.search.curves.sparse``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.probe.memory import GRANULARITY
from autotune.tunables import loader_batch_patches

__all__ = ["MARKER_PRIME", "ReplayError", "TrainingReplay", "marker_batch"]

MARKER_PRIME = 1009


class ReplayError(ValueError):
    """The recorded events cannot be replayed at another batch size."""


def marker_batch(crops: int) -> int:
    """The batch to trace: the marker prime times the crops per image (one forward pass per loader batch)."""
    return MARKER_PRIME * max(1, int(crops))


def _normal(events: Sequence[tuple[str, int, int, str]]) -> list[tuple[str, int, int, str]]:
    """``events`` with each run of consecutive frees in slot order: the order in which autograd drops a
    graph's buffers is not fixed, and frees between two allocations do not change the peak."""
    out: list[tuple[str, int, int, str]] = []
    run: list[tuple[str, int, int, str]] = []
    for event in events:
        if event[0] == "free":
            run.append(event)
            continue
        out.extend(sorted(run, key=lambda e: e[1]))
        run = []
        out.append(event)
    out.extend(sorted(run, key=lambda e: e[1]))
    return out


@dataclass
class TrainingReplay:
    """Peak tracked bytes of training at any N from the events of one trace at ``marker_batch(crops)``.

    ``passes``: estimator passes this curve cost (1). ``cap`` is None: training memory grows with N.
    """

    events: Sequence[tuple[str, int, int, str]]
    crops: int = 1
    passes: int = 1
    cap: int | None = None
    _cache: dict[int, float] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        import numpy as np

        events = _normal(self.events)
        if not events or events[0][0] != "alloc":
            raise ReplayError("no storage was recorded")
        self._events = events
        self._kinds = np.array([{"alloc": 0, "grow": 1, "free": 2, "work": 3}[e[0]] for e in events], dtype=np.int8)
        raw = np.array([e[2] for e in events], dtype=np.int64)
        self._loader = np.array([e[3] == "loader" for e in events], dtype=bool)
        # the event that last sized each event's slot (grow and free give back what it sized)
        prev = np.full(len(events), -1, dtype=np.int64)
        last: dict[int, int] = {}
        for i, (kind, slot, _, _) in enumerate(events):
            if kind == "work":
                continue
            if kind != "alloc":
                if slot not in last:
                    raise ReplayError(f"event {i} ({kind}) of a storage that was never counted")
                prev[i] = last[slot]
            if kind == "free":
                del last[slot]
            else:
                last[slot] = i
        self._prev = prev
        batch = marker_batch(self.crops)
        self._batch = batch
        self._grows = (raw % MARKER_PRIME == 0) & (raw > 0) & (self._kinds != 2)
        per_patch = raw // batch  # the loader batch traced holds ``batch`` patches too
        if np.any(self._grows & (per_patch * batch != raw)):
            raise ReplayError("a storage that grows with the batch is not a whole number of bytes per patch")
        self._raw, self._per_patch = raw, per_patch

    def predict(self, n: int) -> float:
        """The tracker's peak at ``n`` patches per forward pass (bytes)."""
        import numpy as np

        n = int(n)
        if n < 1:
            raise ReplayError(f"batch size must be at least 1, got {n}")
        if n not in self._cache:
            patches = np.where(self._loader, loader_batch_patches(n, self.crops), n)
            raw = np.where(self._grows, self._per_patch * patches, self._raw)
            size = -(-raw // GRANULARITY) * GRANULARITY
            before = np.where(self._prev >= 0, size[np.maximum(self._prev, 0)], 0)
            delta = np.where(self._kinds == 0, size, np.where(self._kinds == 1, size - before, -before))
            delta = np.where(self._kinds == 3, 0, delta)
            self._cache[n] = float(max(0, int(np.cumsum(delta).max())))
        return self._cache[n]

    def events_at(self, n: int) -> list[tuple[str, int, int, str]]:
        """The trace's events with every size at ``n`` patches per forward pass (raw bytes, not rounded)."""
        import numpy as np

        patches = np.where(self._loader, loader_batch_patches(int(n), self.crops), int(n))
        raw = np.where(self._grows, self._per_patch * patches, self._raw)
        return [(kind, slot, int(size), op) for (kind, slot, _, op), size in zip(self._events, raw.tolist(), strict=True)]

    def as_dict(self, lo: int, hi: int) -> dict[int, int]:
        """The curve at every n in [lo, hi] (what the study keeps for the dashboard and a resumed search)."""
        return {n: int(self.predict(n)) for n in range(int(lo), int(hi) + 1)}


def replay_of(result: Any, crops: int) -> TrainingReplay:
    """The replay of an ``estimate(..., record=True)`` result traced at ``marker_batch(crops)``.

    Raises:
        ReplayError: the result holds no events, or they do not replay.
    """
    events = result.get("train_events") if isinstance(result, dict) else None
    if not events:
        raise ReplayError("the estimate recorded no training events")
    return TrainingReplay(events, crops)
