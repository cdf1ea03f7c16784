"""Claims and liveness through Optuna's storage API alone, the same on every backend a worker may use: an SQL
database (SQLite here; PostgreSQL in test_workers.py and test_many_workers.py), Optuna's journal file, and
Optuna's gRPC storage proxy (``autotune proxy``, here in front of SQLite).

- workers asking for one item at the same moment: exactly one holds it;
- a worker that stops beating is declared dead once (its worker trial fails), exactly one of the workers
  asking at once takes its claim over, its RUNNING trial is failed as stale, and when it comes back it
  carries on as a new worker trial;
- storages written by earlier autotune: a live older worker is refused in one line saying how to migrate,
  its trials load and its RUNNING trial is failed as stale;
- the URLs, the proxy command and the fake-probe hook refuse bad input in one line.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from forked_cli import CliProcess, start_cli

from autotune.errors import SpecError, StorageError
from autotune.search.storage.claims import ClaimStore, claims_study_name
from autotune.search.storage.liveness import WORKERS_STUDY, Liveness
from autotune.search.storage.study import open_storage

States = optuna.trial.TrialState
GRACE = 1.0  # seconds without a heartbeat after which a worker is not live
BACKENDS = ("sqlite", "journal", "grpc")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, proc: CliProcess, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError("the storage proxy did not start")


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``autotune proxy`` in front of an SQLite file; its ``grpc://`` URL."""
    root = tmp_path_factory.mktemp("proxy")
    port = _free_port()
    proc = start_cli(["proxy", "--storage", f"sqlite:///{root / 'behind.db'}", "--port", str(port), "--threads", "4"],
                     root / "proxy.out", root / "proxy.err")
    try:
        _wait_for_port(port, proc)
        yield f"grpc://127.0.0.1:{port}"
    finally:
        proc.kill()


@pytest.fixture(params=BACKENDS)
def storage_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'coordination.db'}"
    if request.param == "journal":
        return f"journal:///{tmp_path / 'coordination.log'}"
    return str(request.getfixturevalue("proxy"))


def _together(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run ``calls`` in threads released at the same moment; their results in order."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60.0)
    return results


def test_one_of_the_workers_asking_at_once_holds_the_item(storage_url: str) -> None:
    storage = open_storage(storage_url)
    item = f"key:{os.urandom(4).hex()}"  # the proxy's storage is shared by this module's tests
    workers = [Liveness(storage, f"host-{i}:1", stale_after=60.0) for i in range(5)]
    try:
        claims = [ClaimStore(live) for live in workers]
        held = _together([lambda c=c: c.claim("s", item) for c in claims])
        assert sorted(held, key=str) == [False] * 4 + [True], held
        holder = held.index(True)
        assert claims[(holder + 1) % 5].holder("s", item) == {"owner": f"host-{holder}:1"}
        assert not claims[(holder + 1) % 5].claim("s", item), "a live holder keeps it"
        claims[holder].release("s", item)
        assert claims[(holder + 1) % 5].claim("s", item), "released: the next worker that asks takes it"
        study = optuna.load_study(study_name=claims_study_name("s"), storage=storage)
        tickets = [t for t in study.get_trials() if t.user_attrs.get("item") == item]
        assert [t.state for t in tickets].count(States.RUNNING) == 1, "one ticket open: the holder's"
    finally:
        for live in workers:
            live.close()


def test_a_dead_worker_is_taken_over_once_and_comes_back_as_a_new_worker(storage_url: str) -> None:
    storage = open_storage(storage_url)
    item = f"point:{os.urandom(4).hex()}"
    study = optuna.create_study(storage=storage, study_name=f"probe-{os.urandom(4).hex()}", direction="maximize")
    hung = Liveness(storage, "host-a:1", stale_after=GRACE, promise=0.2)  # breaks its promise at once
    takers = [Liveness(storage, f"host-{i}:2", stale_after=GRACE, promise=60.0) for i in "bcd"]
    try:
        trial = study.ask()
        trial.set_user_attr("owner", "host-a:1")
        trial.set_user_attr("worker", hung.worker_id)
        claims = [ClaimStore(live) for live in takers]
        start = time.monotonic()  # before the claim: the hung worker is live at least its grace after it
        assert ClaimStore(hung).claim(study.study_name, item)
        within = []  # the takers' answers that came while the hung worker was surely live (a busy machine: fewer)
        for c in claims:
            answer = c.claim(study.study_name, item)
            if time.monotonic() - start < GRACE:
                within.append(answer)
        assert not any(within), "a worker within its grace holds on"
        time.sleep(0.2 + GRACE + hung.beat_every + 0.3)  # its promise, the grace and a beat
        won = _together([lambda c=c: c.claim(study.study_name, item) for c in claims])
        assert won.count(True) == 1, won
        [dead] = [t for t in optuna.load_study(study_name=WORKERS_STUDY, storage=storage).get_trials()
                  if t.user_attrs.get("owner") == "host-a:1"]
        assert dead.state == States.FAIL and dead.user_attrs["fail_reason"].startswith(
            "stale: worker host-a:1 made no progress for"), dead.user_attrs
        assert takers[0].fail_stale_trials(storage, study) == [trial.number]
        assert study.get_trials()[trial.number].user_attrs["fail_reason"].startswith("stale: worker host-a:1 made")
        first = hung.worker_id
        hung.progress()  # it comes back: its next beat is refused, it carries on as a new worker
        deadline = time.time() + 10
        while hung.revivals == 0 and time.time() < deadline:
            hung.progress()
            time.sleep(0.05)
        assert hung.revivals == 1 and hung.worker_id != first
        assert takers[0].gone(hung.worker_id) is None, "the new worker trial is live"
        assert takers[0].gone(first) is not None, "the dead one stays dead"
    finally:
        for live in (hung, *takers):
            live.close()


def _legacy_tables(path: Path, heartbeat: float) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE autotune_workers (owner VARCHAR(256) PRIMARY KEY, heartbeat FLOAT NOT NULL)")
        db.execute("CREATE TABLE autotune_claims (study_name VARCHAR(512), item VARCHAR(512), owner VARCHAR(256), "
                   "heartbeat FLOAT, done BOOLEAN, PRIMARY KEY (study_name, item))")
        db.execute("INSERT INTO autotune_workers VALUES ('old-node:42', ?)", (heartbeat,))


def test_a_live_worker_of_an_older_autotune_is_refused_in_one_line(tmp_path: Path) -> None:
    from autotune.search.driver.session import open_store

    path = tmp_path / "old.db"
    open_storage(f"sqlite:///{path}").engine.dispose()
    _legacy_tables(path, time.time())
    with pytest.raises(StorageError) as refused:
        open_store(f"sqlite:///{path}", workers_share=True, timeout=60.0)
    message = str(refused.value)
    assert "\n" not in message and "older autotune (old-node:42" in message and "upgrade every worker" in message


def test_a_storage_of_an_older_autotune_loads_and_its_running_trial_is_stale(tmp_path: Path) -> None:
    from autotune.search.driver.session import close_store, open_store

    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    old = optuna.create_study(storage=url, study_name="autotune-unet-fast-0123456789ab", direction="maximize")
    done = old.ask()
    done.set_user_attr("owner", "old-node:42")
    old.tell(done, 3.0)
    left = old.ask()
    left.set_user_attr("owner", "old-node:42")  # what the old worker wrote: no worker trial
    _legacy_tables(path, time.time() - 3600.0)  # its heartbeat is an hour old: not live
    store = open_store(url, workers_share=True, timeout=60.0)
    try:
        study = optuna.load_study(study_name=old.study_name, storage=store.storage)
        assert store.liveness.fail_stale_trials(store.storage, study) == [left.number]
        trials = study.get_trials()
        assert trials[done.number].state == States.COMPLETE and trials[done.number].value == 3.0
        assert trials[left.number].user_attrs["fail_reason"] == "stale: worker old-node:42 is gone (no heartbeat)"
    finally:
        close_store(store)


@pytest.mark.parametrize("url", ["grpc://db-node", "grpc://:13000", "grpc://db-node:0", "grpc://db-node:99999",
                                 "journal://", "journal:///"])
def test_bad_proxy_and_journal_urls_are_refused_in_one_line(url: str) -> None:
    from autotune.checks.places import storage_url

    with pytest.raises(SpecError) as refused:
        storage_url(url, "--storage")
    assert "\n" not in str(refused.value) and "--storage" in str(refused.value)


def test_no_proxy_at_the_address_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.search.storage import backends

    monkeypatch.setattr(backends, "READY_SECONDS", 0.5)
    url = f"grpc://127.0.0.1:{_free_port()}"
    with pytest.raises(StorageError) as refused:
        open_storage(url)
    assert "no storage proxy answers there" in str(refused.value) and "autotune proxy" in str(refused.value)


def test_the_proxy_serves_a_database_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.cli import main

    assert main(["proxy", "--storage", f"journal:///{tmp_path / 'j.log'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the proxy serves a database" in err[0], err


def test_the_proxy_on_a_taken_port_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["proxy", "--storage", f"sqlite:///{tmp_path / 'p.db'}", "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--port {port}: cannot listen there" in err[0], err


@pytest.mark.parametrize("raw", ["sleep=1", "sleep=1,base=1MiB,patch=1MiB,window=lots", "sleep=-1,base=1,patch=1,window=1",
                                 "sleep=1,base=1,patch=1,window=1,extra=2", "nonsense"])
def test_a_bad_fake_probe_setting_is_one_line(raw: str) -> None:
    from autotune.search.curves.fake import parse_fake_probe

    with pytest.raises(SpecError) as refused:
        parse_fake_probe(raw)
    assert "\n" not in str(refused.value) and "AUTOTUNE_FAKE_PROBE" in str(refused.value)


def test_the_fake_probe_answers_from_its_model() -> None:
    from config_fixtures import bundle_config

    from autotune.search.curves.fake import FakeProber, parse_fake_probe

    config = bundle_config()
    prober = FakeProber(parse_fake_probe("sleep=0,base=64MiB,patch=32MiB,window=16MiB"), 200 * 2**20, config)
    assert prober.config() is config  # the key's typed config, as the search handed it
    fits = prober.probe({"num_patches_per_iter": 4}, ("train",))
    assert fits["status"] == "ok" and fits["peak_bytes"] == (64 + 4 * 32) * 2**20 and fits["samples_per_s"] > 0
    assert prober.probe({"num_patches_per_iter": 5}, ("train",))["status"] == "oom"
    infer = prober.probe({"num_sw_batch_size": 3}, ("infer",))
    assert infer["peak_bytes"] == (64 + 3 * 16) * 2**20 and infer["sw_seconds_per_volume"] > 0


def test_the_bookkeeping_studies_say_what_they_are(tmp_path: Path) -> None:
    """The dashboard lists ``autotune-workers`` and each ``<key>-claims`` beside the tuning studies: their notes say
    they are bookkeeping and where the answer is."""
    from optuna_dashboard._note import get_note_from_system_attrs

    from autotune.search.storage.liveness import ensure_study

    storage = open_storage(f"sqlite:///{tmp_path / 'notes.db'}")
    for name, says in ((WORKERS_STUDY, "One trial per `autotune tune`, `run` or `worker` process"),
                       (claims_study_name("autotune-unet-fast-abc"), "The answer is in `autotune-unet-fast-abc`")):
        study_id = ensure_study(storage, name, "bookkeeping")
        body = get_note_from_system_attrs(storage.get_study_system_attrs(study_id), None)["body"]
        assert f"## {name}: bookkeeping, not a tuning study" in body and says in body, body


@pytest.mark.parametrize(("url", "content", "says"), [
    ("journal:///{}/notes.log", "notes, not a journal\n", "is not an Optuna journal file"),
    ("sqlite:///{}/notes.db", "notes, not a database\n", "is not an SQLite database"),
], ids=["journal", "sqlite"])
def test_a_storage_file_of_another_kind_is_refused_before_any_write(tmp_path: Path, url: str, content: str,
                                                                   says: str) -> None:
    from autotune.search.storage.study import check_storage

    url = url.format(tmp_path)
    path = tmp_path / url.rpartition("/")[2]
    path.write_text(content)
    with pytest.raises(StorageError, match=says) as refused:
        check_storage(url)
    assert "\n" not in str(refused.value) and path.read_text() == content
    check_storage(url.replace(path.name, "fresh" + path.suffix))  # a file not made yet: made by the run


def test_runs_racing_to_create_the_tables_of_a_new_sqlite_file_both_open_it(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs started together on a new SQLite file: the one that loses the race to create Optuna's tables is
    told "table ... already exists" (an OperationalError on SQLite); it opens the storage the other made."""
    import sqlalchemy.exc

    from autotune.search.storage import study

    real, calls = study._rdb_storage, []

    def lost_the_race_once(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise sqlalchemy.exc.OperationalError("CREATE TABLE trial_params", {}, Exception(
                "table trial_params already exists"))
        return real(*args, **kwargs)

    monkeypatch.setattr(study, "_rdb_storage", lost_the_race_once)
    storage = open_storage(f"sqlite:///{tmp_path / 'raced.db'}")
    assert len(calls) == 2 and storage.get_all_studies() == []
