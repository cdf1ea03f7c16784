"""``autotune`` commands as real processes that skip the interpreter's start: each is forked from the
probes' fork server (``autotune.probe.isolation``, torch and MONAI imported once per test run) and runs
``autotune.cli.main(argv)``, with the signal dispositions a terminal gives (``from_a_terminal``). It is a
process of its own (its own pid and session, killed or signalled like any other, its exit code the
command's), so tests of several workers, a killed worker or a stop
signal keep their process boundary without paying seconds of imports for each process.

Tests of what a fresh ``python -m autotune`` does on its own (the entry point, start-up) start one with
``subprocess`` instead.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["CliProcess", "from_a_terminal", "start_cli"]

TARGET_ENV = "FORKED_CLI_TARGET"  # the child's target, read by ``from_a_terminal``


class CliProcess:
    """A forked ``autotune`` command with the part of ``subprocess.Popen``'s interface the tests use:
    ``pid``, ``poll``, ``wait``, ``returncode`` (minus the signal's number when one ended it),
    ``send_signal``, ``kill`` (its whole process group) and ``communicate`` (its output files)."""

    def __init__(self, child: object, argv: Sequence[str], out: Path, err: Path) -> None:
        self._child = child
        self.args = ["autotune", *argv]
        self.pid: int = child.pid  # type: ignore[attr-defined]
        self.out, self.err = out, err

    @property
    def returncode(self) -> int | None:
        return self._child.returncode  # type: ignore[attr-defined]

    def poll(self) -> int | None:
        self._child.wait_for(0)  # type: ignore[attr-defined]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            return self._child.wait()  # type: ignore[attr-defined]
        if not self._child.wait_for(timeout):  # type: ignore[attr-defined]
            raise subprocess.TimeoutExpired(self.args, timeout)
        return int(self.returncode)  # type: ignore[arg-type]

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL to the command's process group (it leads one), then reap it."""
        if self.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._child.wait()  # type: ignore[attr-defined]

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        return self.out.read_text(errors="replace"), self.err.read_text(errors="replace")


def start_cli(argv: Sequence[str], out: Path, err: Path, env: Mapping[str, str] | None = None,
              target: str = "autotune.cli:main", cwd: Path | None = None) -> CliProcess:
    """Start ``autotune ARGV`` forked from the fork server, stdout to ``out`` and stderr to ``err``, with
    ``env`` as its whole environment (default: this process's). ``target`` (``module:function``, called
    with ``argv``) may wrap the command, e.g. with a test's hook; ``cwd`` is its working folder (default: the
    fork server's)."""
    from autotune.probe.isolation import start_forked_call

    child_env = {**(os.environ if env is None else env), TARGET_ENV: target}
    child = start_forked_call("forked_cli:from_a_terminal", list(argv), str(out), str(err), child_env,
                              name="autotune-cli", cwd=None if cwd is None else str(cwd))
    return CliProcess(child, argv, Path(out), Path(err))


def from_a_terminal(argv: Sequence[str]) -> object:
    """In the forked child: the signal dispositions a command started from a terminal has (SIGINT raising
    ``KeyboardInterrupt``, the other stop signals at their default), whatever the test run inherited (a run
    started from a script's background job ignores SIGINT and SIGQUIT, and the fork server passes that on);
    then the target ``start_cli`` was given."""
    import importlib

    target = os.environ.pop(TARGET_ENV)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGQUIT, signal.SIGHUP, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(signum, signal.SIG_DFL)
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)(argv)
