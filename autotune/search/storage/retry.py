"""Riding out a database server that goes away for a while (a restart, a failover, a network blip).

A study's storage is a database server when many workers share it (PostgreSQL, MySQL). A call that
finds the server gone is retried with a growing pause until ``$AUTOTUNE_STORAGE_RETRY_SECONDS``
(default 60) have passed; the connection pool re-opens its connections (``pool_pre_ping``). A
server still down after that is one ``StorageError`` (exit 2 from the CLI) that says what is kept:
every finished trial is stored, so the same command continues from them. SQLite is a file with
its own lock timeout: it is not retried, and a full disk there says so at once.

A write the server committed just before it went away, retried, is written twice; Optuna's trials
are created one per call, so such a retry can leave one extra trial (the evaluator then reads the
point back from it). This is the price of not failing a whole tuning run at every restart.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

from autotune.errors import StorageError

__all__ = ["RETRY_ENV", "DEFAULT_RETRY_SECONDS", "retry_seconds", "is_disconnect", "retrying", "retrying_rdb_storage"]

RETRY_ENV = "AUTOTUNE_STORAGE_RETRY_SECONDS"
DEFAULT_RETRY_SECONDS = 60.0
_T = TypeVar("_T")


def retry_seconds() -> float:
    """``$AUTOTUNE_STORAGE_RETRY_SECONDS`` when set to a number >= 0, else ``DEFAULT_RETRY_SECONDS``.

    Raises:
        SpecError: the variable holds something else.
    """
    from autotune.checks.environment import setting

    value = setting(RETRY_ENV)
    return DEFAULT_RETRY_SECONDS if value is None else float(value)


def is_disconnect(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) says the database server could not be reached or dropped the
    connection, as opposed to a bad query or a constraint."""
    import sqlalchemy.exc

    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 8:
        if isinstance(current, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError,
                                sqlalchemy.exc.DisconnectionError)):
            return True
        if isinstance(current, sqlalchemy.exc.DBAPIError) and current.connection_invalidated:
            return True
        current, seen = current.__cause__ or current.__context__, seen + 1
    return False


def _reason(exc: BaseException) -> str:
    """The first line of the driver's message, short."""
    cause: BaseException = exc
    while cause.__cause__ is not None:
        cause = cause.__cause__
    text = str(getattr(cause, "orig", cause)).strip().splitlines()
    return (text[0] if text else type(cause).__name__)[:160]


def retrying(call: Callable[[], _T], shown: str, budget: float | None = None,
             sleep: Callable[[float], None] = time.sleep) -> _T:
    """``call()``, retried while the server is unreachable, for at most ``budget`` seconds (default
    ``retry_seconds()``).

    Raises:
        StorageError: the server was still unreachable when the budget ran out (names ``shown``, the
            redacted URL, and what to do).
    """
    budget = retry_seconds() if budget is None else float(budget)
    deadline = time.monotonic() + budget
    pause = 0.25
    while True:
        try:
            return call()
        except Exception as exc:
            if not is_disconnect(exc):
                raise
            if time.monotonic() + pause > deadline:
                raise StorageError(
                    f"storage {shown}: the database server was unreachable for {budget:g} s ({_reason(exc)}); "
                    "every finished trial is stored: once the server is back, run the same command to continue"
                ) from exc
            sleep(pause)
            pause = min(pause * 2, 5.0)


def _wrapped(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        return retrying(lambda: method(self, *args, **kwargs), getattr(self, "shown_url", "(database)"))

    return call


@functools.lru_cache(maxsize=1)
def retrying_rdb_storage() -> type:
    """``optuna.storages.RDBStorage`` whose public calls ride out a server that is briefly gone (``retrying``)."""
    import optuna

    base = optuna.storages.RDBStorage
    skip = {"remove_session", "upgrade", "get_current_version", "get_head_version", "get_all_versions"}
    methods = {name: _wrapped(getattr(base, name)) for name in dir(base)
               if not name.startswith("_") and name not in skip and callable(getattr(base, name))}
    return type("RetryingRDBStorage", (base,), methods)
