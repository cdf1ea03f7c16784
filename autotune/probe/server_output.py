"""Imported first by the probe fork server (``autotune.probe.isolation.PRELOAD``): its stdout and stderr go to
/dev/null before it loads anything.

The server inherits its caller's stdout and stderr: a pipe, when the caller runs under ``subprocess``
with its output captured (the GPU check's sections, a CI job). It outlives its caller by its
interpreter's teardown, seconds with torch and MONAI loaded, and a reader of that pipe waits for the
pipe's end: the GPU check's ``autotune tune`` looked hung after printing its summary and was killed at
its time limit. Each probe child writes to files of its own (``isolation._child_main``), so the server
needs neither. Any other process importing this module (a test importing every module) is left as it is.
"""

from __future__ import annotations

import os
import sys

__all__ = ["in_the_fork_server", "release_the_callers_output"]


def in_the_fork_server() -> bool:
    """True when ``multiprocessing.forkserver.main`` is importing this module (the server's preload)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "main" and frame.f_globals.get("__name__") == "multiprocessing.forkserver":
            return True
        frame = frame.f_back
    return False


def release_the_callers_output() -> None:
    """Point file descriptors 1 and 2 at /dev/null."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


if in_the_fork_server():
    release_the_callers_output()
