"""Stopping on a scheduler's signal: SIGTERM (what SLURM and Kubernetes send before they kill) and
SIGUSR1 (SLURM's ``--signal`` warning) become ``Stopped``, an exception that unwinds the work in
progress like Ctrl-C does, so what the ``finally`` blocks promise happens: a probe child is killed,
the trial in flight is failed with its reason (never left RUNNING for a process that is gone), claims
are released and the worker's heartbeat row is removed. The CLI turns it into one line and the
conventional exit code, 128 + the signal's number (143 for SIGTERM), which schedulers requeue on.
``autotune train`` stops at a step boundary with a checkpoint instead (docs/faults.md).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["Stopped", "STOP_SIGNALS", "stop_on_signals"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Stopped(BaseException):
    """A stop signal arrived; ``exit_code`` is 128 + its number."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        self.name = signal.Signals(self.signum).name
        super().__init__(f"stopped by {self.name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _raise(signum: int, _frame: FrameType | None) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def stop_on_signals(signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[None]:
    """Within the block, ``signals`` raise ``Stopped`` in the main thread; the previous handlers come back
    after it. Outside the main thread (where handlers cannot be set) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _raise) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
