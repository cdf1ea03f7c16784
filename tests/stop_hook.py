"""A hook for the process-tree stop tests (``tests/test_stop_signals.py``): ``main(argv)`` runs ``autotune ARGV``
(or, with ``STOP_HOOK_TARGET=module:function``, that function) in a forked command (``forked_cli.start_cli(...,
target="stop_hook:main")``) with:

- a light probe fork server of its own (``autotune.probe.isolation.own_server``, not the one it was forked from):
  ``autotune.probe.isolation.PRELOAD`` emptied, so it starts in a fraction of a second instead of importing
  torch and MONAI (seconds). The process tree is a user's command's (command -> fork server -> trial in a
  session of its own); a trial held by the ``hang`` fault (which fires before the trial imports torch) never
  needs what the preload would have imported;
- with ``HOLD_AT=module:function``: that function's first call creates ``HOLD_FILE`` and holds until a stop
  signal has reached this process (its own handler has run: a handler that raises ends the hold there), so a
  test's signal arrives while the command is at a known point of its work.
"""

from __future__ import annotations

import importlib
import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)


def _hold_until_a_stop_signal(mark: str) -> None:
    came: list[int] = []
    handlers = {s: signal.getsignal(s) for s in STOPS}

    def seen(signum: int, frame: Any) -> None:
        came.append(signum)
        handler = handlers[signal.Signals(signum)]
        if handler is signal.default_int_handler:
            raise KeyboardInterrupt
        if callable(handler):
            handler(signum, frame)

    for s in STOPS:
        signal.signal(s, seen)
    try:
        open(mark, "w").close()
        deadline = time.monotonic() + 120
        while not came and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)


def _hold_at(target: str, mark: str) -> None:
    module_name, _, name = target.partition(":")
    module = importlib.import_module(module_name)
    original: Callable[..., Any] = getattr(module, name)
    calls = [0]

    def held(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            _hold_until_a_stop_signal(mark)
        return original(*args, **kwargs)

    setattr(module, name, held)


def main(argv: Sequence[str]) -> int:
    import autotune.probe.isolation as isolation

    isolation.own_server()
    isolation.PRELOAD = []
    if os.environ.get("HOLD_AT"):
        _hold_at(os.environ["HOLD_AT"], os.environ["HOLD_FILE"])
    module_name, _, name = os.environ.get("STOP_HOOK_TARGET", "autotune.cli:main").partition(":")
    return getattr(importlib.import_module(module_name), name)(list(argv))
