"""A disk that fills up, for tests of the write path: files opened through ``autotune.files`` start
refusing writes with ``OSError(ENOSPC)`` at a chosen file, as a full file system would."""

from __future__ import annotations

import builtins
import errno
import os
from typing import Any


class _RefusingFile:
    """A file whose every write and flush fails with ENOSPC (what a full file system answers)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def write(self, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def flush(self) -> None:
        self.handle.flush()

    def fileno(self) -> int:
        return self.handle.fileno()

    def close(self) -> None:
        self.handle.close()

    def __enter__(self) -> _RefusingFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.handle.close()


class FullDisk:
    """Installed as ``autotune.files.open``: the disk fills at the ``allow + 1``-th file opened for
    writing whose name contains ``match``; from then on every file opened for writing is refused.

    ``monkeypatch.setattr(autotune.files, "open", FullDisk("last.pt", allow=1).open, raising=False)``;
    ``monkeypatch.undo()`` (or ``free()``) frees the space.
    """

    def __init__(self, match: str, allow: int = 0) -> None:
        self.match, self.allow = match, allow
        self.seen = 0
        self.full = False
        self.refused: list[str] = []

    def open(self, path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = builtins.open(path, mode, *args, **kwargs)
        if "w" not in mode:
            return handle
        if self.match in os.path.basename(str(path)):
            self.seen += 1
            self.full = self.full or self.seen > self.allow
        if self.full:
            self.refused.append(str(path))
            return _RefusingFile(handle)
        return handle

    def free(self) -> None:
        """Space is freed: every write succeeds again."""
        self.full, self.allow = False, 10**9
