"""Worker liveness: one heartbeat per worker, renewed only while the worker makes progress.

Every tuning run (``autotune tune`` or ``autotune worker``) registers itself as a row of
``autotune_workers`` (owner ``host:pid``, heartbeat) in the studies' database. A background
thread writes the heartbeat every ``min(10, stale_after / 3)`` seconds, but only while the
run keeps its promise: each step of the main thread (a point evaluated, a poll for another
worker's result, a claim taken) calls ``progress()``, which promises the next step within
``promise`` seconds (the probe timeout: the probe runner kills a child that takes longer,
so a live worker always comes back in time). A worker whose main thread hangs stops
beating once its promise runs out; ``stale_after`` seconds later (the grace,
``AUTOTUNE_CLAIM_STALE_SECONDS``, default 60 s, the same for every worker on one storage)
it is no longer live, so a hung or dead worker blocks others for at most ``promise +
stale_after`` seconds (plus one beat). Whatever it held is then taken over: its claims
(``autotune.search.storage.claims``) go to the next worker that asks, and ``fail_stale_trials``
marks its RUNNING trials FAIL with ``fail_reason`` ``stale: ...``. One shortcut answers the
same question sooner: on the same host, a worker whose process no longer exists is not
live (a rerun after a kill does not wait for the grace). A RUNNING trial with no owner yet
(its worker died between asking it and tagging it) counts as stale a grace after it started.
The thread lets a probe run up to its timeout with a grace much shorter than that timeout;
the grace covers what the probe's own timer does not (starting the child, reading its
result). A worker that comes back after it was taken over has its late result refused
(``TakenOver``, raised by the evaluator) and waits for the taker's.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from autotune.errors import StorageError

if TYPE_CHECKING:  # pragma: no cover
    import optuna
    import sqlalchemy as sa

__all__ = ["Liveness", "TakenOver", "STALE_AFTER", "STALE_ENV", "stale_after_default", "create_tables", "owner_tag"]

_T = TypeVar("_T")
STALE_AFTER = 60.0
HEARTBEAT_EVERY = 10.0
STALE_ENV = "AUTOTUNE_CLAIM_STALE_SECONDS"


class TakenOver(StorageError):
    """This worker's work was taken over by another while it made no progress (it hung past its promise)."""


def owner_tag() -> str:
    """``host:pid`` of this process, recorded on each trial and claim it holds."""
    return f"{socket.gethostname()}:{os.getpid()}"


def stale_after_default() -> float:
    """``$AUTOTUNE_CLAIM_STALE_SECONDS`` when set to a positive number, else ``STALE_AFTER``."""
    from autotune.checks.environment import setting

    value = setting(STALE_ENV)
    return STALE_AFTER if value is None else float(value)


def create_tables(engine: sa.engine.Engine, meta: sa.MetaData) -> None:
    """Create ``meta``'s tables; workers starting together on an empty database may race."""
    import sqlalchemy as sa

    for attempt in range(5):
        try:
            meta.create_all(engine, checkfirst=True)
            return
        except (sa.exc.IntegrityError, sa.exc.ProgrammingError):
            # PostgreSQL: duplicate pg_type entry, or "relation already exists"; the winner's table is there now
            if attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))


def _process_gone(owner: str) -> bool:
    """True when ``owner`` (``host:pid``) names a process of this host that no longer exists."""
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class Liveness:
    """This worker's heartbeat, and the liveness of the others.

    Args:
        url: the SQLAlchemy URL of the Optuna storage (the table is created there).
        owner: this worker's tag (``host:pid``).
        stale_after: the grace: seconds without a heartbeat after which a worker is not live
            (default ``$AUTOTUNE_CLAIM_STALE_SECONDS``, else 60).
        promise: seconds within which the main thread promises its next step (the probe timeout).
    """

    def __init__(self, url: str, owner: str, stale_after: float | None = None, promise: float = 300.0) -> None:
        import sqlalchemy as sa

        from autotune.search.storage.study import redact_url

        self.owner = owner
        self.url, self.shown = url, redact_url(url)
        self.stale_after = float(stale_after) if stale_after is not None else stale_after_default()
        self.promise = float(promise)
        self.beat_every = min(HEARTBEAT_EVERY, self.stale_after / 3.0)
        connect_args: dict[str, Any] = {"timeout": 60} if url.startswith("sqlite") else {}
        self.engine = sa.create_engine(url, connect_args=connect_args, pool_pre_ping=True)
        self.meta = sa.MetaData()
        self.table = sa.Table(
            "autotune_workers",
            self.meta,
            sa.Column("owner", sa.String(256), primary_key=True),
            sa.Column("heartbeat", sa.Float, nullable=False),
        )
        create_tables(self.engine, self.meta)
        self._deadline = time.monotonic() + self.promise
        self._write(insert=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="autotune-liveness", daemon=True)
        self._thread.start()

    def db(self, call: Callable[[], _T]) -> _T:
        """``call()`` on this run's database: on a server, retried while the server is briefly gone; a full
        disk under any storage is ``HostWriteError`` (``autotune.search.storage.retry``)."""
        from autotune.search.storage.retry import retrying

        return retrying(call, self.shown, retry=not self.url.startswith("sqlite"))

    def progress(self) -> None:
        """The main thread made a step: keep beating for another ``promise`` seconds."""
        self._deadline = time.monotonic() + self.promise

    def age(self, owner: str) -> float | None:
        """Seconds since ``owner``'s last heartbeat; None when it has no row (never started, or closed)."""
        import sqlalchemy as sa

        def read() -> Any:
            with self.engine.connect() as conn:
                return conn.execute(sa.select(self.table.c.heartbeat).where(self.table.c.owner == owner)).scalar()

        beat = self.db(read)
        return None if beat is None else time.time() - float(beat)

    def gone(self, owner: str) -> str | None:
        """Why ``owner`` is not live (a sentence for ``fail_reason``), or None while it is."""
        if owner == self.owner:
            return None
        if _process_gone(owner):
            return f"worker {owner} is gone"
        age = self.age(owner)
        if age is None:
            return f"worker {owner} is gone (no heartbeat)"
        if age > self.stale_after:
            return f"worker {owner} made no progress for {age:.0f} s"
        return None

    def fail_stale_trials(self, storage: optuna.storages.BaseStorage, study: optuna.Study) -> list[int]:
        """Mark RUNNING trials of ``study`` whose worker is not live as FAIL; return their numbers.

        Several workers may sweep at once: a trial another sweep failed first is skipped.
        """
        import optuna
        from optuna.trial import TrialState

        study_id = storage.get_study_id_from_name(study.study_name)
        now = _dt.datetime.now()
        failed: list[int] = []
        verdicts: dict[str, str | None] = {}
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            owner = str(trial.user_attrs.get("owner", ""))
            if owner:
                if owner not in verdicts:
                    verdicts[owner] = self.gone(owner)
                why = verdicts[owner]
            elif trial.datetime_start is not None and (now - trial.datetime_start).total_seconds() > self.stale_after:
                why = f"no worker took this trial within {self.stale_after:.0f} s"
            else:
                why = None
            if why is None:
                continue
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
            try:
                storage.set_trial_user_attr(trial_id, "fail_reason", f"stale: {why}")
                if storage.set_trial_state_values(trial_id, TrialState.FAIL):
                    failed.append(trial.number)
            except optuna.exceptions.UpdateFinishedTrialError:
                pass  # another worker's sweep failed it first (or its worker came back and finished it)
        return failed

    def _write(self, insert: bool = False) -> None:
        import sqlalchemy.exc

        t = self.table
        with self.engine.begin() as conn:
            if conn.execute(t.update().where(t.c.owner == self.owner).values(heartbeat=time.time())).rowcount:
                return
            if not insert:
                return
            try:
                conn.execute(t.insert().values(owner=self.owner, heartbeat=time.time()))
            except sqlalchemy.exc.IntegrityError:  # pragma: no cover - a row of a reused pid appeared meanwhile
                pass

    def _beat(self) -> None:
        while not self._stop.wait(self.beat_every):
            if time.monotonic() > self._deadline:
                continue  # the main thread broke its promise: let the heartbeat age
            try:
                self._write(insert=True)
            except Exception:  # a missed beat is retried at the next one
                continue

    def close(self) -> None:
        """Stop beating and remove this worker's row (its RUNNING trials are stale at once)."""
        self._stop.set()
        self._thread.join(timeout=2.0)
        try:
            with self.engine.begin() as conn:
                conn.execute(self.table.delete().where(self.table.c.owner == self.owner))
        except Exception:  # noqa: BLE001 - the server is gone: the row ages out as a dead worker's does
            pass
        finally:
            self.engine.dispose()
