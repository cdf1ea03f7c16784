"""A hook for the stop-signal tests: it marks the moment the Nth training pass of rank 0 is done, then
holds that pass until a stop signal has reached this process (its own handler has run), so a test's
signal arrives inside a known batch however long the signal takes to come (a DDP rank gets it from the
spawning process).

``MARK_AT_PASS`` (N) and ``MARK_FILE`` (the file created at the mark) come from the environment.
``main(argv)`` runs ``autotune ARGV`` with the hook (the target of a forked command,
``forked_cli.start_cli(..., target="mark_hook:main")``); a fresh interpreter (a DDP rank) installs it from
a ``sitecustomize`` that calls ``install()``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence

STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def _hold_until_a_stop_signal() -> None:
    came: list[int] = []
    handlers = {s: signal.getsignal(s) for s in STOPS}

    def seen(signum: int, frame: object) -> None:
        came.append(signum)
        handler = handlers[signal.Signals(signum)]
        if callable(handler):
            handler(signum, frame)

    for s in STOPS:
        signal.signal(s, seen)
    open(os.environ["MARK_FILE"], "w").close()
    deadline = time.monotonic() + 120
    while not came and time.monotonic() < deadline:
        time.sleep(0.01)
    for s, handler in handlers.items():
        signal.signal(s, handler)


def install() -> None:
    """Wrap ``autotune.step.train_step`` (the trainer imports it at each call) with the mark."""
    import autotune.step as step

    train_step, calls = step.train_step, [0]

    def marked(*args: object, **kwargs: object) -> object:
        result = train_step(*args, **kwargs)
        calls[0] += 1
        if calls[0] == int(os.environ["MARK_AT_PASS"]) and os.environ.get("RANK", "0") == "0":
            _hold_until_a_stop_signal()
        return result

    step.train_step = marked


def main(argv: Sequence[str]) -> int:
    """``autotune ARGV`` with the torch threads of ``OMP_NUM_THREADS`` and, where ``MARK_AT_PASS`` is set, the mark."""
    import torch

    from autotune.cli import main as cli

    if os.environ.get("OMP_NUM_THREADS"):  # a forked child: torch was imported before the variable was set
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    if os.environ.get("MARK_AT_PASS"):
        install()
    return cli(list(argv))
