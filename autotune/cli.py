"""The ``autotune`` command line: a thin shim over the library.

Each stage's subcommands live in ``autotune/commands/<stage>.py`` and register
themselves here. Nothing heavy (torch, monai, optuna) is imported until a
subcommand runs, so ``autotune --help`` answers at once. An ``AutotuneError``
becomes one line on stderr and its exit code (``EXIT_CODES``); never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from autotune.errors import AutotuneError
from autotune.version import __version__

# Stage modules, in the order their subcommands are listed in --help.
_COMMAND_MODULES = (
    "autotune.commands.data",
    "autotune.commands.bundles",
    "autotune.commands.probe",
    "autotune.commands.search",
    "autotune.commands.train",
)

EXIT_USAGE = 2
# What each exit code means; docs/cli.md lists the same.
EXIT_CODES = {
    0: "success",
    1: "failure (a trial crashed, some bundle could not be tuned, a plan does not hold)",
    2: "bad input: a file, key, value or option to fix",
    3: "out of memory under the tuned limit",
    4: "the host refused a write: disk full, quota, read-only or permission (HostWriteError)",
    5: "training diverged: the loss or gradients stayed non-finite (TrainingDiverged); a probe's steps did",
    130: "stopped by SIGINT (Ctrl-C)",
    138: "training stopped by SIGUSR1 after writing a checkpoint",
    143: "training stopped by SIGTERM after writing a checkpoint",
}


class _Parser(argparse.ArgumentParser):
    """argparse that exits with code 2 and one line, like every other input error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


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


# commands that stop on SIGTERM/SIGUSR1 with a line and 128 + the signal (autotune.stopping)
STOPPABLE = ("tune", "run", "worker", "verify")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (see ``EXIT_CODES``)."""
    parser = build_parser()
    args = parser.parse_args(_join_negative_values(list(sys.argv[1:] if argv is None else argv)))
    logging.basicConfig(
        level=logging.DEBUG if getattr(args, "verbose", False) else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_USAGE
    if getattr(args, "precision", None):  # reaches the probes' children through the environment
        from autotune.precision import PRECISION_ENV

        os.environ[PRECISION_ENV] = args.precision
    from autotune.stopping import Stopped, stop_on_signals

    try:
        if args.command in STOPPABLE:
            with stop_on_signals():
                return int(func(args) or 0)
        return int(func(args) or 0)
    except Stopped as exc:
        print(f"autotune {args.command}: {exc}; finished trials are stored (a trial in flight was failed), run the "
              "same command to continue", file=sys.stderr)
        return exc.exit_code
    except AutotuneError as exc:
        print(f"autotune {args.command}: {exc.label}: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print(f"autotune {args.command}: interrupted; finished work is saved, run the same command to resume",
              file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
