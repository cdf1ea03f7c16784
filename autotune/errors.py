"""Errors that autotune raises for problems a user can fix.

Every message is one line that names the file, key or value at fault and says
what to do. The CLI prints the message and exits with code 2; it never shows a
traceback for these.
"""

from __future__ import annotations

__all__ = [
    "AutotuneError",
    "InputError",
    "DataError",
    "ConfigError",
    "SpecError",
    "ProbeError",
    "StorageError",
    "TrainingOutOfMemory",
]


class AutotuneError(Exception):
    """Base class: a problem with the user's input or environment, not a bug."""

    exit_code = 2  # the CLI's exit code for this error

    def __init__(self, message: str) -> None:
        # Keep messages to one line: the CLI prints exactly this.
        super().__init__(" ".join(str(message).split()))


class InputError(AutotuneError):
    """A data source (input.yaml, datalist JSON or Decathlon folder) is missing or malformed."""


class DataError(AutotuneError):
    """An image or label file is missing, unreadable, corrupt or inconsistent."""


class ConfigError(AutotuneError):
    """A bundle config or template is missing, malformed or holds an invalid value."""


class SpecError(AutotuneError):
    """Tuning specs (ranges, trial counts, devices, memory limits) are invalid."""


class ProbeError(AutotuneError):
    """A probe or estimate could not be run as asked."""


class StorageError(AutotuneError):
    """The Optuna storage cannot be reached or used."""


class TrainingOutOfMemory(AutotuneError):
    """Training ran out of memory under its limit (CLI exit code 3); the last finished epoch is saved."""

    exit_code = 3
