"""Running the CLI in-process on hostile input, and what such a run must keep: a documented exit code, no
traceback, no file outside the work folder changed, no earlier good file inside it changed."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from autotune.cli import EXIT_CODES, EXIT_INTERNAL, main


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """YAML of ``levels`` levels of ``width`` aliases: about 1 KB standing for width**levels values."""
    lines = [f"bomb0: &bomb0 [{', '.join(['lol'] * width)}]"]
    lines += [f"bomb{i}: &bomb{i} [{', '.join([f'*bomb{i - 1}'] * width)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


@dataclass
class Outcome:
    """One in-process run: the exit code and what it printed."""

    code: int
    out: str
    err: str
    logged_tracebacks: list[str]

    @property
    def text(self) -> str:
        return self.out + self.err


class _Tracebacks(logging.Handler):
    """Log records that carry a traceback (``logger.exception`` or ``exc_info=True``)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.found.append(f"{record.name}: {record.getMessage()}")


def run_cli(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> Outcome:
    """``autotune.cli.main(argv)`` in this process; a ``SystemExit`` (``--help``) counts as its code."""
    capsys.readouterr()
    handler = _Tracebacks()
    logging.getLogger().addHandler(handler)
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        logging.getLogger().removeHandler(handler)
    captured = capsys.readouterr()
    return Outcome(int(code), captured.out, captured.err, handler.found)


def snapshot(*roots: Path) -> dict[str, tuple[int, str]]:
    """Every file under ``roots``: its size and content hash (equal snapshots: nothing written)."""
    found: dict[str, tuple[int, str]] = {}
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                found[str(path)] = (len(data), hashlib.sha256(data).hexdigest())
    return found


def assert_refused_cleanly(outcome: Outcome, argv: Sequence[str], *, exit_two: bool = True) -> None:
    """A documented exit code (2 with ``exit_two``), never the internal-error code, one line on stderr for a
    refusal, and no traceback printed or logged."""
    assert outcome.code in EXIT_CODES, (outcome.code, argv, outcome.err)
    assert outcome.code != EXIT_INTERNAL, (argv, outcome.err)
    assert "Traceback" not in outcome.text, (argv, outcome.text)
    assert not outcome.logged_tracebacks, (argv, outcome.logged_tracebacks)
    if exit_two:
        assert outcome.code == 2, (argv, outcome.code, outcome.text[-600:])
    if outcome.code == 2:
        assert outcome.err.endswith("\n") and outcome.err.count("\n") == 1, (argv, outcome.err)
        assert outcome.err.startswith(f"autotune {argv[0]}: "), (argv, outcome.err)


def run_checked(argv: Sequence[str], work: Path, capsys: pytest.CaptureFixture[str]) -> Outcome:
    """``autotune ARGV`` run in ``work``, its outcome held to the properties every hostile input keeps:
    a documented code, 0 or 2, one line, no traceback."""
    with inside(work):
        outcome = run_cli(argv, capsys)
    assert_refused_cleanly(outcome, argv, exit_two=False)
    assert outcome.code in (0, 2), outcome.text
    return outcome


def assert_unchanged(before: dict[str, tuple[int, str]], after: dict[str, tuple[int, str]], what: str) -> None:
    """No file of ``before`` changed or vanished (``what`` says where, for the message)."""
    changed = sorted(path for path, stamp in before.items() if after.get(path) != stamp)
    assert not changed, f"{what} changed: {changed[:5]}"


@contextlib.contextmanager
def inside(folder: Path) -> Iterator[None]:
    """Run with ``folder`` as the working folder (the default storage, studies/, lands there)."""
    previous = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(previous)


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    """Set environment variables for the block, then put back what was there."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
