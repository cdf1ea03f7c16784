"""Imported once by the probe fork server (``autotune.probe.isolation``): everything a probe
imports, so each forked child starts with it loaded. Nothing here may initialise CUDA or
start threads: a child forked after either would inherit a broken state."""

from __future__ import annotations

import monai  # noqa: F401
import monai.inferers  # noqa: F401
import monai.losses  # noqa: F401
import monai.networks.nets  # noqa: F401
import monai.optimizers  # noqa: F401
import torch  # noqa: F401
import torch._dynamo  # noqa: F401  (building an optimizer imports it, and sympy: ~3 s a child otherwise)

import autotune.build  # noqa: F401
import autotune.probe.memory  # noqa: F401
import autotune.probe.tracker  # noqa: F401
import autotune.probe.trial  # noqa: F401
import autotune.step  # noqa: F401


def _release_the_callers_output() -> None:
    """The server's own stdout and stderr go to /dev/null: it inherited the caller's (a pipe, when the caller
    runs under ``subprocess`` with its output captured), and it outlives the caller by its interpreter's
    teardown, seconds with torch loaded, during which a reader of that pipe would wait for its end (the GPU
    check's tune looked hung after its summary). Each child writes to files of its own (``_child_main``)."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def _in_the_fork_server() -> bool:
    """True when ``multiprocessing.forkserver.main`` is importing this module (the server's preload), not
    another process that imports every module (a test)."""
    import sys

    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "main" and frame.f_globals.get("__name__") == "multiprocessing.forkserver":
            return True
        frame = frame.f_back
    return False


if _in_the_fork_server():
    _release_the_callers_output()
