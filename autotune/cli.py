"""The ``autotune`` command line: a thin shim over the library.

Each stage's subcommands live in ``autotune/commands/<stage>.py`` and register
themselves here. Nothing heavy (torch, monai, optuna) is imported until a
subcommand runs, so ``autotune --help`` answers at once. An ``AutotuneError``
becomes one line on stderr and its exit code (``EXIT_CODES``); never a traceback. Every
option is checked as it is parsed (``autotune.checks.options``) and every ``AUTOTUNE_*``
setting before the command runs (``autotune.checks.environment``). Any other exception is a
bug: one line names the command and a file holding the full traceback, exit code 70.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence

from autotune.errors import AutotuneError
from autotune.trainer.stop import BEFORE_TRAINING
from autotune.version import __version__

# Stage modules, in the order their subcommands are listed in --help.
_COMMAND_MODULES = (
    "autotune.commands.data",
    "autotune.commands.bundles",
    "autotune.commands.probe",
    "autotune.commands.search",
    "autotune.commands.train",
    "autotune.commands.calibrate",
)

EXIT_USAGE = 2
EXIT_INTERNAL = 70  # sysexits.h EX_SOFTWARE: a bug in autotune, not the input
# What each exit code means; docs/cli.md lists the same.
EXIT_CODES = {
    0: "success",
    1: "failure (a trial crashed, some bundle could not be tuned, a plan does not hold)",
    2: "bad input: a file, key, value or option to fix",
    3: "out of memory under the tuned limit",
    4: "the host refused a write: disk full, quota, read-only or permission (HostWriteError)",
    5: "training diverged: the loss or gradients stayed non-finite (TrainingDiverged); a probe's steps did",
    70: "internal error: a bug in autotune (the line names a file holding the traceback; please report it)",
    129: "stopped by SIGHUP (a closed terminal or SSH session); train after writing a checkpoint",
    130: "stopped by SIGINT (Ctrl-C); train after writing a checkpoint",
    138: "stopped by SIGUSR1; train after writing a checkpoint",
    143: "stopped by SIGTERM; train after writing a checkpoint",
}


class _Parser(argparse.ArgumentParser):
    """argparse that exits with code 2 and one line, like every other input error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> object:
        # argparse drops a lone '--' given as ``--opt=--`` and stores [] without calling the option's type
        if action.option_strings and action.nargs is None and arg_strings == ["--"]:
            self.error(f"argument {'/'.join(action.option_strings)}: expected one argument, got '--'")
        return super()._get_values(action, arg_strings)


def build_parser() -> argparse.ArgumentParser:
    """Build the full parser with every stage's subcommands."""
    parser = _Parser(
        prog="autotune",
        description=(
            "Generate MONAI training bundles (SegResNet, DiNTS, UNet) from a dataset, tune their batch and "
            "sliding-window sizes to the GPU's memory with measured trials, and train them fast."
        ),
    )
    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="show debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a stage not built yet in a partial checkout
            if exc.name != name:
                raise
            continue
        module.register(sub)
    return parser


def _join_negative_values(argv: list[str]) -> list[str]:
    """``--memory-limit -1GiB`` as ``--memory-limit=-1GiB``: argparse takes a value that starts with ``-`` and
    is not a plain number for an option ("expected one argument"); joined, the option's own check names the
    real fault (a size must be positive)."""
    out: list[str] = []
    for token in argv:
        if (out and out[-1].startswith("--") and "=" not in out[-1] and len(token) > 1 and token[0] == "-"
                and (token[1].isdigit() or token[1] == ".")):
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


# What a command stopped by SIGTERM, SIGHUP or SIGUSR1 says after "stopped by SIG...; " (autotune.stopping),
# and by SIGINT after "interrupted by SIGINT; "; every command stops so, with 128 + the signal. autotune train stops inside its epochs with a checkpoint
# (autotune.trainer.stop); this line is for a stop before them.
_SEARCH_STOPPED = "finished trials are stored (a trial in flight was failed), run the same command to continue"
STOPPED_LINES = {
    "tune": _SEARCH_STOPPED, "run": _SEARCH_STOPPED, "worker": _SEARCH_STOPPED, "verify": _SEARCH_STOPPED,
    "probe": "the trial's processes were ended; nothing was written",
    "estimate": "nothing was written",
    "proxy": "the proxy stopped: its workers retry for AUTOTUNE_STORAGE_RETRY_SECONDS; start it again on the same "
             "port for them to continue",
    "train": BEFORE_TRAINING,
    "infer": "the predictions already written are whole; run the same command again to predict every image",
}
_STOPPED_OTHERWISE = "every file written is whole; run the same command again"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (see ``EXIT_CODES``); ``--help`` and ``--version`` exit with 0
    (``SystemExit``), as argparse does."""
    parser = build_parser()
    try:
        args = parser.parse_args(_join_negative_values(list(sys.argv[1:] if argv is None else argv)))
    except SystemExit as exc:  # --help and --version exit 0 as argparse does; a usage error is returned
        if exc.code in (0, None):
            raise
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    logging.basicConfig(
        level=logging.DEBUG if getattr(args, "verbose", False) else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return _run(args, func)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: a bug, reported in one line
        return _internal_error(args.command, exc)


def _run(args: argparse.Namespace, func: Callable[[argparse.Namespace], int | None]) -> int:
    """The command's handler, with its ``AutotuneError`` (bad input, host faults), a stop or Ctrl-C as one line."""
    from autotune.stopping import Stopped, stop_on_signals

    try:
        from autotune.checks.environment import check_environment

        check_environment()
        if getattr(args, "precision", None):  # reaches the probes' children through the environment
            from autotune.precision import PRECISION_ENV

            os.environ[PRECISION_ENV] = args.precision
        with stop_on_signals():
            return int(func(args) or 0)
    except Stopped as exc:
        print(f"autotune {args.command}: {exc}; {STOPPED_LINES.get(args.command, _STOPPED_OTHERWISE)}",
              file=sys.stderr)
        return exc.exit_code
    except AutotuneError as exc:
        print(f"autotune {args.command}: {exc.label}: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt as exc:  # Ctrl-C; a trainer stopped at once by a second signal says what it kept
        print(f"autotune {args.command}: interrupted by SIGINT; "
              f"{str(exc) or STOPPED_LINES.get(args.command, _STOPPED_OTHERWISE)}", file=sys.stderr)
        return 130


def _internal_error(command: str, exc: BaseException) -> int:
    """Write the traceback of ``exc`` to a file, say in one line where it is, return ``EXIT_INTERNAL``."""
    import tempfile
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        handle, path = tempfile.mkstemp(prefix=f"autotune-{command}-", suffix=".traceback.txt")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(f"autotune {__version__}, command line: {sys.argv!r}\n{text}")
        where = f"the full traceback is in {path}"
    except OSError as write_error:  # nowhere to write: the type and message must do
        where = f"the traceback could not be written ({write_error.strerror})"
    message = " ".join(str(exc).split())[:200]
    print(f"autotune {command}: internal error (a bug in autotune, not in your input): {type(exc).__name__}: "
          f"{message}; {where}; please report it with that file", file=sys.stderr)
    return EXIT_INTERNAL


def entry() -> None:
    """The ``autotune`` program (``python -m autotune`` and the console script): ``main``, then the exit.

    Once the command has returned, its output printed and its files closed, the process exits without
    the interpreter's teardown: with torch, MONAI and Optuna loaded that teardown took 2.4-7.6 s after
    ``autotune tune``'s last line on a 2-core CPU (no Python frame runs in it) and longer on a GPU host,
    where the GPU check's tune was killed at its time limit after printing its summary. Python's exit
    handlers still run (logging's flush, multiprocessing's children); ``main`` itself returns normally,
    so callers in Python (the tests) are unaffected."""
    import atexit

    code = main()
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing more can be said
                pass
        os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
