"""A storage that refuses a write: a full disk, a quota, a read-only file system, under any database.

The studies are written by SQLAlchemy, not by ``autotune.files``, so the host's refusal reaches
autotune as the database's own error: SQLite's ``SQLITE_FULL`` (``database or disk is full``) or
``SQLITE_READONLY``, PostgreSQL's ``disk_full`` (SQLSTATE 53100), MySQL's 1021 or 1114, or an
``OSError`` underneath. ``storage_refusal`` names it as the ``OSError`` it stands for, and
``refusal_error`` makes it the same one line and exit code 4 as every other refused write
(``HostWriteError``). Every trial finished before it is stored; once space is freed the same
command continues from them. A refusal is never retried: a full disk does not come back by itself.
"""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from autotune.errors import HostWriteError

__all__ = ["storage_refusal", "refusal_error"]

_SQLITE = {13: errno.ENOSPC, 8: errno.EROFS}  # SQLITE_FULL, SQLITE_READONLY (primary result codes)
_SQLSTATE = {"53100": errno.ENOSPC}  # PostgreSQL disk_full
_MYSQL = {1021: errno.ENOSPC, 1114: errno.ENOSPC}  # ER_DISK_FULL, ER_RECORD_FILE_FULL


def _errno_of(error: BaseException) -> int | None:
    """The errno a database error stands for, or None when it is not a refused write."""
    from autotune.files import HOST_REFUSALS

    if isinstance(error, OSError) and error.errno in HOST_REFUSALS:
        return error.errno
    code = getattr(error, "sqlite_errorcode", None)
    if isinstance(code, int):
        return _SQLITE.get(code & 0xFF)
    state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
    if isinstance(state, str):
        return _SQLSTATE.get(state)
    args = getattr(error, "args", ())
    if type(error).__module__.split(".")[0] in ("pymysql", "MySQLdb") and args and isinstance(args[0], int):
        return _MYSQL.get(args[0])
    return None


def storage_refusal(exc: BaseException) -> OSError | None:
    """The host's refusal behind a storage error ``exc`` (its cause chain, the driver's error included),
    as an ``OSError`` of that errno; None when ``exc`` is something else."""
    from autotune.files import exception_chain

    for current in exception_chain(exc):
        for error in (current, getattr(current, "orig", None)):  # SQLAlchemy keeps the driver's error in .orig
            code = _errno_of(error) if isinstance(error, BaseException) else None
            if code is not None:
                return OSError(code, os.strerror(code))
    return None


def refusal_error(refusal: OSError, shown: str) -> HostWriteError:
    """The one-line ``HostWriteError`` (exit 4) for ``refusal`` by the storage at ``shown`` (its redacted URL)."""
    from autotune.errors import HostWriteError
    from autotune.files import HOST_REFUSALS, free_bytes, sizes_note

    where, sizes = shown, ""
    if shown.startswith("sqlite:///"):  # a file: name it, and the free space beside it
        where = shown[len("sqlite:///"):]
        sizes = sizes_note(None, free_bytes(os.path.dirname(where) or "."))
    else:
        where = f"{shown} (on the database server's disk)"
    return HostWriteError(what="the tuning storage", path=where, reason=HOST_REFUSALS[refusal.errno or errno.ENOSPC],
                          sizes=sizes, kept="every trial finished before this write",
                          then="free space (or give another --storage), then run the same command to continue")
