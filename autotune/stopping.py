"""Stopping on a scheduler's signal, and children that stop when their parent is gone.

SIGTERM (what SLURM and Kubernetes send before they kill), SIGHUP (a closed terminal or SSH
session) and SIGUSR1 (SLURM's ``--signal`` warning) become ``Stopped``, an exception that unwinds
the work in progress like Ctrl-C (SIGINT, ``KeyboardInterrupt``) does, so what the ``finally``
blocks promise happens: a probe child is killed with its process group, the trial in flight is
failed with its reason (never left RUNNING for a process that is gone), claims are released and
the worker's trial in the ``autotune-workers`` study is closed. The CLI turns it into one line and
the conventional exit code, 128 + the signal's number (143 for SIGTERM, 129 for SIGHUP), which
schedulers requeue on.
``autotune train`` stops at a step boundary with a checkpoint instead (docs/faults.md).

A process that autotune starts and that could outlive the one that started it (a probe child
forked from the fork server, a DDP rank, the launcher's worker) calls ``watch_parent`` first:
when its parent is gone it is killed too (Linux ``PR_SET_PDEATHSIG``; elsewhere a thread that
polls the parent's pid), so a SIGKILL of the parent leaves no orphan computing on a GPU. A child
whose parent is a fork server but that another process asked for also calls ``watch_process``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType

__all__ = ["Stopped", "STOP_SIGNALS", "not_ignored", "stop_on_signals", "watch_parent"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)
_PR_SET_PDEATHSIG = 1


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


def not_ignored(signals: tuple[int, ...]) -> tuple[int, ...]:
    """``signals`` less those this process ignores: a signal ignored when autotune is started (``nohup`` ignores
    SIGHUP; a script's background job, ``cmd &``, SIGINT and SIGQUIT) stays ignored, as its starter asked,
    and every handler autotune sets leaves it so."""
    return tuple(s for s in signals if signal.getsignal(s) != signal.SIG_IGN)


@contextlib.contextmanager
def stop_on_signals(signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[None]:
    """Within the block, ``signals`` raise ``Stopped`` in the main thread (those ignored stay ignored:
    ``not_ignored``); the previous handlers come back after it. Outside the main thread (where handlers cannot be set) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _raise) for sig in not_ignored(signals)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _set_parent_death_signal(signum: int) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent dies (Linux); False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def watch_parent(parent: int | None = None, *, signum: int = signal.SIGKILL, poll_s: float = 1.0,
                 kernel: bool = True) -> str:
    """End this process with ``signum`` when its parent (``parent``, default the current one) is gone.

    Call it first thing in a child. Linux: the kernel's parent-death signal (``PR_SET_PDEATHSIG``); else, or
    with ``kernel=False``, a daemon thread that compares ``os.getppid()`` with ``parent`` every ``poll_s``
    seconds. A parent already gone by the call (the child was reparented) ends the process at once.

    Returns:
        How it watches: ``"kernel"`` or ``"poll"`` (``"gone"`` is never returned: the process ends).
    """
    parent = os.getppid() if parent is None else int(parent)
    how = "kernel" if kernel and _set_parent_death_signal(signum) else "poll"
    if os.getppid() != parent:  # it died before the watch began: the kernel will not tell
        os.kill(os.getpid(), signum)
    if how == "poll":
        def poll() -> None:
            while os.getppid() == parent:
                time.sleep(poll_s)
            os.kill(os.getpid(), signum)

        threading.Thread(target=poll, name="autotune-watch-parent", daemon=True).start()
    return how


def watch_process(pid: int, *, signum: int = signal.SIGKILL, poll_s: float = 1.0) -> str:
    """End this process with ``signum`` when process ``pid`` (not its parent: e.g. the process that asked a fork
    server for it) has ended. Linux: a daemon thread waits on the process's pidfd; else, or where that cannot be
    opened, it looks every ``poll_s`` seconds. A process already gone ends this one at once.

    Returns:
        How it watches: ``"pidfd"`` or ``"poll"`` (``"gone"`` only where ``signum`` did not end this process).
    """
    import select

    try:
        fd: int | None = os.pidfd_open(int(pid))  # type: ignore[attr-defined]
        how = "pidfd"
    except ProcessLookupError:  # gone already
        os.kill(os.getpid(), signum)
        return "gone"
    except (AttributeError, OSError):
        fd, how = None, "poll"

    def wait() -> None:
        if fd is not None:
            select.select([fd], [], [])  # readable once the process has ended
        else:
            while _exists(int(pid)):
                time.sleep(poll_s)
        os.kill(os.getpid(), signum)

    threading.Thread(target=wait, name="autotune-watch-process", daemon=True).start()
    return how


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's
        return True
    return True
