"""The launcher's supervisor: the script runs in a child of its own session; a stop keeps the record.

``supervise`` forks the worker (which runs the script, ``autotune.auto3dseg.launcher.launch``) into a new
session, so the worker and everything it starts (data-loader workers, a multiprocessing manager, a
subprocess) share one process group apart from the launcher's. The supervisor is a child subreaper
(Linux ``PR_SET_CHILD_SUBREAPER``): a process that leaves the group and loses its parent is reparented
to it, so it is still found and reaped.

On SIGTERM, SIGINT, SIGHUP or SIGUSR1 (or when the worker itself dies of one of them, as when a scheduler signals
every process of a job) the supervisor writes the record with ``status: stopped``, the signal, the peaks
so far (the worker keeps them in ``SharedPeaks``, memory shared across the fork) and the script's exit
status if it had ended; then it stops the group and every descendant (SIGTERM, SIGKILL after
``GRACE_S``), reaps them, and exits 128 + the signal's number. When the worker ends on its own, its
record stands and whatever it left running is stopped the same way. The worker watches the supervisor
(``autotune.stopping.watch_parent``): a supervisor killed outright (SIGKILL) takes the worker with it.
"""

from __future__ import annotations

import mmap
import os
import signal
import struct
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["STOP_SIGNALS", "GRACE_S", "SharedPeaks", "supervise", "stop_processes"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
GRACE_S = 5.0  # how long stopped processes get to exit on SIGTERM before SIGKILL
_PR_SET_CHILD_SUBREAPER = 36


class SharedPeaks:
    """A few int64 figures in anonymous shared memory: the worker writes them, the supervisor reads them."""

    FIELDS = ("peak_bytes", "setup_peak_bytes", "train_peak_bytes", "validation_peak_bytes",
              "cuda_max_memory_reserved", "cuda_max_memory_allocated", "script_ended", "script_exit_code")

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, 8 * len(self.FIELDS))  # MAP_SHARED | MAP_ANONYMOUS: one copy after fork

    def _offset(self, name: str) -> int:
        return 8 * self.FIELDS.index(name)

    def get(self, name: str) -> int:
        return int(struct.unpack_from("<q", self._map, self._offset(name))[0])

    def set(self, name: str, value: int) -> None:
        struct.pack_into("<q", self._map, self._offset(name), int(value))

    def raise_to(self, name: str, value: int) -> None:
        if value > self.get(name):
            self.set(name, value)

    def script_ended(self, code: int) -> None:
        """The script returned (or exited) with ``code``: recorded before the worker writes its record."""
        self.set("script_exit_code", code)
        self.set("script_ended", 1)

    def peaks(self) -> dict[str, int]:
        return {name: self.get(name) for name in self.FIELDS[:6]}


def _become_subreaper() -> None:
    """Orphaned descendants are reparented to this process, not to init (Linux; elsewhere nothing)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every process in /proc ({} where there is none)."""
    table: dict[int, tuple[int, int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields and fields[0] != b"Z":  # a zombie is already dead: it only waits to be reaped
            table[int(name)] = (int(fields[1]), int(fields[2]))
    return table


def _targets(group: int) -> set[int]:
    """The live processes of ``group`` and every live descendant of this process."""
    table, me = _proc_table(), os.getpid()
    found = {pid for pid, (_parent, pgid) in table.items() if pgid == group}
    frontier = [me]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _pgid) in table.items():
            if ppid == parent and pid not in found:
                found.add(pid)
                frontier.append(pid)
    found.discard(me)
    return found


def _reap() -> dict[int, int]:
    """Reap every child that has ended; pid -> wait status."""
    ended: dict[int, int] = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended[pid] = status


def _signal_all(group: int, pids: set[int], signum: int) -> None:
    for send, target in ((os.killpg, group), *((os.kill, pid) for pid in sorted(pids))):
        try:
            send(target, signum)
        except (ProcessLookupError, PermissionError):
            pass


def stop_processes(group: int, grace_s: float = GRACE_S) -> tuple[int, dict[int, int]]:
    """Stop process group ``group`` and every descendant of this process: SIGTERM, then SIGKILL after
    ``grace_s``; reap them. Returns (how many were stopped, pid -> wait status of the children reaped)."""
    reaped = _reap()
    stopped = _targets(group)
    if not stopped:
        return 0, reaped
    _signal_all(group, stopped, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        reaped.update(_reap())
        if not _targets(group):
            return len(stopped), reaped
        time.sleep(0.05)
    left = _targets(group)
    stopped |= left
    _signal_all(group, left, signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    while _targets(group) and time.monotonic() < deadline:
        reaped.update(_reap())
        time.sleep(0.05)
    reaped.update(_reap())
    return len(stopped), reaped


class _Stop(BaseException):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _peak_rss(pid: int) -> int | None:
    """The high-water mark of a live process's resident memory (Linux ``VmHWM``), bytes."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _run_child(work: Callable[[SharedPeaks], int], shared: SharedPeaks) -> None:
    """The worker: its own session, default signal handling, the work, then the interpreter's exit duties."""
    import atexit
    import traceback

    from autotune.stopping import not_ignored, watch_parent

    code = 1
    try:
        watch_parent()  # a supervisor killed outright takes its worker with it
        os.setsid()
        for signum in not_ignored(STOP_SIGNALS):  # one ignored when the launcher started stays ignored
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        code = int(work(shared))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - the worker must never return into the supervisor's code
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()  # what the interpreter runs at exit: multiprocessing stops its daemons
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(code)


def _wait(pid: int) -> tuple[int | None, int | None]:
    """(the worker's wait status, None) when it ends; (None, signal) when a stop signal comes first."""
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        _, status = os.waitpid(pid, 0)
        return status, None
    except _Stop as stop:
        return None, stop.signum


def supervise(work: Callable[[SharedPeaks], int], record_path: Path | None, base: Mapping[str, Any],
              say: Callable[[str], None]) -> int:
    """Run ``work(shared_peaks)`` in a forked worker of its own session; return the exit code (see the module
    docstring). ``base``: what the stopped record holds besides (script, args, limit, device asked for)."""
    _become_subreaper()
    started = time.perf_counter()

    def on_signal(signum: int, _frame: Any) -> None:
        raise _Stop(signum)

    from autotune.stopping import not_ignored

    previous = {signum: signal.signal(signum, on_signal) for signum in not_ignored(STOP_SIGNALS)}
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # a signal during the fork waits for _wait
    shared = SharedPeaks()
    pid = os.fork()
    if pid == 0:
        _run_child(work, shared)
    status, signum = _wait(pid)
    for sig in STOP_SIGNALS:  # from here on a further signal is not a new stop: the record comes first
        signal.signal(sig, signal.SIG_IGN)
    try:
        if signum is None and status is not None and os.WIFSIGNALED(status):
            signum = os.WTERMSIG(status)  # the worker itself was signalled (a scheduler signals every process)
        if signum is None:
            count, _ = stop_processes(pid)
            if count:
                say(f"autotune.launch: stopped {count} process(es) the script left running")
            return os.waitstatus_to_exitcode(status) if status is not None else 1
        rss = _peak_rss(pid)
        count, _ = stop_processes(pid)
        record = _stopped_record(base, shared, signum, rss, count, time.perf_counter() - started, record_path)
        _write(record_path, record)
        say(_stopped_line(record, record_path))
        return 128 + signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stopped_record(base: Mapping[str, Any], shared: SharedPeaks, signum: int, rss: int | None, count: int,
                    seconds: float, record_path: Path | None) -> dict[str, Any]:
    """The record of a stopped launch: what the worker wrote when it started, the stop, the peaks so far."""
    from autotune.errors import AutotuneError
    from autotune.utils import read_json

    record: dict[str, Any] = dict(base)
    if record_path is not None and record_path.is_file():
        try:  # the worker's record: written when it started (or when the script ended)
            record.update(read_json(str(record_path)) or {})
        except AutotuneError:
            pass
    name = signal.Signals(signum).name
    ended = bool(shared.get("script_ended"))
    record.update(status="stopped" if signum in STOP_SIGNALS else "killed", signal=name, signal_number=signum,
                  exit_code=128 + signum, script_exit_code=shared.get("script_exit_code") if ended else None,
                  seconds=round(seconds, 3), stopped_processes=count)
    peaks = shared.peaks()
    if str(record.get("device", "")).startswith("cuda"):
        record.update(peak_bytes=peaks["cuda_max_memory_reserved"],
                      cuda_max_memory_reserved=peaks["cuda_max_memory_reserved"],
                      cuda_max_memory_allocated=peaks["cuda_max_memory_allocated"])
    else:
        record.update({k: peaks[k] for k in ("peak_bytes", "setup_peak_bytes", "train_peak_bytes",
                                             "validation_peak_bytes")})
    if rss is not None:
        record["peak_rss_bytes"] = rss
    limit = int(record.get("memory_limit") or 0)
    record["within_limit"] = int(record.get("peak_bytes") or 0) <= limit if limit else None
    return record


def _write(record_path: Path | None, record: Mapping[str, Any]) -> None:
    if record_path is None:
        return
    from autotune.files import atomic_write_json

    atomic_write_json(record_path, dict(record))


def _stopped_line(record: Mapping[str, Any], record_path: Path | None) -> str:
    from autotune.utils import format_bytes

    ended = record.get("script_exit_code")
    return (f"autotune.launch: {record['status']} by {record['signal']}, peak {format_bytes(record.get('peak_bytes'))} "
            f"of {format_bytes(record.get('memory_limit'))}; "
            + (f"the script had exited {ended}; " if ended is not None else "")
            + f"{record['stopped_processes']} process(es) stopped"
            + (f" (record: {record_path})" if record_path is not None else ""))
