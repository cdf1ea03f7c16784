"""Claims: who is working on what, in the same database as the studies.

Several workers share one storage. Before a worker searches a tuning key, or probes a
point, it claims it: an INSERT into ``autotune_claims`` whose primary key makes the
claim atomic on any SQL database. A claim has no heartbeat of its own: it is as live as
its holder (``autotune.search.storage.liveness``: one heartbeat per worker, renewed only while the
worker makes progress). A claim whose holder is not live may be taken over
(compare-and-swap on the old holder, so only one taker wins).
"""

from __future__ import annotations

import time
from typing import Any

from autotune.search.storage.liveness import Liveness, create_tables

__all__ = ["ClaimStore"]


class ClaimStore:
    """Atomic claims, held while their holder's heartbeat is live.

    Args:
        liveness: this worker's liveness (its owner tag and database engine).
    """

    def __init__(self, liveness: Liveness) -> None:
        import sqlalchemy as sa

        self.liveness = liveness
        self.owner = liveness.owner
        self.engine = liveness.engine
        meta = sa.MetaData()
        self.table = sa.Table(
            "autotune_claims",
            meta,
            sa.Column("study_name", sa.String(512), primary_key=True),
            sa.Column("item", sa.String(512), primary_key=True),
            sa.Column("owner", sa.String(256), nullable=False),
            sa.Column("heartbeat", sa.Float, nullable=False),  # when the claim was taken (liveness is the owner's)
            sa.Column("done", sa.Boolean, nullable=False, default=False),
        )
        create_tables(self.engine, meta)

    def claim(self, study_name: str, item: str) -> bool:
        """Take ``item`` of ``study_name``; False when a live worker holds it or it is done."""
        self.liveness.progress()
        return self.liveness.db(lambda: self._claim(study_name, item))

    def _claim(self, study_name: str, item: str) -> bool:
        import sqlalchemy as sa
        import sqlalchemy.exc

        t = self.table
        try:
            with self.engine.begin() as conn:
                conn.execute(t.insert().values(study_name=study_name, item=item, owner=self.owner,
                                               heartbeat=time.time(), done=False))
            return True
        except sqlalchemy.exc.IntegrityError:
            pass
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(t.c.owner, t.c.done).where(t.c.study_name == study_name, t.c.item == item)
            ).first()
        if row is None:  # released meanwhile
            return self._claim(study_name, item)
        if row.done or (row.owner != self.owner and self.liveness.gone(row.owner) is None):
            return False
        with self.engine.begin() as conn:
            taken = conn.execute(
                t.update()
                .where(t.c.study_name == study_name, t.c.item == item, t.c.owner == row.owner, t.c.done.is_(False))
                .values(owner=self.owner, heartbeat=time.time())
            ).rowcount
        return taken == 1

    def holder(self, study_name: str, item: str) -> dict[str, Any] | None:
        """Who holds ``item`` (owner, seconds since its heartbeat or None, done), or None."""
        import sqlalchemy as sa

        t = self.table

        def read() -> Any:
            with self.engine.connect() as conn:
                return conn.execute(
                    sa.select(t.c.owner, t.c.done).where(t.c.study_name == study_name, t.c.item == item)
                ).first()

        row = self.liveness.db(read)
        if row is None:
            return None
        return {"owner": row.owner, "age": self.liveness.age(row.owner), "done": bool(row.done)}

    def release(self, study_name: str, item: str, done: bool = False) -> None:
        """Give ``item`` back (``done=True`` keeps it closed for everyone)."""
        t = self.table

        def write() -> None:
            with self.engine.begin() as conn:
                where = (t.c.study_name == study_name) & (t.c.item == item) & (t.c.owner == self.owner)
                if done:
                    conn.execute(t.update().where(where).values(done=True, heartbeat=time.time()))
                else:
                    conn.execute(t.delete().where(where))

        self.liveness.db(write)
