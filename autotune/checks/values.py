"""Checkers of single values from outside: numbers, integers, flags, names from a list, text.

Each checker takes the value as read (from a config file, a command-line option or an
environment variable), ``where`` (what names it in the message: ``--port``,
``FILE: key 'learning_rate'``, ``AUTOTUNE_PRECISION``; empty for an argparse option, whose
name argparse adds) and the error class to raise, and returns the value in the form autotune
keeps. A refused value is one line: where, what was given and what is allowed
(``refuse``). The frozen dataclasses (``Integer``, ``Number``, ...) bind a checker to its
limits, so a table of keys can say what each key must hold.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NoReturn

from autotune.errors import AutotuneError, ConfigError

__all__ = ["Error", "refuse", "shown", "number", "integer", "flag", "choice", "text", "Number", "Integer", "Flag",
           "Choice", "Text", "Items", "Triple", "is_number"]

Error = type[AutotuneError]
_SHOWN_CHARS = 60
_INT_TEXT = re.compile(r"[+-]?[0-9]{1,19}")  # what int() reads, below its 4300-digit limit and 2**63
# ASCII only (float() also reads other scripts' digits and "1_0"); nan and inf are read, then refused as not finite
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]{1,400}\.?[0-9]{0,400}|\.[0-9]{1,400})(?:[eE][+-]?[0-9]{1,4})?|[+-]?(?:nan|inf|infinity)",
                         re.IGNORECASE)
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def shown(value: Any) -> str:
    """``repr(value)``, cut to a length that keeps the message one short line."""
    text_ = repr(value)
    return text_ if len(text_) <= _SHOWN_CHARS else text_[: _SHOWN_CHARS - 3] + "..."


def refuse(error: Error, where: str, value: Any, rule: str) -> NoReturn:
    """Raise ``error``: ``{where}: got {value}; {rule}`` (``rule`` says what is allowed)."""
    head = f"{where}: " if where else ""
    raise error(f"{head}got {shown(value)}; {rule}")


def is_number(value: Any) -> bool:
    """An int or float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _span(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    """Words for a range: ``above 0``, ``from 0 to 1``, ``at least 0 and below 1``."""
    def fmt(x: float) -> str:
        return str(x) if isinstance(x, int) else f"{x:g}"

    lower = None if low is None else f"above {fmt(low)}" if low_open else f"at least {fmt(low)}"
    upper = None if high is None else f"below {fmt(high)}" if high_open else f"at most {fmt(high)}"
    if low is not None and high is not None:
        return f"from {fmt(low)} to {fmt(high)}" if not (low_open or high_open) else f"{lower} and {upper}"
    return lower or upper or ""


def number(value: Any, where: str, *, low: float | None = None, high: float | None = None, low_open: bool = False,
           high_open: bool = False, error: Error = ConfigError, unit: str = "", text: bool = True) -> float:
    """A finite number within the range, returned as float. With ``text`` (an option, an environment
    variable) the text of a number in ASCII digits is read too; a config file's value must be a number."""
    span = _span(low, high, low_open, high_open)
    rule = f"must be a finite number{f' of {unit}' if unit else ''}{' ' + span if span else ''}"
    if isinstance(value, bool):
        refuse(error, where, value, rule)
    try:
        result = float(value) if is_number(value) else float(value.strip()) if (
            text and isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip())) else None
    except (ValueError, OverflowError):
        result = None
    if result is None or not math.isfinite(result):
        refuse(error, where, value, rule)
    if ((low is not None and (result < low or (low_open and result == low)))
            or (high is not None and (result > high or (high_open and result == high)))):
        refuse(error, where, value, rule)
    return result


def integer(value: Any, where: str, *, low: int | None = None, high: int | None = None,
            error: Error = ConfigError, unit: str = "", text: bool = True) -> int:
    """A whole number within the range (an int; with ``text``, also text of ASCII digits); a float or bool is
    refused."""
    span = _span(low, high, False, False)
    rule = f"must be a whole number{' ' + span if span else ''}{f' ({unit})' if unit else ''}"
    if text and isinstance(value, str) and _INT_TEXT.fullmatch(value.strip()):
        result = int(value.strip())
    elif isinstance(value, int) and not isinstance(value, bool):
        result = value
    else:
        refuse(error, where, value, rule)
    if (low is not None and result < low) or (high is not None and result > high):
        refuse(error, where, value, rule)
    return result


def flag(value: Any, where: str, *, error: Error = ConfigError, words: bool = False) -> bool:
    """true or false; with ``words`` also the text 1/0, true/false, yes/no, on/off (an environment variable)."""
    if isinstance(value, bool):
        return value
    if words and isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    refuse(error, where, value, "must be true or false" + (" (or 1/0, yes/no, on/off)" if words else ""))


def choice(value: Any, valid: Iterable[str], what: str, error: Error = ConfigError, *, where: str = "",
           fold_case: bool = False) -> str:
    """``value`` if it is one of ``valid`` (with ``fold_case``, in any letter case), else ``error`` listing
    the valid names and a close match: ``[where: ]unknown {what} 'x' (did you mean 'y'?); valid: ...``."""
    choices = list(valid)
    name = value.strip().lower() if fold_case and isinstance(value, str) else value
    if isinstance(name, str) and name in choices:
        return name
    close = difflib.get_close_matches(str(name), choices, n=1) if isinstance(name, str) else []
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    head = f"{where}: " if where else ""
    raise error(f"{head}unknown {what} {shown(value)}{hint}; valid: {', '.join(choices)}")


def text(value: Any, where: str, *, error: Error = ConfigError, max_chars: int = 4096) -> str:
    """Non-empty text without control characters (a name, a label, a host)."""
    if not isinstance(value, str) or not value.strip() or len(value) > max_chars \
            or any(ord(c) < 32 or ord(c) == 127 for c in value):
        refuse(error, where, value, f"must be non-empty text of at most {max_chars} characters, without control "
                                    "characters")
    return value


@dataclass(frozen=True)
class Number:
    """A finite number in a range, as a config file holds it: a number, not text (see ``number``)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __call__(self, value: Any, where: str, error: Error = ConfigError) -> float:
        return number(value, where, low=self.low, high=self.high, low_open=self.low_open, high_open=self.high_open,
                      error=error, text=False)


@dataclass(frozen=True)
class Integer:
    """A whole number in a range, as a config file holds it: an int, not text (see ``integer``)."""

    low: int | None = None
    high: int | None = None

    def __call__(self, value: Any, where: str, error: Error = ConfigError) -> int:
        return integer(value, where, low=self.low, high=self.high, error=error, text=False)


@dataclass(frozen=True)
class Flag:
    """true or false (see ``flag``)."""

    def __call__(self, value: Any, where: str, error: Error = ConfigError) -> bool:
        return flag(value, where, error=error)


@dataclass(frozen=True)
class Choice:
    """One of a few names (see ``choice``)."""

    valid: tuple[str, ...]
    what: str = "value"

    def __call__(self, value: Any, where: str, error: Error = ConfigError) -> str:
        return choice(value, self.valid, self.what, error, where=where)


@dataclass(frozen=True)
class Text:
    """Non-empty text (see ``text``)."""

    def __call__(self, value: Any, where: str, error: Error = ConfigError) -> str:
        return text(value, where, error=error)


@dataclass(frozen=True)
class Items:
    """A list of ``length`` values, each checked by ``item``; ``meaning`` says what they stand for."""

    item: Number | Integer
    length: int = 3
    meaning: str = "one per axis"

    def __call__(self, value: Any, where: str, error: Error = ConfigError) -> list[Any]:
        if not (isinstance(value, list) and len(value) == self.length):
            kind = "whole numbers" if isinstance(self.item, Integer) else "finite numbers"
            span = _span(self.item.low, self.item.high, getattr(self.item, "low_open", False),
                         getattr(self.item, "high_open", False))
            words = {2: "two", 3: "three"}.get(self.length, str(self.length))
            refuse(error, where, value, f"must be {words} {kind}{' ' + span if span else ''}, {self.meaning}")
        return [self.item(v, f"{where}[{i}]", error) for i, v in enumerate(value)]


def Triple(item: Number | Integer) -> Items:  # noqa: N802 - reads as the type it makes
    """Three values, one per spatial axis."""
    return Items(item, 3, "one per axis")
