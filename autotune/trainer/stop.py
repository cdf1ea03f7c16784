"""Stopping training on a signal: SIGTERM (a scheduler's preemption), SIGINT (Ctrl-C), SIGHUP (a closed
terminal or SSH session), SIGUSR1 (SLURM's ``--signal=USR1@T`` warning).

While a run trains, ``StopSignals`` turns the first such signal into a request; the epoch
loop asks ``requested_everywhere`` at every batch boundary, so with several processes every
rank stops at the same batch (the request of any rank counts, agreed by one small collective).
The runner then writes a checkpoint that ``--resume`` continues from exactly and exits with
128 + the signal's number (143, 130, 129, 138). A second signal a second or more after the first
does not wait: it raises ``KeyboardInterrupt`` at once (the checkpoint of the last finished
epoch stays). One sooner is the same request delivered twice (Ctrl-C reaches a spawned rank
from the terminal and again from its parent). The previous handlers are restored on exit.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

__all__ = ["AGAIN", "BEFORE_TRAINING", "STOP_SIGNALS", "StopSignals"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
BEFORE_TRAINING = ("before training started (while the data was checked or cached): nothing was trained; run the "
                   "same command again")  # what a stop before the first step says
AGAIN = ("stopped at once by a second signal, inside an epoch: the checkpoints of the epochs before it stay; "
         "continue with --resume")
_REPEAT_GRACE_S = 1.0  # a second signal within this many seconds is the first one delivered twice


class StopSignals:
    """``with StopSignals(agree) as stop:`` catch the stop signals; ``stop.signum`` is the first one seen here.

    Args:
        agree: the largest of a number over all ranks (``autotune.trainer.ddp.all_ranks_max`` for one
            value; the number itself when alone), so ``requested_everywhere`` agrees over the ranks.
    """

    def __init__(self, agree: Callable[[int], int]) -> None:
        self.agree = agree
        self.signum: int | None = None
        self.agreed = 0  # the signal all ranks agreed on at the last boundary (0: none)
        self._first_at = 0.0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            from autotune.stopping import not_ignored

            for signum in not_ignored(STOP_SIGNALS):  # one ignored when the run started stays ignored
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum, self._first_at = signum, time.monotonic()
        elif time.monotonic() - self._first_at >= _REPEAT_GRACE_S:
            raise KeyboardInterrupt(AGAIN)  # asked again: stop now

    def requested_everywhere(self) -> int:
        """The signal number any rank has seen (the highest), 0 for none, also kept as ``agreed``;
        a collective with several ranks, so every rank must ask at the same boundaries."""
        self.agreed = int(self.agree(self.signum or 0))
        return self.agreed
