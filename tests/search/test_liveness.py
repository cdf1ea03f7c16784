"""Worker liveness (``autotune.search.storage.liveness``): a heartbeat renewed only while the worker
makes progress, so a hung worker blocks the others for at most its promise (the probe
timeout) plus the grace; its trial is failed as stale and its late result is refused.
Also: autotune reaches Optuna through its public API only.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.search.storage.claims import ClaimStore
from autotune.search.storage.liveness import Liveness, TakenOver
from autotune.search.storage.study import open_storage
from autotune.search.strategies.evaluate import Evaluator, point_id

GRACE = 1.5  # seconds without a heartbeat after which a worker is not live
PROMISE = 2.0  # seconds a worker promises between steps (the probe timeout)
POINT = {"num_patches_per_iter": 2}
DISTRIBUTIONS = {"num_patches_per_iter": optuna.distributions.IntDistribution(1, 8)}
States = optuna.trial.TrialState


class HangingProber:
    """A probe that never progresses (a hang the probe runner's timeout did not catch) until released."""

    measured = True

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def probe(self, point: Mapping[str, Any], phases: tuple[str, ...]) -> dict[str, Any]:
        self.started.set()
        self.release.wait(120.0)
        return {"status": "ok", "peak_bytes": 10}

    def memory_model(self, phase: str, point: Mapping[str, Any]) -> Any:
        return None


class QuickProber(HangingProber):
    def probe(self, point: Mapping[str, Any], phases: tuple[str, ...]) -> dict[str, Any]:
        return {"status": "ok", "peak_bytes": 20, "samples_per_s": 1.0}


def _worker(owner: str, prober: Any, study: optuna.Study,
            storage: optuna.storages.BaseStorage) -> tuple[Liveness, Evaluator]:
    liveness = Liveness(storage, owner, stale_after=GRACE, promise=PROMISE)
    evaluator = Evaluator(study, prober, 100, DISTRIBUTIONS, storage=storage, liveness=liveness,
                          claims=ClaimStore(liveness), poll_seconds=0.1)
    return liveness, evaluator


def _in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_hung_worker_blocks_others_for_at_most_promise_and_grace(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'live.db'}"
    storage = open_storage(url)
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    hung = HangingProber()
    a_live, a = _worker("host-a:1", hung, study, storage)
    b_live, b = _worker("host-b:2", QuickProber(), study, storage)
    try:
        started = time.monotonic()
        a_thread, a_out = _in_thread(lambda: a.evaluate(POINT, ("train",)))
        assert hung.started.wait(30.0), "worker A never reached its probe"
        # while A keeps its promise it is live: its point is not taken
        assert not b.claims.claim("s", "point:" + point_id(POINT, ("train",)))
        assert time.monotonic() - started < PROMISE, "the check above ran inside A's promise"
        b_thread, b_out = _in_thread(lambda: b.evaluate(POINT, ("train",)))
        b_thread.join(PROMISE + GRACE + 20.0)
        waited = time.monotonic() - started
        assert not b_thread.is_alive(), "a hung worker blocked another beyond its promise and the grace"
        assert "error" not in b_out, b_out
        assert b_out["value"].status == "ok" and not b_out["value"].reused
        # B waited for A while A was live, and took over once A's heartbeat was older than the grace
        assert PROMISE - b_live.beat_every <= waited <= PROMISE + GRACE + 2 * a_live.beat_every + 3.0, waited
        # taking A's claim over failed A's trial first (a late result of A is refused): nothing left to sweep
        assert b_live.fail_stale_trials(storage, study) == []
        trials = study.get_trials()
        a_trial = next(t for t in trials if t.user_attrs.get("owner") == "host-a:1")
        assert a_trial.state == States.FAIL and a_trial.number < next(
            t.number for t in trials if t.user_attrs.get("owner") == "host-b:2")
        assert re.fullmatch(r"stale: worker host-a:1 made no progress for \d+ s", a_trial.user_attrs["fail_reason"])
        b_trial = next(t for t in trials if t.user_attrs.get("owner") == "host-b:2")
        assert b_trial.state == States.COMPLETE and b_trial.user_attrs["peak_bytes"] == 20
        # A comes back: its late result is refused, the taker's stands
        hung.release.set()
        a_thread.join(30.0)
        assert isinstance(a_out.get("error"), TakenOver), a_out
        assert study.get_trials()[a_trial.number].state == States.FAIL
    finally:
        hung.release.set()
        a_live.close()
        b_live.close()


def test_progress_keeps_a_long_worker_live(tmp_path: Path) -> None:
    """A worker that keeps stepping stays live past the grace and keeps its claim; once it stops
    stepping, a promise and a grace later, its claim goes to the next worker that asks."""
    storage = open_storage(f"sqlite:///{tmp_path / 'live.db'}")
    a_live = Liveness(storage, "host-a:1", stale_after=GRACE, promise=PROMISE)
    b_live = Liveness(storage, "host-b:2", stale_after=GRACE, promise=PROMISE)
    try:
        assert ClaimStore(a_live).claim("s", "key:x") is True
        b_claims = ClaimStore(b_live)
        deadline = time.monotonic() + PROMISE + 2 * GRACE
        while time.monotonic() < deadline:  # A steps more often than its promise: it keeps beating
            a_live.progress()
            time.sleep(0.2)
        assert b_live.gone("host-a:1") is None
        assert b_claims.claim("s", "key:x") is False, "A is live: its claim holds"
        time.sleep(PROMISE + GRACE + a_live.beat_every + 0.5)  # A stops stepping
        assert b_live.gone("host-a:1") is not None
        assert b_claims.claim("s", "key:x") is True, "A is not live: its claim is taken over"
        assert b_claims.holder("s", "key:x")["owner"] == "host-b:2"
    finally:
        a_live.close()
        b_live.close()


def test_gone_process_on_this_host_and_closed_worker(tmp_path: Path) -> None:
    storage = open_storage(f"sqlite:///{tmp_path / 'live.db'}")
    watcher = Liveness(storage, "watcher:0", stale_after=60.0)
    other = Liveness(storage, "other:1", stale_after=60.0)
    try:
        done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        dead = f"{socket.gethostname()}:{int(done.stdout)}"
        assert watcher.gone(dead) == f"worker {dead} is gone", "same host, process gone: not live at once"
        assert watcher.gone("other:1") is None
        other.close()
        assert watcher.gone("other:1") == "worker other:1 is gone (no heartbeat)"
    finally:
        watcher.close()


# (a subclass calling its own base class, as the CLI's argparse parser does, is not reaching into Optuna)
PRIVATE_OPTUNA = re.compile(r"(?<!super\(\))\._(storage|trial_id|study_id|get_\w+)\b")
# The storage subclass overrides RDBStorage's trial creation so a retried write is done once; the tests of
# tests/search/test_storage_writes.py pin that behaviour.
STORAGE_SUBCLASS = Path("autotune/search/storage/retry.py")


def test_autotune_uses_only_public_optuna_names() -> None:
    root = Path(__file__).resolve().parents[2] / "autotune"
    hits = [f"{path.relative_to(root.parent)}:{number}: {line.strip()}"
            for path in sorted(root.rglob("*.py")) if path.relative_to(root.parent) != STORAGE_SUBCLASS
            for number, line in enumerate(path.read_text().splitlines(), 1) if PRIVATE_OPTUNA.search(line)]
    assert not hits, "private Optuna names (use the storage autotune opened and BaseStorage's methods):\n" + \
        "\n".join(hits)


@pytest.mark.parametrize("line", ["storage = study._storage", "storage.set_trial_param(trial._trial_id, n, v, d)",
                                  "storage._get_stale_trial_ids(study._study_id)"])
def test_private_name_pattern_catches_the_old_uses(line: str) -> None:
    assert PRIVATE_OPTUNA.search(line)


def test_a_worker_beats_while_it_holds_something_and_not_while_it_waits(tmp_path: Path) -> None:
    """Hundreds of workers waiting for others' results would each write a beat every few seconds for nothing:
    one that holds nothing lets its beat age (no one judges it), beats at once before it takes a claim, beats
    while it holds one or evaluates a point, and stops once it holds nothing again."""
    from autotune.search.storage.liveness import HEARTBEAT

    storage = open_storage(f"sqlite:///{tmp_path / 'live.db'}")
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    live, evaluator = _worker("host-a:1", QuickProber(), study, storage)
    other = Liveness(storage, "host-b:2", stale_after=GRACE, promise=PROMISE)

    def beat() -> float:
        return float(storage.get_trial(live.worker_id).system_attrs[HEARTBEAT])

    try:
        registered = beat()
        time.sleep(GRACE + 2 * live.beat_every)  # waiting, holding nothing: not one write
        live.progress()
        assert beat() == registered
        claims = ClaimStore(live)
        assert claims.claim("s", "key:x")  # its beat is renewed before its ticket is written
        taken = beat()
        assert taken > registered + GRACE
        assert other.verdict(live.worker_id) is None, "a worker that just took a claim is live"
        deadline = time.monotonic() + 10 * live.beat_every
        while beat() == taken and time.monotonic() < deadline:  # holding: it beats
            live.progress()
            time.sleep(0.05)
        assert beat() > taken, "a worker holding a claim stopped beating"
        claims.release("s", "key:x")
        time.sleep(live.beat_every)  # a beat under way when it let go may land
        released = beat()
        time.sleep(2 * live.beat_every)
        live.progress()
        assert beat() == released, "a worker holding nothing went on beating"
        time.sleep(live.beat_every)
        assert evaluator.evaluate(POINT, ("train",)).status == "ok"  # an evaluation beats first, if due
        assert beat() > released
    finally:
        live.close()
        other.close()


def test_a_live_verdict_is_not_read_again_until_the_beat_could_be_stale(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker of another host seen live with a beat of age a cannot be stale before grace - a: asking again
    before then reads nothing; after it, the worker trial is read again (and judged on what it finds)."""
    storage = open_storage(f"sqlite:///{tmp_path / 'live.db'}")
    holder = Liveness(storage, "host-a:1", stale_after=GRACE, promise=PROMISE)
    judge = Liveness(storage, "host-b:2", stale_after=GRACE, promise=PROMISE)
    reads: list[int] = []
    real = storage.get_trial
    monkeypatch.setattr(storage, "get_trial", lambda trial_id: reads.append(trial_id) or real(trial_id))
    try:
        assert judge.verdict(holder.worker_id) is None and judge.verdict(holder.worker_id) is None
        assert reads == [holder.worker_id], "a worker known live within its grace was read again"
        time.sleep(GRACE + 0.2)  # holding nothing, it has not beaten since: stale now
        assert judge.verdict(holder.worker_id) is not None
        assert reads == [holder.worker_id] * 2
    finally:
        holder.close()
        judge.close()
