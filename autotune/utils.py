"""Small shared helpers: YAML/JSON reading, plain data, sizes, lookup with suggestions.

Files are written through ``autotune.files`` (the one atomic write path).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from autotune.checks.bounded_yaml import check_size, load_yaml
from autotune.checks.places import expand_path
from autotune.checks.units import byte_size
from autotune.checks.values import choice
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


def _read_parsed(path: str | os.PathLike[str], error: type[AutotuneError], kind: str,
                 parse: Callable[[str, str, type[AutotuneError]], Any], syntax_error: type[Exception],
                 where: Callable[[Any], str]) -> Any:
    """``parse(text, path, error)`` of the UTF-8 text of ``path``; every problem raises ``error`` naming the
    file (``where`` gives the position of a ``syntax_error``). A file over ``MAX_FILE_BYTES`` is not read."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: file not found; check the path")
    check_size(path, str(path), error)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not a UTF-8 text file; give a {kind} file") from exc
    try:
        return parse(text, str(path), error)
    except syntax_error as exc:
        raise error(f"{path}: not valid {kind}{where(exc)}; fix the syntax") from exc
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        # yaml's constructors raise these on values such as "2020-13-45" or "!!int CT"; json on a
        # 5000-digit number or nesting too deep
        raise error(f"{path}: a value cannot be read as {kind} ({type(exc).__name__}: {str(exc)[:80]}); fix it") from exc


def _yaml_mark(exc: Any) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = " ".join(str(getattr(exc, "problem", "") or "").split())
    if mark is None:
        return f" ({problem})" if problem else ""
    return f" (line {mark.line + 1}, column {mark.column + 1}{': ' + problem if problem else ''})"


def read_yaml(path: str | os.PathLike[str], error: type[AutotuneError] = ConfigError) -> Any:
    """Read a YAML file as plain data within limits (``autotune.checks.bounded_yaml``: size, values after
    alias expansion, nesting; no dates or other non-plain types); problems raise ``error`` naming the file."""
    return _read_parsed(path, error, "YAML", load_yaml, yaml.YAMLError, _yaml_mark)


def read_json(path: str | os.PathLike[str], error: type[AutotuneError] = ConfigError) -> Any:
    """Read a JSON file; problems raise ``error`` naming the file and position."""
    return _read_parsed(path, error, "JSON", lambda text, _where, _error: json.loads(text), json.JSONDecodeError,
                        lambda exc: f" (line {exc.lineno}, column {exc.colno}: {exc.msg})")


def parse_bytes(text: str | int | float, what: str = "memory size") -> int:
    """Parse ``'8GiB'``, ``'512MiB'``, ``'2.5GB'`` or a plain byte count into bytes (``autotune.checks.byte_size``).

    Raises:
        SpecError: not a positive size of at most 1 PiB; the message names ``what``.
    """
    return byte_size(text, what)


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
    """Return ``name`` if valid, else raise ``error`` listing the valid names and a close match
    (``autotune.checks.choice``)."""
    return choice(name, valid, what, error)
