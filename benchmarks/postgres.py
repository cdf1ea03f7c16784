"""A private, throw-away PostgreSQL server on 127.0.0.1: the tests' fixtures (``tests/pg_fixtures.py``) and the
benchmark of many workers (``python -m benchmarks.bench_many_workers``) start it from here.

``start_cluster()`` runs ``initdb -A trust -U autotune`` in a fresh 0700 folder and starts the server on a free
127.0.0.1 port (its Unix socket in that folder); ``PostgresCluster.url`` is
``postgresql+psycopg://autotune@127.0.0.1:PORT/postgres`` and ``stop()`` stops it and deletes its folder. Where
PostgreSQL cannot start (no binaries and no way to install them, no ``postgres`` user to run them as root,
``initdb`` or ``pg_ctl`` failing) it raises ``Unavailable`` with the reason. Every cluster this process started
is also stopped by an ``atexit`` hook, and clusters left by a killed earlier run (whose owning process is gone)
are stopped and removed when the next one starts. ``check_loopback_only`` fails loudly if the server listens
beyond 127.0.0.1. Nothing here imports pytest.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PostgresCluster", "Unavailable", "check_loopback_only", "pid_alive", "postmaster_pid", "running",
           "start_cluster"]

_DIR_PREFIX = "autotune-pg-"
_OWNER_FILE = "owner.pid"
_USER = "autotune"
_START_TIMEOUT_S = 60
_INSTALL_TIMEOUT_S = 600

_install_tried = False
running: dict[Path, PostgresCluster] = {}


class Unavailable(Exception):
    """PostgreSQL cannot be started here; the message says why (becomes the skip reason)."""


@dataclass
class PostgresCluster:
    """A running throw-away cluster: its folder, binaries, port and how to run its tools."""

    root: Path
    bindir: Path
    port: int
    run_as: str | None  # user to run the tools as (``runuser``) when we are root, else None
    options: str = ""  # the server's options (``pg_ctl -o``), for a start after a stop

    @property
    def data(self) -> Path:
        """The cluster's data directory."""
        return self.root / "data"

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the ``postgres`` database as the trusted ``autotune`` superuser."""
        return f"postgresql+psycopg://{_USER}@127.0.0.1:{self.port}/postgres"

    def pg_ctl(self, *args: str) -> None:
        """Run ``pg_ctl -D DATA ARGS`` as the server's user; raises when it fails."""
        done = subprocess.run(_tool_cmd(self.run_as, str(self.bindir / "pg_ctl"), "-D", str(self.data), *args),
                              cwd=self.root, capture_output=True, text=True, timeout=_START_TIMEOUT_S + 15)
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl {' '.join(args)} failed: {_tail(done.stderr or done.stdout)}")

    def restart(self) -> None:
        """Restart the server as an administrator does (``-m fast``: sessions are ended, transactions rolled back)."""
        self.pg_ctl("restart", "-m", "fast", "-w", "-o", self.options, "-l", str(self.root / "log"))

    def stop_server(self) -> None:
        """Stop the server (``-m fast``), keeping its data for ``start_server``."""
        self.pg_ctl("stop", "-m", "fast", "-w")

    def start_server(self) -> None:
        """Start the server again after ``stop_server``."""
        self.pg_ctl("start", "-w", "-o", self.options, "-l", str(self.root / "log"))

    def stop(self) -> None:
        """Stop the server (fast, then immediate, then SIGKILL) and delete its folder; never raises."""
        running.pop(self.root, None)
        _stop_cluster_dir(self.root, self.bindir, self.run_as)


def _tool_cmd(run_as: str | None, *argv: str) -> list[str]:
    return ["runuser", "-u", run_as, "--", *argv] if run_as else list(argv)


def _find_bindir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<ver>/bin`` holding initdb, or the folder of ``initdb`` on PATH."""
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb")

    def version(path: str) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", Path(path).parent.parent.name))

    if found:
        return Path(max(found, key=version)).parent
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl", path=str(Path(on_path).parent)):
        return Path(on_path).parent
    return None


def _install_postgresql() -> str:
    """Try ``apt-get install postgresql`` once per process; returns why it did not help ('' if it did)."""
    global _install_tried
    if _install_tried:
        return "installing it was already tried in this run"
    _install_tried = True
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "not root with apt-get, so it cannot be installed (apt-get install postgresql)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "postgresql"]
    try:
        done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S)
        if done.returncode != 0:  # stale or missing package lists: refresh them once and retry
            subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=_INSTALL_TIMEOUT_S)
            done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"apt-get install postgresql failed: {exc}"
    if done.returncode != 0:
        return f"apt-get install postgresql failed: {_tail(done.stderr or done.stdout)}"
    return ""


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:]) or "(no output)"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def postmaster_pid(data: Path) -> int | None:
    try:
        return int((data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _stop_cluster_dir(root: Path, bindir: Path | None, run_as: str | None) -> None:
    """Stop whatever server runs from ``root/data`` and delete ``root``; best effort, never raises."""
    data = root / "data"
    pg_ctl = bindir / "pg_ctl" if bindir else None
    if (data / "postmaster.pid").exists() and pg_ctl is not None and pg_ctl.exists():
        for mode in ("fast", "immediate"):
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                done = subprocess.run(_tool_cmd(run_as, str(pg_ctl), "-D", str(data), "stop", "-m", mode, "-w",
                                                "-t", "30"), cwd=root, capture_output=True, timeout=40)
                if done.returncode == 0:
                    break
    pid = postmaster_pid(data)
    if pid is not None and pid_alive(pid):  # pg_ctl could not stop it: kill the postmaster itself
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(root, ignore_errors=True)


def _stop_all_running() -> None:
    """atexit backup: stop every cluster this process started and has not stopped yet."""
    for cluster in list(running.values()):
        cluster.stop()


atexit.register(_stop_all_running)


def _reap_orphans(base: Path, bindir: Path, run_as: str | None) -> None:
    """Stop and delete clusters left by earlier test runs whose owning process has died."""
    for root in base.glob(f"{_DIR_PREFIX}*"):
        try:
            owner = int((root / _OWNER_FILE).read_text().strip())
            if run_as is None and root.stat().st_uid != os.getuid():
                continue  # another user's cluster: not ours to stop
        except (OSError, ValueError):
            continue  # not ours, or still being set up by a live run
        if owner != os.getpid() and not pid_alive(owner):
            _stop_cluster_dir(root, bindir, run_as)


def start_cluster() -> PostgresCluster:
    """initdb and start a private cluster on a free 127.0.0.1 port; raises ``Unavailable`` with the reason."""
    bindir = _find_bindir()
    if bindir is None:
        why = _install_postgresql()
        bindir = _find_bindir()
        if bindir is None:
            raise Unavailable(f"PostgreSQL server binaries not found (/usr/lib/postgresql/*/bin/initdb); {why}")
    run_as: str | None = None
    if os.geteuid() == 0:  # the server refuses to run as root
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError as exc:
            raise Unavailable("running as root but there is no 'postgres' user to run the server as") from exc
        if shutil.which("runuser") is None:
            raise Unavailable("running as root but 'runuser' is missing, so the server cannot run as 'postgres'")
        run_as = "postgres"
    # /tmp, not $TMPDIR: the postgres user must be able to reach the folder (and the socket path stays short).
    base = Path("/tmp") if run_as and Path("/tmp").is_dir() else Path(tempfile.gettempdir())
    _reap_orphans(base, bindir, run_as)
    root = Path(tempfile.mkdtemp(prefix=_DIR_PREFIX, dir=base))
    (root / _OWNER_FILE).write_text(f"{os.getpid()}\n")
    if run_as:
        os.chown(root, owner.pw_uid, owner.pw_gid)
    os.chmod(root, 0o700)
    try:
        initdb = subprocess.run(
            _tool_cmd(run_as, str(bindir / "initdb"), "-D", str(root / "data"), "-A", "trust", "-U", _USER,
                      "-E", "UTF8", "--locale=C", "--no-sync"),
            cwd=root, capture_output=True, text=True, timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        shutil.rmtree(root, ignore_errors=True)
        raise Unavailable(f"initdb could not run: {exc}") from exc
    if initdb.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise Unavailable(f"initdb failed (exit {initdb.returncode}): {_tail(initdb.stderr or initdb.stdout)}")
    last_error = ""
    for _attempt in range(3):  # a free port can be taken between probing and binding: retry on another
        cluster = PostgresCluster(root=root, bindir=bindir, port=_free_port(), run_as=run_as)
        options = (f"-k {root} -p {cluster.port} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off")
        cluster.options = options
        running[root] = cluster  # registered before start so the atexit hook covers a half-started server
        try:
            start = subprocess.run(
                _tool_cmd(run_as, str(bindir / "pg_ctl"), "-D", str(cluster.data), "-o", options,
                          "-l", str(root / "log"), "-w", "-t", str(_START_TIMEOUT_S), "start"),
                cwd=root, capture_output=True, text=True, timeout=_START_TIMEOUT_S + 15,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            last_error = str(exc)
        else:
            if start.returncode == 0:
                return cluster
            last_error = _tail(start.stderr or start.stdout)
        log = root / "log"
        if log.exists():
            last_error += " | log: " + _tail(log.read_text(errors="replace"))
        # Stop a half-started server but keep the initialised data folder for the next attempt.
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(_tool_cmd(run_as, str(bindir / "pg_ctl"), "-D", str(cluster.data), "stop", "-m",
                                     "immediate"), cwd=root, capture_output=True, timeout=40)
    running.pop(root, None)
    _stop_cluster_dir(root, bindir, run_as)
    raise Unavailable(f"pg_ctl start failed three times: {last_error}")


def check_loopback_only(url: str) -> None:
    """Fail loudly if the server listens beyond 127.0.0.1 (it must never be reachable from outside)."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as conn:
            listen = conn.execute(sqlalchemy.text("SHOW listen_addresses")).scalar_one()
    finally:
        engine.dispose()
    if listen != "127.0.0.1":
        raise RuntimeError(f"test PostgreSQL listens on {listen!r}, expected only 127.0.0.1")
