"""What a storage file already there holds, read without writing: an SQLite database that is an Optuna storage
(or still empty), a journal file of Optuna's. ``check_storage`` asks this before a command's first write, so a
file of another kind (a text file, another program's database) is refused before anything is written, not after
the bundles were regenerated.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from autotune.errors import StorageError

__all__ = ["check_journal_file", "check_sqlite_file"]

SQLITE_HEADER = b"SQLite format 3\x00"
OPTUNA_TABLES = frozenset({"studies", "trials", "version_info"})
_FIRST_LINE_LIMIT = 1 << 20  # a journal line holds one operation: far below this


def _head(shown: str, path: Path, read: Callable[[BinaryIO], bytes]) -> bytes:
    """What ``read`` takes from the start of ``path`` (nothing when there is no such file).

    Raises:
        StorageError: the file cannot be read.
    """
    if not path.is_file():
        return b""
    try:
        with path.open("rb") as handle:
            return read(handle)
    except OSError as exc:
        raise StorageError(f"storage {shown}: cannot read {path} ({exc.strerror}); give another --storage") from exc


def check_sqlite_file(shown: str, path: Path) -> None:
    """Refuse ``path`` unless it is missing, empty, or an SQLite database that is empty or holds Optuna's tables.

    Raises:
        StorageError: one line naming the storage, what the file is and what to do.
    """
    import sqlite3

    head = _head(shown, path, lambda handle: handle.read(len(SQLITE_HEADER)))
    if not head:
        return  # an empty file: SQLite makes it a database
    if head != SQLITE_HEADER:
        raise StorageError(f"storage {shown}: {path} is not an SQLite database (it holds something else); give "
                           "another --storage, or move the file away")
    try:
        connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            connection.close()
    except sqlite3.DatabaseError as exc:
        raise StorageError(f"storage {shown}: {path} cannot be read as an SQLite database ({exc}); give another "
                           "--storage, or move the file away") from exc
    if tables and not OPTUNA_TABLES <= tables:
        listed = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise StorageError(f"storage {shown}: {path} is an SQLite database of another program (tables: {listed}), "
                           "not an Optuna storage; give another --storage")


def check_journal_file(shown: str, path: Path) -> None:
    """Refuse ``path`` unless it is missing, empty, or starts with a line of Optuna's journal (a JSON object with
    an ``op_code``).

    Raises:
        StorageError: one line naming the storage, what the file is and what to do.
    """
    first = _head(shown, path, lambda handle: handle.readline(_FIRST_LINE_LIMIT))
    if not first.strip():
        return
    try:
        entry = json.loads(first)
    except ValueError:
        entry = None
    if not isinstance(entry, dict) or "op_code" not in entry:
        raise StorageError(f"storage {shown}: {path} is not an Optuna journal file (its first line is not a journal "
                           "entry); give another --storage, or move the file away")
