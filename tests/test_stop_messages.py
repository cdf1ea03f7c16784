"""What a stop says is true: a stop before training's first step says nothing was trained (``autotune train`` and
``python -m autotune.trainer``, which now handles the stop signals as the CLI does), and a stop signal that a
process was started with as ignored (``nohup``: SIGHUP; a script's background job: SIGINT) stays ignored in every
handler autotune sets. In-process: the training call is replaced by one that delivers the signal to this process."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


class Unhandled(Exception):
    """Raised by the test's own handler: the command set none for the signal."""


def _unhandled(signum: int, _frame: object) -> None:
    raise Unhandled(signal.Signals(signum).name)


@pytest.fixture()
def handlers() -> Iterator[None]:
    """SIGINT as a terminal gives it, the other stop signals caught by the test (never ending pytest); restored."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _unhandled)
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def _cli(argv: list[str]) -> int:
    from autotune.cli import main

    return main(["train", *argv])


def _trainer(argv: list[str]) -> int:
    from autotune.trainer.__main__ import main

    return main(argv)


ENTRIES: dict[str, Callable[[list[str]], int]] = {"autotune-train": _cli, "python-m-autotune.trainer": _trainer}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_stop_before_the_first_step_says_nothing_was_trained(entry: str, signum: int, tmp_path: Path,
                                                               handlers: None, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    def stopped_while_checking_the_data(*_args: object, **_kwargs: object) -> dict:
        signal.raise_signal(signum)
        raise AssertionError("the signal did not stop the command")

    monkeypatch.setattr("autotune.trainer.runner.train", stopped_while_checking_the_data)
    code = ENTRIES[entry]([str(tmp_path / "unet_0"), "--device", "cpu"])
    lines = capsys.readouterr().err.splitlines()
    assert code == 128 + signum
    assert len(lines) == 1 and lines[0].startswith("autotune train: "), lines
    assert signal.Signals(signum).name in lines[0] and "nothing was trained" in lines[0], lines
    assert "saved" not in lines[0] and "--resume" not in lines[0], lines


def test_a_signal_ignored_from_the_start_stays_ignored(handlers: None) -> None:
    from autotune.stopping import stop_on_signals
    from autotune.trainer.stop import StopSignals

    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
    with stop_on_signals():
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_IGN, _unhandled)  # handled: not ignored
        with StopSignals(lambda n: n):
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGINT) != signal.default_int_handler  # the trainer's own
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN and signal.getsignal(signal.SIGTERM) == _unhandled
