"""Where an epoch's time goes: host-to-device copies and the training passes, on the device's own clock.

On a GPU the host runs ahead of the device, so a host clock around a copy or a step measures the
launch, not the work: ``PhaseClock`` records a pair of CUDA events around each phase and sums their
elapsed times once, at the epoch's end (one synchronisation per epoch, none per batch). On the CPU
the work is synchronous and a host clock is the truth. The data wait (the host blocked on the
loader) and validation are timed by the epoch itself.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["PhaseClock", "PHASES"]

PHASES = ("h2d", "compute")  # host-to-device copies; forward, loss, backward and optimizer step


class PhaseClock:
    """Seconds per phase of one epoch on ``device``'s clock; ``take`` returns them and starts again."""

    def __init__(self, device: str) -> None:
        self.cuda = str(device).startswith("cuda")
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.events: dict[str, list[tuple[Any, Any]]] = {name: [] for name in PHASES}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the work launched inside the block as ``name``."""
        if not self.cuda:
            start = time.perf_counter()
            try:
                yield
            finally:
                self.seconds[name] += time.perf_counter() - start
            return
        import torch

        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        try:
            yield
        finally:
            end.record()
            self.events[name].append((begin, end))

    def take(self) -> dict[str, float]:
        """The seconds per phase since the last ``take`` (on CUDA: after waiting for the device)."""
        if self.cuda and any(self.events.values()):
            import torch

            torch.cuda.synchronize()
            for name, pairs in self.events.items():
                self.seconds[name] += sum(begin.elapsed_time(end) for begin, end in pairs) / 1000.0
                pairs.clear()
        seconds, self.seconds = self.seconds, dict.fromkeys(PHASES, 0.0)
        return seconds
