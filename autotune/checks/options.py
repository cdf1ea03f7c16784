"""Command-line option types: the checkers of ``autotune.checks`` as argparse ``type=`` callables.

argparse calls the type on the option's text while it parses, so a refused value ends the
command before any work with argparse's one line, ``autotune CMD: error: argument --port: got
'70000'; must be a whole number from 1 to 65535 (a TCP port)``, exit code 2.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TypeVar

from autotune.checks import places, units, values
from autotune.errors import AutotuneError, SpecError

__all__ = ["option_type", "positive_int", "count", "seconds", "fraction", "size", "duration", "device", "port",
           "host", "storage", "as_given", "existing_path", "path_text", "size_text", "int_list", "names"]

T = TypeVar("T")


def option_type(check: Callable[..., T], name: str, **limits: Any) -> Callable[[str], T]:
    """``check(text, "", error=SpecError, **limits)`` as an argparse type named ``name``."""
    def convert(text: str) -> T:
        try:
            return check(text, "", error=SpecError, **limits)
        except AutotuneError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = name
    return convert


def positive_int(high: int = 1_000_000) -> Callable[[str], int]:
    """A whole number from 1 to ``high``."""
    return option_type(values.integer, "positive integer", low=1, high=high)


def count(low: int = 0, high: int = 1_000_000) -> Callable[[str], int]:
    """A whole number from ``low`` to ``high``."""
    return option_type(values.integer, "integer", low=low, high=high)


def seconds(high: float = units.MAX_SECONDS) -> Callable[[str], float]:
    """A number of seconds above 0."""
    return option_type(values.number, "seconds", low=0.0, low_open=True, high=high, unit="seconds")


def fraction() -> Callable[[str], float]:
    """A share from 0 up to (not including) 1."""
    return option_type(values.number, "fraction", low=0.0, high=1.0, high_open=True)


size = option_type(units.byte_size, "size")
duration = option_type(units.duration, "duration")
device = option_type(places.device, "device")
port = option_type(places.port, "port")
host = option_type(places.host, "host")
storage = option_type(places.storage_url, "storage URL")


def as_given(check: Callable[[str], Any]) -> Callable[[str], str]:
    """An argparse type that checks the text with ``check`` and keeps the text as given."""
    def convert(text: str) -> str:
        check(text)
        return text

    convert.__name__ = getattr(check, "__name__", "value")
    return convert


def existing_path(kind: str = "any") -> Callable[[str], str]:
    """A path that exists (a ``file``, a ``folder`` or ``any``), kept as the text given."""
    return as_given(option_type(places.path, "path", kind=kind, exists=True))


path_text = as_given(option_type(places.path, "path"))  # a path to write to or to look for later
size_text = as_given(size)  # a size kept as written (it names a planned GPU)


def int_list(low: int = 0, high: int = 1_000_000) -> Callable[[str], list[int]]:
    """Comma-separated whole numbers from ``low`` to ``high`` (``--folds 0,2``)."""
    def convert(text: str) -> list[int]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"got {text!r}; must be comma-separated whole numbers")
        return [count(low, high)(item) for item in items]

    convert.__name__ = "list"
    return convert


def names(valid: tuple[str, ...], what: str) -> Callable[[str], str]:
    """Comma-separated names from ``valid`` (``--phases train,infer``), each at most once, joined by commas."""
    def convert(text: str) -> str:
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"got {text!r}; must be comma-separated from {', '.join(valid)}")
        try:
            found = [values.choice(item, valid, what, SpecError) for item in items]
        except AutotuneError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return ",".join(dict.fromkeys(found))

    convert.__name__ = "list"
    return convert
