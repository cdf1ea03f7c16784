"""Worker liveness through Optuna's storage API: one heartbeat per worker, renewed only while it makes progress
and holds something.

Every tuning run (``autotune tune`` or ``autotune worker``) is a RUNNING trial of the study
``autotune-workers`` in the storage it tunes in (its *worker trial*), whose system attribute
``autotune:heartbeat`` (the worker's clock, seconds since the epoch) a background thread rewrites every
``min(10, stale_after / 3)`` seconds while the worker holds something others could judge it by (a claim,
``autotune.search.storage.claims``, or a trial it is evaluating), and only while the run keeps its promise:
a worker that holds nothing (one of hundreds waiting for others' results) is never judged, so its beat is
left to age, and it beats at once before it next takes something (``fresh``). Each step of the main
thread (a point evaluated, a poll for another worker's result, a claim taken) calls ``progress()``,
which promises the next step within ``promise`` seconds (the probe timeout: the probe runner kills a
child that takes longer, so a live worker always comes back in time). A worker whose main thread
hangs stops beating once its promise runs out; ``stale_after`` seconds after its last beat (the grace,
``AUTOTUNE_CLAIM_STALE_SECONDS``, default 60 s, the same for every worker on one storage) it is not
live, so a hung or dead worker blocks others for at most ``promise + stale_after`` seconds (plus one
beat). On the same host a worker whose process no longer exists is not live at once (a rerun after a
kill does not wait for the grace).

A worker found not live is *declared dead*: its worker trial goes RUNNING -> FAIL with the reason
(``set_trial_state_values``). That transition is Optuna's compare-and-set: on an RDB storage the
trial's row is locked (``SELECT ... FOR UPDATE``) while its state is checked and changed, on a journal
the log's order decides and a later writer's replay raises, and the gRPC proxy passes the call to
the database storage behind it; every backend raises ``UpdateFinishedTrialError`` to all but the one
that changed it. So a death is final and every worker sees the same verdict: whatever the dead worker
held (its claims, ``autotune.search.storage.claims``; its RUNNING trials, failed by ``fail_stale_trials``
with ``fail_reason`` ``stale: ...``) goes to the others. A hung worker that comes back finds its
heartbeat refused (``UpdateFinishedTrialError``): it carries on as a new worker trial, and its late
result is refused (``TakenOver``, raised by the evaluator) while it waits for the taker's.

Probe trials name their worker by its worker trial's id (user attribute ``worker``, beside the
``owner`` tag ``host:pid``), claims by the system attribute ``autotune:worker``; trials written by
autotune before worker trials carry only the ``owner`` tag, judged by the worker trials of that tag
(a tag with none is not live). A worker that ends normally closes
its worker trial (COMPLETE, valued by its seconds alive).

Why not Optuna's own heartbeat (``RDBStorage(heartbeat_interval=..., grace_period=...)``,
``fail_stale_trials``, ``RetryFailedTrialCallback``): only ``RDBStorage`` implements it
(``GrpcStorageProxy`` and ``JournalStorage`` do not, in Optuna 5.0), so a worker behind the proxy
could not beat; its staleness is read through a private method; and it beats per trial only inside
``study.optimize``, while autotune asks and tells trials itself and needs a worker live between
trials (claims on keys and points) and a beat that stops when the worker stops making progress.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from autotune.errors import StorageError

if TYPE_CHECKING:  # pragma: no cover
    import optuna

__all__ = ["Liveness", "TakenOver", "STALE_AFTER", "STALE_ENV", "WORKERS_STUDY", "HEARTBEAT", "WORKER", "OWNER",
           "stale_after_default", "owner_tag", "ensure_study", "running_template", "is_coordination_study",
           "bookkeeping_note"]

STALE_AFTER = 60.0
HEARTBEAT_EVERY = 10.0
STALE_ENV = "AUTOTUNE_CLAIM_STALE_SECONDS"
WORKERS_STUDY = "autotune-workers"
CLAIMS_SUFFIX = "-claims"  # a key's claims study (``autotune.search.storage.claims``)
HEARTBEAT = "autotune:heartbeat"  # system attribute of a worker trial: its last beat (epoch seconds)
OWNER = "autotune:owner"  # host:pid of a worker trial, or of the worker a claim or trial belongs to
WORKER = "autotune:worker"  # on a probe trial or a claim: the id of its worker trial
DEATH = "autotune:fail_reason"  # on a worker trial declared dead: why


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


def is_coordination_study(name: str) -> bool:
    """True for the studies that hold workers and claims, not measurements."""
    return name == WORKERS_STUDY or name.endswith(CLAIMS_SUFFIX)


def ensure_study(storage: optuna.storages.BaseStorage, name: str, phase: str) -> int:
    """The id of study ``name``, created (with user attribute ``phase``) when missing; workers starting
    together race to create it and all get the one that won (the study name is unique on every backend).

    Looked up first: most callers find it made (one read; a failed create is a rolled-back insert on a
    database, and hundreds of workers asking for the same claims study would make thousands of them)."""
    from optuna.exceptions import DuplicatedStudyError
    from optuna.study import StudyDirection

    try:
        return storage.get_study_id_from_name(name)
    except KeyError:
        pass
    try:
        study_id = storage.create_new_study([StudyDirection.MAXIMIZE], name)
    except DuplicatedStudyError:
        return storage.get_study_id_from_name(name)
    storage.set_study_user_attr(study_id, "phase", phase)
    _describe(storage, name)
    return study_id


def bookkeeping_note(name: str) -> str:
    """What a bookkeeping study (``autotune-workers``, ``<key study>-claims``) is, as its dashboard note says it."""
    if name == WORKERS_STUDY:
        return ("## autotune-workers: bookkeeping, not a tuning study\n\nOne trial per `autotune tune`, `run` or "
                "`worker` process that used this storage (user attributes `owner`, `host`, `pid`): RUNNING while "
                "it runs (its heartbeat: the system attribute `autotune:heartbeat`), COMPLETE when it ended "
                "(value: the seconds it was alive), FAIL when it was declared dead (`autotune:fail_reason`). Its "
                "values are no tuning result: the answers are in the `autotune-<algo>-...` studies (docs/workers.md).")
    key = name.removesuffix(CLAIMS_SUFFIX)
    return (f"## {name}: bookkeeping, not a tuning study\n\nThe claims on the key study `{key}`: each trial is "
            "a ticket of a process about to search that key or probe one of its points (the system attribute "
            "`autotune:claim`), RUNNING while held, COMPLETE when released (value: the seconds held), FAIL when "
            f"given up or taken from a worker declared dead. The answer is in `{key}` and `{key}-infer` "
            "(docs/workers.md).")


def _describe(storage: optuna.storages.BaseStorage, name: str) -> None:
    """Give a bookkeeping study its dashboard note (once, by the process that created it); without
    optuna-dashboard, or when the storage refuses, the study goes without (nothing depends on the note)."""
    try:
        import optuna
        from optuna_dashboard import save_note
    except ImportError:
        return
    try:
        save_note(optuna.load_study(study_name=name, storage=storage), bookkeeping_note(name))
    except Exception:  # noqa: BLE001 - a note must never fail a run
        return


def running_template(user_attrs: dict[str, Any], system_attrs: dict[str, Any]) -> Any:
    """A RUNNING trial carrying ``user_attrs`` and ``system_attrs`` from its creation (one write on every
    backend: its attributes are never seen missing)."""
    from optuna.trial import FrozenTrial, TrialState

    return FrozenTrial(number=-1, state=TrialState.RUNNING, value=None, datetime_start=_dt.datetime.now(),
                       datetime_complete=None, params={}, distributions={}, user_attrs=dict(user_attrs),
                       system_attrs=dict(system_attrs), intermediate_values={}, trial_id=-1)


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
        storage: the Optuna storage the run tunes in (any backend).
        owner: this worker's tag (``host:pid``).
        stale_after: the grace: seconds without a heartbeat after which a worker is not live
            (default ``$AUTOTUNE_CLAIM_STALE_SECONDS``, else 60).
        promise: seconds within which the main thread promises its next step (the probe timeout).
    """

    def __init__(self, storage: optuna.storages.BaseStorage, owner: str, stale_after: float | None = None,
                 promise: float = 300.0) -> None:
        self.storage = storage
        self.owner = owner
        self.stale_after = float(stale_after) if stale_after is not None else stale_after_default()
        self.promise = float(promise)
        self.beat_every = min(HEARTBEAT_EVERY, self.stale_after / 3.0)
        self.started = time.time()
        self.study_id = ensure_study(storage, WORKERS_STUDY, "workers")
        self.revivals = 0  # times this worker was declared dead and carried on as a new worker trial
        self._live_until: dict[int, float] = {}  # worker trial id -> monotonic time before which it cannot be stale
        self._lock = threading.Lock()  # one beat at a time (the main thread's ``fresh`` and the beating thread's)
        self._holders: list[Callable[[], bool]] = []  # what this worker holds (its claims): it beats while any does
        self._busy = 0  # evaluations under way (each holds a RUNNING trial)
        self.worker_id = self._register()
        self._last_beat = time.monotonic()
        self._deadline = time.monotonic() + self.promise
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="autotune-liveness", daemon=True)
        self._thread.start()

    def _register(self) -> int:
        host, _, pid = self.owner.rpartition(":")
        return self.storage.create_new_trial(self.study_id, running_template(
            {"owner": self.owner, "host": host, "pid": pid},
            {OWNER: self.owner, HEARTBEAT: time.time(), "autotune:stale_after": self.stale_after}))

    def holds(self) -> bool:
        """True while this worker holds something another worker may judge it by (a claim, a trial)."""
        return self._busy > 0 or any(held() for held in self._holders)

    def add_holder(self, held: Callable[[], bool]) -> None:
        """Beat while ``held()`` is True (a claim store: while it holds a claim)."""
        self._holders.append(held)

    def fresh(self) -> None:
        """Beat now unless the last beat is newer than a beat's interval: before this worker takes something
        others may judge it by (a claim's ticket, a trial), after holding nothing for a while."""
        if time.monotonic() - self._last_beat >= self.beat_every:
            self._write()

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Hold a trial for the block's length (an evaluation): beat now if due, and beat throughout."""
        self.fresh()
        self._busy += 1
        try:
            yield
        finally:
            self._busy -= 1

    def progress(self) -> None:
        """The main thread made a step: keep beating for another ``promise`` seconds."""
        self._deadline = time.monotonic() + self.promise

    def tags(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(user, system) attributes that name this worker on a trial or claim it holds."""
        return {"owner": self.owner}, {WORKER: self.worker_id, OWNER: self.owner}

    def verdict(self, worker_id: int) -> str | None:
        """Why the worker of worker trial ``worker_id`` is not live (a sentence for ``fail_reason``), or None
        while it is. A worker found not live is declared dead (its worker trial fails) for everyone."""
        from optuna.trial import TrialState

        if worker_id == self.worker_id:
            return None
        until = self._live_until.get(int(worker_id))
        if until is not None and time.monotonic() < until:
            return None  # its last beat was read less than a grace ago: it cannot be stale yet (no storage call)
        try:
            trial = self.storage.get_trial(int(worker_id))
        except KeyError:
            return f"worker trial {worker_id} does not exist"
        owner = str(trial.system_attrs.get(OWNER, "?"))
        if trial.state == TrialState.FAIL:
            return str(trial.system_attrs.get(DEATH) or f"worker {owner} is gone")
        if trial.state != TrialState.RUNNING:
            return f"worker {owner} is gone (no heartbeat)"
        why = None
        if _process_gone(owner):
            why = f"worker {owner} is gone"
        else:
            age = time.time() - float(trial.system_attrs.get(HEARTBEAT) or 0.0)
            if age > self.stale_after:
                why = f"worker {owner} made no progress for {age:.0f} s"
            elif not owner.startswith(socket.gethostname() + ":"):
                # a worker of another host is live until its beat is a grace old, whatever it does meanwhile; one
                # of this host is asked again each time (its process may be gone: taken over at once)
                self._live_until[int(worker_id)] = time.monotonic() + self.stale_after - max(age, 0.0)
        if why is not None:
            self._declare_dead(int(worker_id), why)
        return why

    def gone(self, owner: str | int) -> str | None:
        """Why ``owner`` (a worker trial's id, or a ``host:pid`` tag of a trial written before worker trials)
        is not live, or None while it is."""
        if not isinstance(owner, str):
            return self.verdict(owner)
        if owner == self.owner:
            return None
        from optuna.trial import TrialState

        tagged = [t for t in self.storage.get_all_trials(self.study_id, deepcopy=False, states=(TrialState.RUNNING,))
                  if t.system_attrs.get(OWNER) == owner]
        verdicts = [self.verdict(self.storage.get_trial_id_from_study_id_trial_number(self.study_id, t.number))
                    for t in tagged]
        if any(v is None for v in verdicts):
            return None
        if verdicts:
            return verdicts[0]
        return f"worker {owner} is gone" if _process_gone(owner) else f"worker {owner} is gone (no heartbeat)"

    def _declare_dead(self, worker_id: int, why: str) -> None:
        """Fail worker trial ``worker_id`` with ``why`` (a sweep that lost the race to another finds it failed)."""
        import optuna
        from optuna.trial import TrialState

        try:
            self.storage.set_trial_system_attr(worker_id, DEATH, why)
            self.storage.set_trial_user_attr(worker_id, "fail_reason", f"stale: {why}")
            self.storage.set_trial_state_values(worker_id, TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another worker declared it first, or it closed meanwhile: either way it is not live

    def fail_stale_trials(self, storage: optuna.storages.BaseStorage, study: optuna.Study) -> list[int]:
        """Mark RUNNING trials of ``study`` whose worker is not live as FAIL; return their numbers.

        Several workers may sweep at once: a trial another sweep failed first is skipped.
        """
        import optuna
        from optuna.trial import TrialState

        study_id = storage.get_study_id_from_name(study.study_name)
        now = _dt.datetime.now()
        failed: list[int] = []
        verdicts: dict[Any, str | None] = {}
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            ref = trial.user_attrs.get("worker", trial.user_attrs.get("owner", ""))
            if ref != "":
                if ref not in verdicts:
                    verdicts[ref] = self.gone(ref)
                why = verdicts[ref]
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

    def _write(self) -> None:
        """One beat; a worker declared dead meanwhile carries on as a new worker trial."""
        import optuna

        with self._lock:
            try:
                self.storage.set_trial_system_attr(self.worker_id, HEARTBEAT, time.time())
            except optuna.exceptions.UpdateFinishedTrialError:
                self.worker_id = self._register()
                self.revivals += 1
            self._last_beat = time.monotonic()

    def _beat(self) -> None:
        while not self._stop.wait(self.beat_every):
            if time.monotonic() > self._deadline:
                continue  # the main thread broke its promise: let the heartbeat age
            if not self.holds():
                continue  # nothing to judge it by: no write (hundreds of waiters would each beat for nothing)
            try:
                self._write()
            except Exception:  # noqa: BLE001 - a missed beat is retried at the next one
                continue

    def close(self) -> None:
        """Stop beating and close this worker's trial (what it still holds is free for others at once)."""
        from optuna.trial import TrialState

        self._stop.set()
        self._thread.join(timeout=2.0)
        try:
            self.storage.set_trial_state_values(self.worker_id, TrialState.COMPLETE,
                                                [round(time.time() - self.started, 3)])
        except Exception:  # noqa: BLE001 - declared dead already, or the server is gone: it ages out as a dead one
            pass
