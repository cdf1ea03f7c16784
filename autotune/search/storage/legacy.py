"""Storages written by autotune before workers coordinated through Optuna's storage API.

Earlier versions kept liveness and claims in two SQL tables of their own beside Optuna's schema,
``autotune_workers`` (owner, heartbeat) and ``autotune_claims``. Their studies and trials are Optuna's
and load as they are: a trial they left RUNNING names its worker by the ``owner`` tag alone, and a
tag with no live worker trial is not live, so the first sweep fails it as stale. Their tables are
no longer read or written, so a worker of such a version still running on the same storage would not
see this version's claims, nor this version its: a storage with such a worker live (a heartbeat
within the grace) is refused in one line saying how to migrate. The tables themselves are left in
place (dropping them is the administrator's choice: nothing reads them).
"""

from __future__ import annotations

import time
from typing import Any

from autotune.errors import StorageError

__all__ = ["LEGACY_TABLES", "refuse_live_legacy_workers"]

LEGACY_TABLES = ("autotune_workers", "autotune_claims")


def refuse_live_legacy_workers(storage: Any, shown: str, stale_after: float) -> None:
    """Refuse an SQL storage on which a worker of an earlier autotune beat within ``stale_after`` seconds.

    Args:
        storage: an Optuna RDB storage (anything without an ``engine`` is not SQL: nothing to check).
        shown: its URL with the password hidden.
        stale_after: the grace in seconds.

    Raises:
        StorageError: one line naming the live older worker and the migration.
    """
    engine = getattr(storage, "engine", None)
    if engine is None:
        return
    from autotune.search.storage.retry import retrying

    # read as every storage call is: a server that refuses a connection for a while (its connections all taken,
    # a restart) is waited for, then one line; never a driver's traceback
    rows = retrying(lambda: _legacy_heartbeats(engine), shown, retry=getattr(storage, "retries", True))
    now = time.time()
    live = sorted(((now - float(beat), str(owner)) for owner, beat in rows if now - float(beat) <= stale_after))
    if live:
        age, owner = live[0]
        raise StorageError(
            f"storage {shown}: a worker of an older autotune ({owner}, heartbeat {age:.0f} s ago) is tuning here "
            "with the autotune_workers and autotune_claims tables, which this version no longer reads; let the "
            "older workers finish or stop them, upgrade every worker to this version, then run again (its "
            "studies are kept; the two tables may then be dropped)")


def _legacy_heartbeats(engine: Any) -> list[Any]:
    """(owner, heartbeat) rows of the older workers' table; none when it does not exist."""
    import sqlalchemy as sa

    with engine.connect() as conn:
        if not sa.inspect(conn).has_table(LEGACY_TABLES[0]):
            return []
        return list(conn.execute(sa.text(f"SELECT owner, heartbeat FROM {LEGACY_TABLES[0]}")).fetchall())
