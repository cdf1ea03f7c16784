"""Claims: who is working on what, in the same database as the studies.

Several workers share one storage. Before a worker searches a tuning key, or probes a
point, it claims it: an INSERT into ``autotune_claims`` whose primary key makes the
claim atomic on any SQL database. A claim carries a heartbeat; a claim whose
heartbeat is older than ``stale_after`` seconds belongs to a dead worker and may be
taken over (compare-and-swap on the old heartbeat, so only one taker wins).

``AUTOTUNE_CLAIM_STALE_SECONDS`` sets ``stale_after`` (default 60 s) for every worker that
does not pass it; all workers on one storage should agree on it. A held claim is refreshed
every ``min(10, stale_after / 3)`` seconds, so a live worker's claim never looks stale.
Tests set it to a few seconds to see a killed worker's work taken over quickly. Across
nodes keep it above the trial heartbeat grace (30 s, ``autotune.search.study``): a key taken
over sooner finds the dead worker's trial still RUNNING and leaves it for a later sweep.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

__all__ = ["ClaimStore", "STALE_AFTER", "STALE_ENV", "stale_after_default"]

STALE_AFTER = 60.0
HEARTBEAT_EVERY = 10.0
STALE_ENV = "AUTOTUNE_CLAIM_STALE_SECONDS"


def stale_after_default() -> float:
    """``$AUTOTUNE_CLAIM_STALE_SECONDS`` when set to a positive number, else ``STALE_AFTER``."""
    from autotune.errors import SpecError

    raw = os.environ.get(STALE_ENV, "").strip()
    if not raw:
        return STALE_AFTER
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 < value < float("inf"):  # also rejects nan
        raise SpecError(f"{STALE_ENV}={raw!r}: give a positive number of seconds (default {STALE_AFTER:g})")
    return value


class ClaimStore:
    """Atomic claims with heartbeats, kept alive by a background thread while held.

    Args:
        url: the SQLAlchemy URL of the Optuna storage (the table is created there).
        owner: this worker's tag (``host:pid``).
        stale_after: seconds without heartbeat after which a claim may be taken over
            (default ``$AUTOTUNE_CLAIM_STALE_SECONDS``, else 60).
    """

    def __init__(self, url: str, owner: str, stale_after: float | None = None) -> None:
        import sqlalchemy as sa

        self.owner = owner
        self.stale_after = float(stale_after) if stale_after is not None else stale_after_default()
        self.heartbeat_every = min(HEARTBEAT_EVERY, self.stale_after / 3.0)
        connect_args: dict[str, Any] = {"timeout": 60} if url.startswith("sqlite") else {}
        self.engine = sa.create_engine(url, connect_args=connect_args, pool_pre_ping=True)
        meta = sa.MetaData()
        self.table = sa.Table(
            "autotune_claims",
            meta,
            sa.Column("study_name", sa.String(512), primary_key=True),
            sa.Column("item", sa.String(512), primary_key=True),
            sa.Column("owner", sa.String(256), nullable=False),
            sa.Column("heartbeat", sa.Float, nullable=False),
            sa.Column("done", sa.Boolean, nullable=False, default=False),
        )
        for attempt in range(5):
            try:
                meta.create_all(self.engine, checkfirst=True)
                break
            except (sa.exc.IntegrityError, sa.exc.ProgrammingError):
                # workers starting together on an empty database race to create the table (PostgreSQL:
                # duplicate pg_type entry, or "relation already exists"); the winner's table is there now
                if attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))
        self._held: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="autotune-claims-heartbeat", daemon=True)
        self._thread.start()

    def claim(self, study_name: str, item: str) -> bool:
        """Take ``item`` of ``study_name``; False when a live worker holds it or it is done."""
        import sqlalchemy as sa
        import sqlalchemy.exc

        now = time.time()
        t = self.table
        try:
            with self.engine.begin() as conn:
                conn.execute(t.insert().values(study_name=study_name, item=item, owner=self.owner, heartbeat=now,
                                               done=False))
        except sqlalchemy.exc.IntegrityError:
            with self.engine.begin() as conn:
                row = conn.execute(
                    sa.select(t.c.owner, t.c.heartbeat, t.c.done).where(t.c.study_name == study_name, t.c.item == item)
                ).first()
                if row is None:
                    return self.claim(study_name, item)
                if row.done:
                    return False
                if row.owner != self.owner and now - row.heartbeat < self.stale_after:
                    return False
                taken = conn.execute(
                    t.update()
                    .where(t.c.study_name == study_name, t.c.item == item, t.c.owner == row.owner,
                           t.c.heartbeat == row.heartbeat)
                    .values(owner=self.owner, heartbeat=now)
                ).rowcount
                if taken != 1:
                    return False
        with self._lock:
            self._held.add((study_name, item))
        return True

    def holder(self, study_name: str, item: str) -> dict[str, Any] | None:
        """Who holds ``item`` (owner, seconds since heartbeat, done), or None."""
        import sqlalchemy as sa

        t = self.table
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(t.c.owner, t.c.heartbeat, t.c.done).where(t.c.study_name == study_name, t.c.item == item)
            ).first()
        if row is None:
            return None
        return {"owner": row.owner, "age": time.time() - row.heartbeat, "done": bool(row.done)}

    def release(self, study_name: str, item: str, done: bool = False) -> None:
        """Give ``item`` back (``done=True`` keeps it closed for everyone)."""
        t = self.table
        with self._lock:
            self._held.discard((study_name, item))
        with self.engine.begin() as conn:
            where = (t.c.study_name == study_name) & (t.c.item == item) & (t.c.owner == self.owner)
            if done:
                conn.execute(t.update().where(where).values(done=True, heartbeat=time.time()))
            else:
                conn.execute(t.delete().where(where))

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_every):
            with self._lock:
                held = list(self._held)
            if not held:
                continue
            t = self.table
            try:
                with self.engine.begin() as conn:
                    for study_name, item in held:
                        conn.execute(
                            t.update()
                            .where(t.c.study_name == study_name, t.c.item == item, t.c.owner == self.owner)
                            .values(heartbeat=time.time())
                        )
            except Exception:  # a missed beat is retried at the next one
                continue

    def close(self) -> None:
        """Stop the heartbeat thread and release the engine (held claims stay until stale)."""
        self._stop.set()
        self._thread.join(timeout=1.0)
        self.engine.dispose()
