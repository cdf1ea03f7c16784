"""CLI subcommands, one module per stage; each exposes ``register(subparsers)``.

Handlers take the parsed ``argparse.Namespace``, call the library (``autotune.pipeline``,
``autotune.data``, ``autotune.trainer``, ``autotune.probe``), print, and return an exit code.
They import the library (and so torch) only when they run. Nothing outside the CLI
imports this package.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["Handler", "add_command", "add_precision_arg", "progress_printer"]

Handler = Callable[[argparse.Namespace], int]


def add_command(
    sub: argparse._SubParsersAction,
    name: str,
    handler: Handler,
    *builders: Callable[[argparse.ArgumentParser], None],
    quiet: str | None = None,
    **parser_options: Any,
) -> argparse.ArgumentParser:
    """Add subcommand ``name`` run by ``handler``; ``builders`` add its options, then ``--quiet``
    (``-q``) with the help text ``quiet`` when one is given.

    ``parser_options`` go to ``add_parser``. As in click, ``help`` (the line in ``autotune --help``)
    and ``description`` default to the handler's docstring: its first line, less the final period
    and with a lower-case first letter, and the paragraphs after it.
    """
    summary, _, body = inspect.cleandoc(handler.__doc__ or "").partition("\n\n")
    parser_options.setdefault("help", summary[:1].lower() + summary[1:].rstrip("."))
    parser_options.setdefault("description", " ".join(body.split()) or None)
    parser = sub.add_parser(name, **parser_options)
    for build in builders:
        build(parser)
    if quiet is not None:
        parser.add_argument("--quiet", "-q", action="store_true", help=quiet)
    parser.set_defaults(func=handler)
    return parser


def add_precision_arg(p: argparse.ArgumentParser) -> None:
    """``--precision``: sets ``AUTOTUNE_PRECISION`` for this process and its probes (``autotune.precision``)."""
    p.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default=None,
                   help="compute precision: auto (default: fp16 autocast on CUDA, bf16 on a CPU that runs it "
                        "natively, else fp32; amp: false bundles fp32) or force one; same as AUTOTUNE_PRECISION")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def progress_printer(args: argparse.Namespace) -> Callable[[str], None] | None:
    """Progress lines to stderr, or None (silence) with ``--quiet``."""
    return None if getattr(args, "quiet", False) else _stderr
