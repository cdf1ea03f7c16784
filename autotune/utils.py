"""Small shared helpers: YAML/JSON reading, plain data, sizes, lookup with suggestions.

Files are written through ``autotune.files`` (the one atomic write path).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import AutotuneError, ConfigError

__all__ = [
    "plain_data",
    "expand_path",
    "read_yaml",
    "read_json",
    "parse_bytes",
    "format_bytes",
    "look_up_option",
    "bars_enabled",
]


def bars_enabled(progress: bool) -> bool:
    """Progress bars only on a terminal: in a log file or a pipe each repaint would be a new line
    (one line per epoch or trial is printed there instead)."""
    import sys

    return bool(progress) and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


def plain_data(data: Any, *, str_keys: bool = False, str_other: bool = False) -> Any:
    """``data`` as plain Python types, so ``yaml.safe_dump`` and JSON take them.

    Enums become their value; subclasses of str, int, float (``torch.__version__``, numpy
    scalars) their base type; tuples lists; paths str; numpy arrays and tensors nested lists
    (``tolist``). Args: ``str_keys`` makes every mapping key a str; ``str_other`` turns any
    other object into ``str(obj)`` (else it is returned as it is).
    """
    if isinstance(data, Mapping):
        return {(str(plain_data(k)) if str_keys else plain_data(k)): plain_data(v, str_keys=str_keys, str_other=str_other)
                for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [plain_data(v, str_keys=str_keys, str_other=str_other) for v in data]
    if isinstance(data, Enum):
        return plain_data(data.value, str_keys=str_keys, str_other=str_other)
    if isinstance(data, bool) or data is None:
        return data
    for kind in (int, float, str):  # subclasses (np.float64, a version string) -> the base type
        if isinstance(data, kind):
            return kind(data)
    if isinstance(data, os.PathLike):
        return os.fspath(data)
    if hasattr(data, "tolist") and callable(data.tolist):  # numpy / torch scalars and arrays
        return plain_data(data.tolist(), str_keys=str_keys, str_other=str_other)
    if hasattr(data, "item") and callable(data.item):
        return plain_data(data.item(), str_keys=str_keys, str_other=str_other)
    return str(data) if str_other else data


def expand_path(path: str | os.PathLike[str], error: type[AutotuneError] = ConfigError, what: str = "path",
                instead: str = "the full path") -> Path:
    """``Path(path).expanduser()``; an unknown ``~user`` raises ``error`` instead of RuntimeError.

    The message reads ``{what} '{path}': cannot find the home folder of '~user'; give {instead}``.
    """
    path = Path(path)
    try:
        return path.expanduser()
    except RuntimeError as exc:
        raise error(f"{what} {str(path)!r}: cannot find the home folder of {path.parts[0]!r}; give {instead}") from exc


def _read_parsed(path: str | os.PathLike[str], error: type[AutotuneError], kind: str, parse: Callable[[str], Any],
                 syntax_error: type[Exception], where: Callable[[Any], str]) -> Any:
    """``parse`` of the UTF-8 text of ``path``; every problem raises ``error`` naming the file
    (``where`` gives the position of a ``syntax_error``)."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: file not found; check the path")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not a UTF-8 text file; give a {kind} file") from exc
    try:
        return parse(text)
    except syntax_error as exc:
        raise error(f"{path}: not valid {kind}{where(exc)}; fix the syntax") from exc
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        # yaml's constructors raise these on values such as "2020-13-45" or "!!int CT"; json on a
        # 5000-digit number or nesting too deep
        raise error(f"{path}: a value cannot be read as {kind} ({type(exc).__name__}: {str(exc)[:80]}); fix it") from exc


def _yaml_mark(exc: Any) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""


def read_yaml(path: str | os.PathLike[str], error: type[AutotuneError] = ConfigError) -> Any:
    """Read a YAML file with ``yaml.safe_load``; problems raise ``error`` naming the file."""
    return _read_parsed(path, error, "YAML", yaml.safe_load, yaml.YAMLError, _yaml_mark)


def read_json(path: str | os.PathLike[str], error: type[AutotuneError] = ConfigError) -> Any:
    """Read a JSON file; problems raise ``error`` naming the file and position."""
    return _read_parsed(path, error, "JSON", json.loads, json.JSONDecodeError,
                        lambda exc: f" (line {exc.lineno}, column {exc.colno}: {exc.msg})")


_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}


def parse_bytes(text: str | int | float, what: str = "memory size") -> int:
    """Parse ``'8GiB'``, ``'512MiB'``, ``'2.5GB'`` or a plain byte count into bytes.

    Raises:
        SpecError-like ``ConfigError`` subclass from the caller is not needed: raises
        ``autotune.errors.SpecError`` with the offending text.
    """
    from autotune.errors import SpecError

    if isinstance(text, bool):
        raise SpecError(f"{what}: {text!r} is not a size; write e.g. 8GiB or 512MiB")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        if str(text).strip().startswith("-"):
            raise SpecError(f"{what}: {text!r} must be a positive size; write e.g. 8GiB or 512MiB")
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
        if not match or match.group(2).lower() not in _UNITS:
            raise SpecError(f"{what}: {text!r} is not a size; write e.g. 8GiB, 512MiB or 2GB")
        value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value <= 0:
        raise SpecError(f"{what}: {text!r} must be a positive size")
    return int(value)


def format_bytes(num: float | int | None) -> str:
    """Human-readable binary size, e.g. ``1.50 GiB``; ``-`` for None."""
    if num is None:
        return "-"
    value = float(num)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"


def look_up_option(name: str, valid: Iterable[str], what: str, error: type[AutotuneError] = ConfigError) -> str:
    """Return ``name`` if valid, else raise ``error`` listing the valid names and a close match."""
    choices = list(valid)
    if name in choices:
        return name
    close = difflib.get_close_matches(str(name), choices, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise error(f"unknown {what} {name!r}{hint}; valid: {', '.join(choices)}")
