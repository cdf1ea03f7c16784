"""Claims: who is working on what, written through Optuna's storage API like everything else.

Several workers share one storage. Before a worker searches a tuning key, or probes a point, it
claims it. A claim is a trial of the key's claims study (``<key study>-claims``): a *ticket*, created
RUNNING with the item it claims and the worker that holds it as system attributes, in one write
(``create_new_trial`` with a template trial). Tickets of one study are numbered in the order they
were created, and a worker that reads the study after creating its ticket sees every ticket created
before it. So the holder of an item is the worker of its lowest-numbered RUNNING ticket, and a
worker holds the item when no RUNNING ticket of it is older than its own, except tickets of workers
declared dead (``autotune.search.storage.liveness``), which it fails first. Why this is atomic on
each backend:

- RDB (SQLite, PostgreSQL, MySQL): Optuna numbers a new trial with its study's row locked
  (``SELECT ... FOR UPDATE``), so tickets of one study are created one at a time and each one's
  number counts the tickets committed before it.
- the gRPC proxy: each call is the call of the RDB storage behind the proxy; the client caches only
  finished trials, so RUNNING tickets are read from the server every time.
- journal: every write is a line appended under the file's lock; each reader replays the same log in
  the same order, so numbers are the log's order.

Two tickets for one item can both be RUNNING; only the older one holds. A worker that does not hold
the item ends its ticket (FAIL) at once, so a ticket outlives its claim only while its worker waits
to learn that. A ticket of a worker declared dead is failed by the next worker that meets it: a trial
leaves RUNNING once (``UpdateFinishedTrialError`` for every other writer), so only one taker wins.
Releasing ends the ticket (COMPLETE, valued by the seconds it was held). A claim has no heartbeat of
its own: it is as live as its worker.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from autotune.search.storage.liveness import (
    CLAIMS_SUFFIX,
    OWNER,
    WORKER,
    Liveness,
    ensure_study,
    running_template,
)

__all__ = ["ClaimStore", "claims_study_name"]

ITEM = "autotune:claim"  # system attribute of a ticket: "<study name>|<item>"
TICKET = "autotune:ticket"  # system attribute of a ticket: a token its worker finds it by


def claims_study_name(study_name: str) -> str:
    """The claims study of a key's study (its ``-infer`` sibling shares the key's)."""
    return study_name.removesuffix("-infer") + CLAIMS_SUFFIX


class ClaimStore:
    """Atomic claims, held while their holder is live.

    Args:
        liveness: this worker's liveness (its storage and worker trial).
    """

    def __init__(self, liveness: Liveness) -> None:
        self.liveness = liveness
        self.storage = liveness.storage
        self.owner = liveness.owner
        self._studies: dict[str, int] = {}
        self._held: dict[tuple[str, str], dict[str, Any]] = {}  # (study, item) -> ticket id, token, since
        self.took_over = False  # the last claim taken ended a ticket of a worker declared dead
        self._holders: dict[tuple[str, str], str] = {}  # (study, item) -> owner of the live holder its claim met
        liveness.add_holder(lambda: bool(self._held))  # its worker beats while it holds a claim

    def _study(self, study_name: str) -> int:
        name = claims_study_name(study_name)
        if name not in self._studies:
            self._studies[name] = ensure_study(self.storage, name, "claims")
        return self._studies[name]

    def _tickets(self, study_id: int, item: str) -> list[Any]:
        """RUNNING tickets of ``item``, oldest first."""
        from optuna.trial import TrialState

        trials = self.storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))
        return sorted((t for t in trials if t.system_attrs.get(ITEM) == item), key=lambda t: t.number)

    def _live_before(self, study_id: int, tickets: list[Any], token: str | None) -> Any:
        """The first ticket before ``token``'s (all of them when None) whose worker is live, failing those of
        workers that are not on the way; None when there is none."""
        for ticket in tickets:
            if token is not None and ticket.system_attrs.get(TICKET) == token:
                return None
            worker = ticket.system_attrs.get(WORKER)
            if worker == self.liveness.worker_id:  # a ticket of this worker it does not hold: a write retried twice
                why = "withdrawn: written twice"
            else:
                why = None if worker is None else self.liveness.verdict(worker)
                if worker is None or why is None:
                    return ticket
            self.took_over = self.took_over or not why.startswith("withdrawn")
            self._end(self.storage.get_trial_id_from_study_id_trial_number(study_id, ticket.number), False,
                      why if why.startswith("withdrawn") else f"taken over: {why}")
        return None

    def claim(self, study_name: str, item: str, look_first: bool = True) -> bool:
        """Take ``item`` of ``study_name``; False while a live worker holds it.

        ``look_first``: read the item's tickets before writing one, so that asking for an item a live worker
        holds writes nothing (else the ticket is written at once: one read fewer where the item is rarely held).
        """
        self.liveness.progress()
        self.took_over = False
        study_id = self._study(study_name)
        key = f"{study_name}|{item}"
        held = self._held.get((study_name, item))
        if held is not None and held["worker"] == self.liveness.worker_id:
            if any(t.system_attrs.get(TICKET) == held["token"] for t in self._tickets(study_id, key)):
                return True
            self._held.pop((study_name, item))  # taken over while this worker made no progress
        if look_first:
            older = self._live_before(study_id, self._tickets(study_id, key), None)
            if older is not None:
                self._holders[(study_name, item)] = str(older.system_attrs.get(OWNER, "?"))
                return False  # a live holder: nothing written
        self.liveness.fresh()  # the ticket names this worker: its beat must be recent when others read it
        user, system = self.liveness.tags()
        token = uuid.uuid4().hex
        ticket_id = self.storage.create_new_trial(study_id, running_template(
            {**user, "study": study_name, "item": item}, {**system, ITEM: key, TICKET: token}))
        older = self._live_before(study_id, self._tickets(study_id, key), token)
        if older is not None:
            self._holders[(study_name, item)] = str(older.system_attrs.get(OWNER, "?"))
            self._end(ticket_id, False, "withdrawn: an older claim holds it")
            return False
        self._held[(study_name, item)] = {"id": ticket_id, "token": token, "since": time.monotonic(),
                                          "worker": system[WORKER]}
        self._holders[(study_name, item)] = self.owner
        return True

    def holder(self, study_name: str, item: str) -> dict[str, Any] | None:
        """Who holds ``item`` (its owner tag), or None: the holder this worker's last claim of it met, else
        read from the storage."""
        met = self._holders.get((study_name, item))
        if met is not None:
            return {"owner": met}
        study_id = self._study(study_name)
        tickets = self._tickets(study_id, f"{study_name}|{item}")
        return {"owner": str(tickets[0].system_attrs.get(OWNER, "?"))} if tickets else None

    def release(self, study_name: str, item: str) -> None:
        """Give ``item`` back."""
        held = self._held.pop((study_name, item), None)
        self._holders.pop((study_name, item), None)
        if held is not None:
            self._end(held["id"], True, None, time.monotonic() - held["since"])

    def release_all(self) -> None:
        """Give back every item this worker holds (it stops)."""
        for study_name, item in list(self._held):
            try:
                self.release(study_name, item)
            except Exception:  # noqa: BLE001 - the storage may be what failed; the claims die with the worker
                pass

    def _end(self, ticket_id: int, released: bool, reason: str | None, seconds: float = 0.0) -> None:
        import optuna
        from optuna.trial import TrialState

        try:
            if reason is not None:
                self.storage.set_trial_user_attr(ticket_id, "fail_reason", reason)
            if released:
                self.storage.set_trial_state_values(ticket_id, TrialState.COMPLETE, [round(seconds, 3)])
            else:
                self.storage.set_trial_state_values(ticket_id, TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another worker ended it first (it took the claim over)
