"""Checkers of sizes and durations written with units: ``8GiB``, ``512MiB``, ``30m``, ``2h``."""

from __future__ import annotations

import math
import re
from typing import Any

from autotune.checks.values import Error, is_number, refuse
from autotune.errors import SpecError

__all__ = ["byte_size", "duration", "MAX_BYTES", "MAX_SECONDS"]

_BYTE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SECOND_UNITS = {"": 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_AMOUNT = r"\s*([0-9]{1,30}(?:\.[0-9]{1,30})?|\.[0-9]{1,30})\s*([A-Za-z]*)\s*"
MAX_BYTES = 1024**5  # 1 PiB: far beyond any device; larger is a typo
MAX_SECONDS = 366 * 86400.0  # a year


def byte_size(value: Any, where: str, *, error: Error = SpecError) -> int:
    """``'8GiB'``, ``'512MiB'``, ``'2.5GB'`` or a plain byte count -> bytes (a positive whole number up to 1 PiB)."""
    if isinstance(value, bool):
        refuse(error, where, value, "not a size: write e.g. 8GiB or 512MiB")
    if is_number(value):
        amount = float(value) if math.isfinite(float(value)) else math.nan
    elif isinstance(value, str):
        if value.strip().startswith("-"):
            refuse(error, where, value, "must be a positive size, e.g. 8GiB or 512MiB")
        match = re.fullmatch(_AMOUNT, value)
        if not match or match.group(2).lower() not in _BYTE_UNITS:
            refuse(error, where, value, "not a size: write e.g. 8GiB, 512MiB or 2GB")
        amount = float(match.group(1)) * _BYTE_UNITS[match.group(2).lower()]
    else:
        refuse(error, where, value, "not a size: write e.g. 8GiB or 512MiB")
    if not math.isfinite(amount) or amount < 1:
        refuse(error, where, value, "must be a positive size, e.g. 8GiB or 512MiB")
    if amount > MAX_BYTES:
        refuse(error, where, value, "must be a size of at most 1 PiB, e.g. 8GiB or 512MiB")
    return int(amount)


def duration(value: Any, where: str, *, error: Error = SpecError) -> float:
    """``'30m'``, ``'2h'``, ``'90s'``, ``'1.5h'`` or plain seconds -> seconds (above 0, at most a year)."""
    rule = "must be a duration above 0 and at most a year, e.g. 90s, 30m, 2h or plain seconds"
    unreadable = "not a duration: write e.g. 90s, 30m, 2h or plain seconds, a duration above 0 and at most a year"
    if isinstance(value, bool):
        refuse(error, where, value, unreadable)
    if is_number(value):
        seconds = float(value)
    elif isinstance(value, str):
        match = re.fullmatch(_AMOUNT, value.lower())
        if not match or match.group(2) not in _SECOND_UNITS:
            refuse(error, where, value, unreadable)
        seconds = float(match.group(1)) * _SECOND_UNITS[match.group(2)]
    else:
        refuse(error, where, value, unreadable)
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_SECONDS:
        refuse(error, where, value, rule)
    return seconds
