"""Start probe children cheaply: fork them from a server that has imported torch and MONAI once.

A fresh interpreter spends seconds importing torch and MONAI before a probe measures
anything. Here a ``multiprocessing`` fork server, started once per tuner process, preloads
them (``autotune.probe.preload``) and forks one child per trial. The isolation is kept: each
child is a process of its own, in a session of its own (so the whole group can be killed),
with its own stdout/stderr files and the environment the parent asked for; a crash, an
out-of-memory kill or a hang ends that child only. The server never touches CUDA (importing
torch does not initialise it), so a child may still choose and initialise its device.

A process that was itself forked from the server (a test's or the GPU check's forked command) forks its
own children through the same server instead of starting a second one (a second import of torch and MONAI);
those children end when the process that asked for them ends, as they would with a server of its own.

``AUTOTUNE_PROBE_ISOLATION=subprocess`` starts a fresh interpreter per probe instead (slower;
for comparison and where a fork server cannot start). Launching a child with the parent's
main module left out overrides a private method of CPython's ``multiprocessing``
(``popen_forkserver.Popen._launch``); the override is used only on the Python versions whose
method it was compared with (``CHECKED_PYTHONS``). On any other, probes start as fresh
interpreters, whatever the environment asks.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import sys
import threading
from collections.abc import Mapping
from multiprocessing import context, forkserver, popen_forkserver, reduction, spawn, util
from typing import Any

__all__ = ["CHECKED_PYTHONS", "ISOLATION_ENV", "PRELOAD", "isolation_mode", "prestart", "own_server", "ForkedChild",
           "start_forked", "start_forked_call"]

ISOLATION_ENV = "AUTOTUNE_PROBE_ISOLATION"
PRELOAD = ["autotune.probe.server_output", "autotune.probe.preload"]  # the server lets go of its output first
# Python versions whose popen_forkserver.Popen._launch (and the preparation data it sends) ``_Popen._launch``
# was compared with line by line: 3.10.13, 3.11.7, 3.12.1, 3.13.0.
CHECKED_PYTHONS = ((3, 10), (3, 11), (3, 12), (3, 13))
_LOCK = threading.Lock()
_CONTEXT: Any = None
# in a child forked from the server: the server's address, through which it forks children of its own
_SERVED_BY: Any = None
log = logging.getLogger(__name__)


def _forkserver_checked() -> bool:
    """True where this interpreter's private fork-server launch is one ``_Popen`` was checked against."""
    return tuple(sys.version_info[:2]) in CHECKED_PYTHONS


@functools.cache
def _say_unchecked() -> None:
    log.info("Python %d.%d: probes start as fresh interpreters (the fork-server launch is checked on %s)",
             *sys.version_info[:2], ", ".join(f"{major}.{minor}" for major, minor in CHECKED_PYTHONS))


def isolation_mode() -> str:
    """``forkserver`` (default where the platform has it) or ``subprocess`` (``$AUTOTUNE_PROBE_ISOLATION``).

    On a Python version not in ``CHECKED_PYTHONS`` it is always ``subprocess`` (said once in the log).
    """
    from autotune.checks.environment import setting

    mode = setting(ISOLATION_ENV) or ""
    if mode == "subprocess":
        return mode
    if not _forkserver_checked():
        _say_unchecked()
        return "subprocess"
    if mode == "forkserver":
        return mode
    import multiprocessing

    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "subprocess"


def _context() -> Any:
    global _CONTEXT
    with _LOCK:
        if _CONTEXT is None:
            import multiprocessing

            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(PRELOAD)
            _CONTEXT = ctx
        return _CONTEXT


def prestart() -> bool:
    """Start the fork server now, without waiting for it: it imports torch and MONAI (seconds) while the
    caller goes on (the tuner estimates meanwhile), so the first probe does not wait for that. Returns
    False where probes do not use a fork server (nothing started)."""
    if isolation_mode() != "forkserver":
        return False
    if _SERVED_BY is not None:  # forked from the server: it is running
        return True
    _context()
    forkserver.ensure_running()
    return True


class _Popen(popen_forkserver.Popen):
    """Fork-server Popen whose child does not re-import the parent's ``__main__``.

    multiprocessing runs the parent's main script again in each child (as ``__mp_main__``);
    a script that calls the tuner without an ``if __name__ == "__main__"`` guard would then
    tune again in every probe. A probe needs nothing from ``__main__``, so its preparation
    data leaves the main module out. ``_launch`` is CPython's own (identical in every version of
    ``CHECKED_PYTHONS``) with that one change; ``isolation_mode`` uses it on those versions only.
    """

    def _launch(self, process_obj: Any) -> None:
        prep_data = {k: v for k, v in spawn.get_preparation_data(process_obj._name).items()
                     if k not in ("init_main_from_path", "init_main_from_name")}
        buf = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            context.set_spawning_popen(None)
        self.sentinel, w = _connect(self._fds) if _SERVED_BY is not None else forkserver.connect_to_new_process(self._fds)
        _parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (_parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class _ProbeProcess(context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        _context()  # the preload list is set before the server starts
        return _Popen(process_obj)


def _release_server() -> None:
    """Close the fork server's ``alive`` pipe that multiprocessing hands every forked child, and keep the server's
    address (``_SERVED_BY``): the server exits when that pipe has no writer left, so a child holding it would keep
    the server alive after the process that started both is gone, and the server would keep the child (which ends
    with the server, ``watch_parent``). Children of this child are forked through the address (``_connect``).
    Where the server authenticates its clients (Python versions past ``CHECKED_PYTHONS``' 3.11 protocol), the
    address is not kept: a child starts a server of its own."""
    global _SERVED_BY
    fd = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
        forkserver._forkserver._forkserver_alive_fd = None
    if not hasattr(forkserver._forkserver, "_forkserver_authkey"):
        _SERVED_BY = getattr(forkserver._forkserver, "_forkserver_address", None)


def own_server() -> None:
    """In a child forked from the server: fork this process's children through a server of its own, started
    on first use, as a fresh process does (the process tree command -> server -> child that a user's command
    has), instead of through the server it came from."""
    global _SERVED_BY
    _SERVED_BY = None


def _connect(fds: list[int]) -> tuple[int, int]:
    """``forkserver.connect_to_new_process`` (CPython's, of the versions in ``CHECKED_PYTHONS``) to the server this
    process was forked from, without starting one: the new child's ``alive`` end is a stand-in (``/dev/null``),
    which it closes (``_release_server``), so no child of a child keeps the server alive."""
    import socket
    from multiprocessing import resource_tracker

    if len(fds) + 4 >= forkserver.MAXFDS_TO_SEND:
        raise ValueError("too many fds")
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(_SERVED_BY)
        parent_r, child_w = os.pipe()
        child_r, parent_w = os.pipe()
        stand_in = os.open(os.devnull, os.O_RDONLY)
        try:
            reduction.sendfds(client, [child_r, child_w, stand_in, resource_tracker.getfd(), *fds])
            return parent_r, parent_w
        except BaseException:
            os.close(parent_r)
            os.close(parent_w)
            raise
        finally:
            for fd in (child_r, child_w, stand_in):
                os.close(fd)


def _child_main(target: str, argv: list[str], stdout_path: str, stderr_path: str, env: Mapping[str, str],
                cwd: str | None = None, requester: int | None = None) -> None:
    """In the forked child: own session, own output files, the asked environment and working folder, then
    ``target(argv)`` (``module:function``); its return value (or a ``SystemExit``'s code) is the exit code. The child ends
    when the server does (``watch_parent``), and the server when its starter does (its ``alive`` pipe), so a
    process killed outright leaves no trial computing; a child that another child asked for (``requester``) ends
    when that one does (``watch_process``)."""
    from autotune.stopping import watch_parent, watch_process

    _release_server()
    watch_parent()
    if requester is not None:
        watch_process(requester)
    os.setsid()  # lead a process group of its own, as a subprocess started with start_new_session
    for fd, path in ((1, stdout_path), (2, stderr_path)):
        try:
            handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError:  # the parent gave this child up (stopped, interrupted) and removed its folder
            os._exit(1)
        os.dup2(handle, fd)
        os.close(handle)
    if cwd is not None:
        try:
            os.chdir(cwd)
        except OSError:  # as above: the folder is gone
            os._exit(1)
    os.environ.clear()
    os.environ.update(env)
    code: Any = 1
    try:
        import importlib

        module, _, function = target.partition(":")
        code = getattr(importlib.import_module(module), function)(argv)
    except SystemExit as exc:
        code = exc.code
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else (0 if code is None else 1))  # skip the teardown of torch


class ForkedChild:
    """A probe child forked from the server; ``pid``, ``wait`` and ``returncode`` as a Popen's."""

    def __init__(self, process: Any) -> None:
        self._process = process
        self.pid: int = int(process.pid)

    def wait_for(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the child to end; True when it has."""
        self._process.join(timeout)
        return self._process.exitcode is not None

    def wait(self) -> int:
        self._process.join()
        return int(self._process.exitcode)

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode


def start_forked(request_path: str, stdout_path: str, stderr_path: str, env: Mapping[str, str]) -> ForkedChild:
    """Fork a child that runs the trial of ``request_path`` (starts the server on first use).

    Raises:
        OSError: the server or the child could not be started, or this Python is not in ``CHECKED_PYTHONS``.
    """
    return start_forked_call("autotune.probe.trial:main", [request_path], stdout_path, stderr_path, env,
                             name="autotune-probe")


def start_forked_call(target: str, argv: list[str], stdout_path: str, stderr_path: str, env: Mapping[str, str],
                      name: str = "autotune-child", cwd: str | None = None) -> ForkedChild:
    """Fork a child that runs ``target(argv)`` (``module:function``, e.g. ``autotune.cli:main``) in a session
    of its own, with ``env`` as its whole environment, its output in the two files and ``cwd`` its working
    folder (default: the server's); the function's return value is the child's exit code.

    Raises:
        OSError: the server or the child could not be started, or this Python is not in ``CHECKED_PYTHONS``.
    """
    if not _forkserver_checked():
        raise OSError(f"the fork-server launch is not checked on Python {sys.version_info[0]}.{sys.version_info[1]}")
    requester = os.getpid() if _SERVED_BY is not None else None  # a child's child ends with the child
    process = _ProbeProcess(target=_child_main,
                            args=(target, list(argv), stdout_path, stderr_path, dict(env), cwd, requester),
                            name=name, daemon=False)
    process.start()
    return ForkedChild(process)
