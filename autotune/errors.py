"""Errors that autotune raises for problems a user can fix.

Every message is one line that names the file, key or value at fault and says
what to do. The CLI prints the message and exits with the error's ``exit_code``
(2 unless a subclass says otherwise); it never shows a traceback for these.
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
    "HostWriteError",
    "TrainingStopped",
    "TrainingDiverged",
]


class AutotuneError(Exception):
    """Base class: a problem with the user's input or environment, not a bug."""

    exit_code = 2  # the CLI's exit code for this error
    label = "error"  # the word the CLI prints before the message

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


class HostWriteError(AutotuneError):
    """The host refused a write (no space, quota exceeded, read-only or no permission), or would:
    not enough free space for what a run is about to write (CLI exit code 4).

    Built from the details (see ``autotune.files.refused``), the one line says what was being
    written, where, why, about how many bytes it needed and how many are free (``sizes``, already
    in words), what was kept, and what to run next. ``with_outcome`` adds the last two where the
    caller knows them (the last good checkpoint, the predictions already written). Built from a
    message alone, it is that message.
    """

    exit_code = 4

    def __init__(self, message: str = "", *, what: str = "", path: str = "", reason: str = "", sizes: str = "",
                 kept: str = "", then: str = "") -> None:
        self.what, self.path, self.reason, self.sizes, self.kept, self.then = what, path, reason, sizes, kept, then
        super().__init__(message or (
            f"cannot write {what} {path}: {reason}{f' ({sizes})' if sizes else ''}; kept: {kept or 'nothing'}; "
            f"{then or 'free space (or choose another folder) and run the same command again'}"))

    def with_outcome(self, *, kept: str | None = None, then: str | None = None) -> HostWriteError:
        """The same refusal with what was kept and what to run next (unchanged where None)."""
        return HostWriteError(what=self.what, path=self.path, reason=self.reason, sizes=self.sizes,
                              kept=self.kept if kept is None else kept, then=self.then if then is None else then)


class TrainingStopped(AutotuneError):
    """Training stopped on a signal (SIGTERM, SIGINT, SIGUSR1) after writing a checkpoint to resume from.

    The exit code is the shell's for that signal, 128 + its number (143, 130, 138), so a
    scheduler that requeues on a signal's code sees the usual one.
    """

    label = "stopped"

    def __init__(self, message: str, exit_code: int = 143) -> None:
        self.exit_code = int(exit_code)
        super().__init__(message)


class TrainingDiverged(AutotuneError):
    """Training diverged: the loss or gradients were non-finite in ``NONFINITE_PATIENCE`` steps in a row
    (none of them reached the weights; ``autotune.finite``), or an optimizer step left the weights
    non-finite. The run stops before writing them (CLI exit code 5); the last finite checkpoint and
    ``best.pt`` are kept."""

    exit_code = 5
    label = "diverged"
