"""One training run per model folder at a time: ``training_lock``.

``autotune train`` holds ``BUNDLE/model_fold<k>/.train.lock`` from before it writes anything until it ends
(done, refused, stopped by a signal, failed): an exclusive ``fcntl.flock`` on the file, which names its holder
(pid, host, when it started, the command) as JSON. A second run of the same folder finds it held and is refused
in one line naming the holder (``ConfigError``, exit 2), having written nothing. The kernel drops a flock when
its holder ends however it ends (SIGKILL too), so a lock file that names a holder but is not locked was left by a
run that was killed: the next run takes it over and says so in one line. Processes forked while it is held (data
loader workers) close their copy at once, so they never keep a killed run's lock. Under DDP only the process
that starts the ranks (``--nproc N``) or torchrun's rank 0 holds it: the other ranks write nothing.

Where the file system cannot lock (some network file systems), the holder the file names is judged instead: a
live process of this host, or any process of another host (which cannot be asked), holds it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shlex
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from autotune.errors import ConfigError

__all__ = ["LOCK_NAME", "Holder", "TrainingLock", "training_lock"]

LOCK_NAME = ".train.lock"
_NAMED_WITHIN_S = 2.0  # a holder writes its name right after it locks: wait this long to read it
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)  # a file system that cannot flock
_HELD: set[int] = set()  # the lock files' descriptors this process holds


def _close_in_child() -> None:
    """In a forked child: drop the copies of the held descriptors (the parent keeps the lock)."""
    for fd in _HELD:
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: its pid and host, when it started, its command."""

    pid: int
    host: str
    started: str = ""
    command: str = ""

    @classmethod
    def me(cls) -> Holder:
        return cls(os.getpid(), socket.gethostname(), time.strftime("%Y-%m-%d %H:%M:%S"), shlex.join(sys.argv))

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        """The holder a lock file names; None for an empty or foreign file."""
        try:
            data = json.loads(text)
            holder = cls(int(data["pid"]), str(data["host"]), str(data.get("started", "")),
                         str(data.get("command", "")))
        except (ValueError, TypeError, KeyError):
            return None
        return holder if holder.pid > 0 else None

    def words(self) -> str:
        started = f", started {self.started}" if self.started else ""
        return f"pid {self.pid} on {self.host}{started}"

    def alive(self) -> bool:
        """True unless it is a process of this host that is gone (another host's cannot be asked)."""
        if self.host != socket.gethostname():
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _read(fd: int) -> Holder | None:
    return Holder.parse(os.pread(fd, 4096, 0).decode("utf-8", "replace"))


def _same_file(fd: int, path: Path) -> bool:
    """True when ``fd`` is still the file at ``path`` (a holder that let go removed the one it locked)."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


class TrainingLock:
    """The lock of one model folder (see the module docstring): ``acquire`` it, ``release`` it.

    Args:
        folder: the model folder (made when missing; removed again on release when the run left it empty).
        bundle: the bundle, named in a refusal.
        say: where the line of a lock taken over goes.
    """

    def __init__(self, folder: Path, bundle: str, say: Callable[[str], None]) -> None:
        self.folder, self.bundle, self.say = Path(folder), bundle, say
        self.path = self.folder / LOCK_NAME
        self.fd: int | None = None
        self.made_folder = False

    def acquire(self) -> None:
        """Take the lock, or refuse.

        Raises:
            ConfigError: another run holds it (naming it).
            HostWriteError: the host refused to make the folder or the lock file.
        """
        from autotune.files import HOST_REFUSALS, refused

        try:
            if not self.folder.is_dir():
                self.folder.mkdir(parents=True, exist_ok=True)
                self.made_folder = True
            while self.fd is None:
                self.fd = self._try_once()
        except BaseException as exc:
            self._remove_folder()
            if isinstance(exc, OSError) and exc.errno in HOST_REFUSALS:
                raise refused(exc, "the training lock", self.path) from exc
            raise
        _HELD.add(self.fd)

    def _try_once(self) -> int | None:
        """The locked descriptor of the lock file; None when the file went away meanwhile (try again)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._named(fd)
            os.close(fd)
            raise self._refusal(holder) from None
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                os.close(fd)
                raise
            self._judge_unlocked(fd)
        if not _same_file(fd, self.path):
            os.close(fd)
            return None
        left = _read(fd)
        self._write_me(fd)
        if left is not None:
            self.say(f"taking over the training lock {self.path} of a run that ended without releasing it "
                     f"({left.words()}; it is gone)")
        return fd

    def _named(self, fd: int) -> Holder | None:
        """The holder of a held lock, waiting a moment for a holder that has just locked to write its name."""
        deadline = time.monotonic() + _NAMED_WITHIN_S
        holder = _read(fd)
        while holder is None and time.monotonic() < deadline:
            time.sleep(0.05)
            holder = _read(fd)
        return holder

    def _judge_unlocked(self, fd: int) -> None:
        """Where flock is not supported: refuse when the named holder may be alive."""
        holder = _read(fd)
        if holder is not None and holder.alive() and holder.pid != os.getpid():
            os.close(fd)
            raise self._refusal(holder, unlockable=True)

    def _refusal(self, holder: Holder | None, unlockable: bool = False) -> ConfigError:
        who = f"({holder.words()})" if holder is not None else "(its pid not written yet)"
        gone = (f"; if it is gone, remove {self.path}" if unlockable else "")
        return ConfigError(f"{self.bundle}: another 'autotune train' of this bundle is running {who}, writing "
                           f"{self.folder}; wait for it to end or stop it, then run this command again{gone}")

    @staticmethod
    def _write_me(fd: int) -> None:
        data = (json.dumps(asdict(Holder.me())) + "\n").encode("utf-8")
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)

    def release(self) -> None:
        """Let go: the lock file is removed (while still locked, so no other run takes the removed file), then
        closed; a model folder this lock made and the run left empty is removed."""
        fd, self.fd = self.fd, None
        if fd is None:
            return
        _HELD.discard(fd)
        try:
            if _same_file(fd, self.path):
                self.path.unlink(missing_ok=True)
        finally:
            os.close(fd)
            self._remove_folder()

    def _remove_folder(self) -> None:
        if self.made_folder:
            try:
                self.folder.rmdir()
            except OSError:  # the run wrote into it: it stays
                pass

    def __enter__(self) -> TrainingLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextmanager
def training_lock(folder: Path, bundle: str, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the lock of ``folder`` while inside, in the process that writes a run's files: not in a rank of
    torchrun other than 0 (``RANK``), which writes nothing.

    Raises:
        ConfigError: another run holds it.
    """
    if int(os.environ.get("RANK", "0")) != 0:
        yield
        return
    with TrainingLock(folder, bundle, say or (lambda line: print(line, file=sys.stderr, flush=True))):
        yield
