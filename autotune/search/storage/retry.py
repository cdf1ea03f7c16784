"""Riding out a database server (or the storage proxy in front of one) that goes away for a while (a restart,
a failover, a network blip).

A study's storage is a database server when many workers share it (PostgreSQL, MySQL). A call that
finds the server gone is retried with a growing pause until ``$AUTOTUNE_STORAGE_RETRY_SECONDS``
(default 60) have passed; the connection pool re-opens its connections (``pool_pre_ping``). A
server still down after that is one ``StorageError`` (exit 2 from the CLI) that says what is kept:
every finished trial is stored, so the same command continues from them. SQLite is a file with
its own lock timeout: it is not retried. A full disk under any storage is exit 4 at once
(``autotune.search.storage.refusals``).

A write the server committed just before it went away (a lost commit) is not written again when
retried. A new trial carries a write id (a system attribute, ``autotune:write_id``) in the same
transaction that creates it; a retry, under the study's row lock that Optuna takes for every new
trial, first looks for a trial of that id and returns it. Ending a trial (``tell``) retried after a
lost commit finds the trial already in the asked state with the asked values and succeeds instead
of failing on a finished trial. Attributes, parameters and claims are written by key: a repeat
writes the same row again.
"""

from __future__ import annotations

import functools
import json
import math
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from autotune.errors import StorageError

__all__ = ["RETRY_ENV", "DEFAULT_RETRY_SECONDS", "WRITE_ID", "retry_seconds", "is_disconnect", "is_full",
           "full_server_error", "retrying", "retrying_rdb_storage", "rdb_storage_class"]

RETRY_ENV = "AUTOTUNE_STORAGE_RETRY_SECONDS"
WRITE_ID = "autotune:write_id"  # the system attribute that makes a new trial's write idempotent
DEFAULT_RETRY_SECONDS = 60.0
_T = TypeVar("_T")
_TRIED: set[str] = set()  # write ids of new trials tried once already (set.add and discard are atomic)


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
        if _proxy_unavailable(current):
            return True
        current, seen = current.__cause__ or current.__context__, seen + 1
    return False


def _proxy_unavailable(exc: BaseException) -> bool:
    """True for a gRPC call that found the storage proxy (``autotune proxy``) gone: status UNAVAILABLE."""
    if type(exc).__module__.split(".")[0] != "grpc" or not callable(getattr(exc, "code", None)):
        return False
    return getattr(exc.code(), "name", "") == "UNAVAILABLE"  # type: ignore[attr-defined]


def _reason(exc: BaseException) -> str:
    """The first line of the driver's message, short."""
    cause: BaseException = exc
    while cause.__cause__ is not None:
        cause = cause.__cause__
    if _proxy_unavailable(cause):  # a gRPC error's text spans lines; its details are the reason
        return f"the storage proxy is unavailable: {' '.join(str(cause.details()).split())}"[:160]  # type: ignore[attr-defined]
    text = str(getattr(cause, "orig", cause)).strip().splitlines()
    return (text[0] if text else type(cause).__name__)[:160]


def is_full(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is a database server refusing a connection because its connections
    are all taken ("too many clients"): it is there, and will take one once another worker lets one go."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 8:
        text = str(current).lower()
        if "too many clients" in text or "too many connections" in text:
            return True
        current, seen = current.__cause__ or current.__context__, seen + 1
    return False


def full_server_error(shown: str, how: str, then: str = "") -> StorageError:
    """The one line for a database server whose connections are all taken (``is_full``): it is there, and
    hundreds of workers each hold their own. ``how``: how it refused (for how long, with the driver's words);
    ``then``: what the line ends with."""
    return StorageError(f"storage {shown}: the database refused a connection {how}: its connections are all taken; "
                        "let many workers share one pool through the storage proxy (autotune proxy, then --storage "
                        f"grpc://HOST:PORT), or raise the server's max_connections{then}")


def retrying(call: Callable[[], _T], shown: str, budget: float | None = None,
             sleep: Callable[[float], None] = time.sleep, retry: bool = True) -> _T:
    """``call()``, retried while the server is unreachable, for at most ``budget`` seconds (default
    ``retry_seconds()``); with ``retry`` False (SQLite) not retried. A write the host refused is never
    retried, under any storage.

    Raises:
        StorageError: the server was still unreachable when the budget ran out (names ``shown``, the
            redacted URL, and what to do).
        HostWriteError: the storage's disk is full, over quota or read-only
            (``autotune.search.storage.refusals``).
    """
    from autotune.search.storage.refusals import refusal_error, storage_refusal

    budget = retry_seconds() if budget is None else float(budget)
    deadline = time.monotonic() + budget
    pause = 0.25
    while True:
        try:
            return call()
        except Exception as exc:
            refusal = storage_refusal(exc)
            if refusal is not None:
                raise refusal_error(refusal, shown) from exc
            if not retry or not is_disconnect(exc):
                raise
            if time.monotonic() + pause > deadline:
                reason = _reason(exc)
                if is_full(exc):
                    raise full_server_error(shown, f"for {budget:g} s ({reason})",
                                            "; every finished trial is stored: run the same command to continue") from exc
                raise StorageError(
                    f"storage {shown}: the database server was unreachable for {budget:g} s ({reason}); "
                    "every finished trial is stored: once the server is back, run the same command to continue"
                ) from exc
            sleep(pause)
            pause = min(pause * 2, 5.0)


def _wrapped(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        return retrying(lambda: method(self, *args, **kwargs), _shown(self), retry=self.retries)

    return call


def _shown(storage: Any) -> str:
    return getattr(storage, "shown_url", "(database)")


def _tagged(template: Any, write_id: str) -> Any:
    """The template of a new trial (Optuna's ``FrozenTrial``; a plain RUNNING trial when None) with ``write_id``."""
    import copy
    import datetime

    from optuna.trial import FrozenTrial, TrialState

    if template is None:
        return FrozenTrial(number=-1, state=TrialState.RUNNING, value=None, datetime_start=datetime.datetime.now(),
                           datetime_complete=None, params={}, distributions={}, user_attrs={},
                           system_attrs={WRITE_ID: write_id}, intermediate_values={}, trial_id=-1)
    tagged = copy.deepcopy(template)
    tagged.system_attrs = {**tagged.system_attrs, WRITE_ID: write_id}
    return tagged


def _written_trial(session: Any, study_id: int, template: Any) -> Any:
    """The trial of ``study_id`` that an earlier try of this write created (its ``WRITE_ID``), or None."""
    write_id = (template.system_attrs if template is not None else {}).get(WRITE_ID)
    if write_id is None:
        return None
    from optuna.storages._rdb import models

    attr = models.TrialSystemAttributeModel
    return (session.query(models.TrialModel).join(attr, attr.trial_id == models.TrialModel.trial_id)
            .filter(models.TrialModel.study_id == study_id, attr.key == WRITE_ID,
                    attr.value_json == json.dumps(write_id))
            .one_or_none())


def _same_values(stored: Sequence[float] | None, asked: Sequence[float] | None) -> bool:
    if asked is None:
        return True
    return stored is not None and len(stored) == len(asked) and all(
        a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(stored, asked, strict=True))


def _idempotent_methods(base: type) -> dict[str, Callable[..., Any]]:
    """Trial creation and ending that a retry after a lost commit does not repeat."""

    def _create_new_trial(self: Any, study_id: int, template_trial: Any = None) -> Any:
        write_id = uuid.uuid4().hex
        tagged = _tagged(template_trial, write_id)  # one id for every try of this one write
        try:
            return retrying(lambda: base._create_new_trial(self, study_id, tagged), _shown(self), retry=self.retries)
        finally:
            _TRIED.discard(write_id)

    def _get_prepared_new_trial(self: Any, study_id: int, template_trial: Any, session: Any) -> Any:
        # called with the study's row locked (Optuna numbers trials under that lock): no other try races this one.
        # Only a try after another (ours, or Optuna's own retry inside _create_new_trial) can follow a lost commit,
        # so only such a try looks for the trial it may have written (a join over the study's attributes, made
        # with the study's row locked: the costliest part of a write on a busy proxy)
        write_id = (template_trial.system_attrs if template_trial is not None else {}).get(WRITE_ID)
        written = None
        if write_id in _TRIED:
            written = _written_trial(session, study_id, template_trial)
        elif write_id is not None:
            _TRIED.add(write_id)
        return written if written is not None else base._get_prepared_new_trial(self, study_id, template_trial, session)

    def set_trial_state_values(self: Any, trial_id: int, state: Any, values: Sequence[float] | None = None) -> bool:
        tries = [0]

        def call() -> bool:
            tries[0] += 1
            if tries[0] > 1:  # a retry: the lost commit may have ended the trial already
                trial = base.get_trial(self, trial_id)
                if trial.state == state and state.is_finished() and _same_values(trial.values, values):
                    return True
            return bool(base.set_trial_state_values(self, trial_id, state, values))

        return retrying(call, _shown(self), retry=self.retries)

    return {"_create_new_trial": _create_new_trial, "_get_prepared_new_trial": _get_prepared_new_trial,
            "set_trial_state_values": set_trial_state_values}


def retrying_rdb_storage() -> type:
    """``optuna.storages.RDBStorage`` for a database server: see ``rdb_storage_class``."""
    return rdb_storage_class(retry=True)


@functools.lru_cache(maxsize=2)
def rdb_storage_class(retry: bool) -> type:
    """``optuna.storages.RDBStorage`` whose calls (the public ones, and the private ones Optuna's cache layer,
    ``_CachedStorage``, calls instead) turn a refused write into ``HostWriteError`` and, with ``retry`` (a
    database server), ride out a server that is briefly gone (``retrying``), creating and ending each trial
    once however often a call is retried (``_idempotent_methods``). Without ``retry`` (SQLite) nothing is
    retried. Set ``shown_url`` on an instance: the redacted URL its errors name."""
    import optuna

    base = optuna.storages.RDBStorage
    skip = {"remove_session", "upgrade", "get_current_version", "get_head_version", "get_all_versions",
            "create_new_trial", "set_trial_param"}  # these two call the private ones below, which retry
    private = ("_set_trial_param", "_get_trials", "_get_best_trial_id", "_get_stale_trial_ids")
    methods = {name: _wrapped(getattr(base, name)) for name in dir(base)
               if ((not name.startswith("_") and name not in skip) or name in private)
               and callable(getattr(base, name))}
    if retry:
        methods.update(_idempotent_methods(base))
    return type("RetryingRDBStorage" if retry else "CheckedRDBStorage", (base,), {**methods, "retries": retry})
