"""Writes to the studies' storage: a retry after a lost commit (the server committed, then the connection
dropped before the answer came) writes nothing twice; a full disk is exit 4 under every storage, SQLite
included."""

from __future__ import annotations

import errno
import shutil
import subprocess
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy as sa
from sqlalchemy import event

from autotune.errors import HostWriteError
from autotune.search.storage.refusals import storage_refusal
from autotune.search.storage.retry import WRITE_ID, rdb_storage_class
from autotune.search.storage.study import open_storage

optuna.logging.set_verbosity(optuna.logging.WARNING)


class LostCommits:
    """Drops the connection right after the next ``armed`` commits of a write are done in the database: the
    caller gets the error of a connection lost before the server's answer came."""

    def __init__(self, storage: optuna.storages.RDBStorage) -> None:
        import sqlite3

        self.armed = 0
        self.dropped = 0
        dialect = storage.engine.dialect
        commit = dialect.do_commit

        def do_commit(dbapi_connection: sqlite3.Connection) -> None:
            wrote = dbapi_connection.in_transaction  # sqlite3 opens a transaction at the first write only
            commit(dbapi_connection)
            if self.armed and wrote:
                self.armed -= 1
                self.dropped += 1
                raise sqlite3.OperationalError("server closed the connection unexpectedly")

        dialect.do_commit = do_commit


@pytest.fixture()
def server_like(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> optuna.storages.RDBStorage:
    """The storage class autotune opens on a database server (retrying, idempotent), here on a SQLite file."""
    import random

    monkeypatch.setattr(random, "random", lambda: 0.0)  # Optuna's own retry of a new trial waits random() * 2 s
    storage = rdb_storage_class(retry=True)(f"sqlite:///{tmp_path / 'studies.db'}")
    storage.shown_url = "postgresql://autotune@db/studies"
    return storage


def test_a_trial_whose_commit_was_lost_is_written_once(server_like: optuna.storages.RDBStorage) -> None:
    study = optuna.create_study(storage=server_like, study_name="s", direction="maximize")
    lost = LostCommits(server_like)
    lost.armed = 1
    first = study.ask()  # committed, then the connection dropped: the retry finds the trial it wrote
    lost.armed = 1
    study.tell(first, 3.0)  # ended, then dropped: the retry finds it ended as asked
    second = study.ask()
    trials = study.get_trials(deepcopy=False)
    assert lost.dropped == 2
    assert [t.number for t in trials] == [first.number, second.number] == [0, 1]
    assert trials[0].state == optuna.trial.TrialState.COMPLETE and trials[0].value == 3.0
    assert len({t.system_attrs[WRITE_ID] for t in trials}) == 2


def test_without_the_write_id_a_lost_commit_would_write_the_trial_twice(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The same drop under Optuna's own storage: the retry writes a second trial (what the write id prevents)."""
    import random

    monkeypatch.setattr(random, "random", lambda: 0.0)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'studies.db'}")
    study = optuna.create_study(storage=storage, study_name="s")
    lost = LostCommits(storage)
    lost.armed = 1
    study.ask()
    assert len(study.get_trials(deepcopy=False)) == 2


def test_the_driver_errors_that_mean_a_refused_write() -> None:
    import sqlite3

    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode = 13  # SQLITE_FULL
    locked = sqlite3.OperationalError("database is locked")
    locked.sqlite_errorcode = 5

    class DiskFull(Exception):  # psycopg's errors carry their SQLSTATE
        sqlstate = "53100"

    wrapped = sa.exc.OperationalError("INSERT", {}, full)
    assert storage_refusal(wrapped).errno == errno.ENOSPC
    assert storage_refusal(sa.exc.OperationalError("INSERT", {}, DiskFull())).errno == errno.ENOSPC
    assert storage_refusal(OSError(errno.EROFS, "read-only")).errno == errno.EROFS
    assert storage_refusal(sa.exc.OperationalError("INSERT", {}, locked)) is None
    assert storage_refusal(sa.exc.OperationalError("SELECT", {}, ConnectionResetError())) is None


def test_a_full_sqlite_database_mid_search_is_exit_4(tmp_path: Path) -> None:
    """The database file may not grow (``max_page_count``): SQLite answers as on a full disk."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    storage = open_storage(url)
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize")

    @event.listens_for(storage.engine, "connect")
    def no_growth(connection: object, record: object) -> None:
        cursor = connection.cursor()  # type: ignore[attr-defined]
        pages = cursor.execute("PRAGMA page_count").fetchone()[0]
        cursor.execute(f"PRAGMA max_page_count = {pages}")
        cursor.close()

    storage.engine.dispose()  # new connections, each with the limit
    with pytest.raises(HostWriteError) as caught:
        for _ in range(50):
            trial = study.ask()
            trial.set_user_attr("note", "x" * 5000)
    assert caught.value.exit_code == 4
    assert str(caught.value).startswith(f"cannot write the tuning storage {tmp_path / 'studies.db'}: no space left "
                                        "on the device")
    assert str(caught.value).endswith("kept: every trial finished before this write; free space (or give another "
                                      "--storage), then run the same command to continue")


@pytest.fixture()
def full_tmpfs(tmp_path: Path) -> Path:
    """A 1 MiB tmpfs, filled (skips where mounting is not permitted)."""
    folder = tmp_path / "full"
    folder.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        with open(folder / "filler.bin", "wb") as handle:
            try:
                while True:
                    handle.write(b"\0" * 65536)
                    handle.flush()
            except OSError:
                pass
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)  # lazily: the storage may still hold the file


def test_tune_on_a_full_disk_under_sqlite_exits_4(full_tmpfs: Path, tmp_path_factory: pytest.TempPathFactory,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from probe_fixtures import shared_tiny_bundles

    from autotune.cli import main

    bundle = shared_tiny_bundles(tmp_path_factory, algos=("unet",))["unet"]
    code = main(["tune", str(bundle), "--storage", f"sqlite:///{full_tmpfs / 'autotune.db'}", "--device", "cpu",
                 "--memory-limit", "64MiB", "-q"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("autotune ")]
    assert code == 4, lines
    assert lines == [f"autotune tune: error: cannot write the tuning storage {full_tmpfs / 'autotune.db'}: no space "
                     f"left on the device (0 B free there); kept: every trial finished before this write; free space "
                     "(or give another --storage), then run the same command to continue"]


@pytest.mark.parametrize(("driver_line", "says"), [
    ("FATAL:  sorry, too many clients already", "connections are all taken"),
    ("connection refused", "database server was unreachable"),
])
def test_a_server_refusing_past_the_budget_is_one_line_that_says_why(driver_line: str, says: str) -> None:
    """A server that keeps refusing connections ends in one line; one whose connections are all taken (hundreds of
    workers each holding its own) says to share a pool through the proxy, not that the server is down."""
    from autotune.errors import StorageError
    from autotune.search.storage.retry import retrying

    class DriverError(Exception):
        pass

    def refuse() -> None:
        raise sa.exc.OperationalError("connect", {}, DriverError(driver_line))

    pauses: list[float] = []
    with pytest.raises(StorageError) as caught:
        retrying(refuse, "postgresql://u:***@db/x", budget=1.0, sleep=pauses.append)
    line = str(caught.value)
    assert "\n" not in line and says in line and "postgresql://u:***@db/x" in line
    assert pauses, "the refusal was retried before giving up"
    assert ("autotune proxy" in line) == (says == "connections are all taken")


def test_only_a_retried_new_trial_looks_for_its_lost_commit(server_like: optuna.storages.RDBStorage,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The look for a trial an earlier try wrote (a join made with the study's row locked) is made by a retry
    only: a first try cannot follow a lost commit, and on a busy proxy that look was most of its work."""
    from autotune.search.storage import retry

    looks: list[int] = []
    real = retry._written_trial
    monkeypatch.setattr(retry, "_written_trial", lambda *a: looks.append(1) or real(*a))
    study = optuna.create_study(storage=server_like, study_name="s", direction="maximize")
    for _ in range(3):
        study.ask()
    assert looks == [], "first tries looked for a lost commit"
    lost = LostCommits(server_like)
    lost.armed = 1
    study.ask()  # committed, then dropped: the retry looks, finds it, and does not write it again
    assert looks == [1] and lost.dropped == 1
    assert [t.number for t in study.get_trials(deepcopy=False)] == [0, 1, 2, 3]
    assert retry._TRIED == set(), "a write's id is forgotten once it is written"


def test_opening_a_full_server_says_to_share_a_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hundreds of workers each opening its own connections fill the server's: the one that finds it full is
    told, in one line, to share a pool through the proxy, not to check the server's address."""
    from autotune.errors import StorageError
    from autotune.search.storage import study as study_module

    class DriverError(Exception):
        pass

    def refused(line: str) -> Any:
        def fake(url: str, shown: str, kwargs: dict) -> object:
            raise sa.exc.OperationalError("connect", {}, DriverError(line))
        return fake

    url = "postgresql+psycopg://autotune:secret@db.invalid/x"
    monkeypatch.setattr(study_module, "_rdb_storage", refused("FATAL:  sorry, too many clients already"))
    with pytest.raises(StorageError) as full:
        study_module.open_storage(url)

    def in_a_commit(url: str, shown: str, kwargs: dict) -> object:  # Optuna's wrapping of the same refusal
        try:
            raise sa.exc.OperationalError("commit", {}, DriverError("FATAL:  sorry, too many clients already"))
        except sa.exc.OperationalError as exc:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from exc

    monkeypatch.setattr(study_module, "_rdb_storage", in_a_commit)
    with pytest.raises(StorageError) as full_in_commit:
        study_module.open_storage(url)
    assert "connections are all taken" in str(full_in_commit.value)
    monkeypatch.setattr(study_module, "_rdb_storage", refused("could not translate host name"))
    with pytest.raises(StorageError) as missing:
        study_module.open_storage(url)
    for caught in (full, missing):
        assert "\n" not in str(caught.value) and "secret" not in str(caught.value)
    assert "connections are all taken" in str(full.value) and "autotune proxy" in str(full.value)
    assert "cannot connect" in str(missing.value) and "check the server and the URL" in str(missing.value)
