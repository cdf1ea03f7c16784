"""A private PostgreSQL server for tests, started once per session and bound to 127.0.0.1 only.

Use from a test module::

    from pg_fixtures import pg_database_url, postgres_url  # noqa: F401

    @pytest.mark.postgres
    def test_something(pg_database_url: str) -> None:
        storage = optuna.storages.RDBStorage(pg_database_url)

Fixtures:
    postgres_url: (session) ``postgresql+psycopg://autotune@127.0.0.1:PORT/postgres`` of a
        throw-away cluster (``initdb -A trust -U autotune``), stopped and deleted at the end.
    pg_database_url: (function) the URL of a fresh, uniquely named database on that server,
        dropped ``WITH (FORCE)`` after the test.

When the server truly cannot start (no PostgreSQL binaries and no way to install them, no
``postgres`` user to run them as root, ``initdb`` or ``pg_ctl`` failing) the tests skip with
the reason. Set ``AUTOTUNE_REQUIRE_SYSTEM_DEPS=1`` (``.ci/run`` does) or the older
``AUTOTUNE_REQUIRE_POSTGRES=1`` to turn such a skip into a failure (``tests/system_deps.py``).

Safety: the server listens on 127.0.0.1 only (checked after start), its Unix socket lies in
its own 0700 folder, and every cluster this process started is stopped by the fixture's
teardown, by an ``atexit`` hook as a backup, and clusters left by a killed earlier run (whose
owning process is gone) are stopped and removed when the next one starts. The server itself is started and
stopped by ``benchmarks/postgres.py`` (the benchmark of many workers starts it too); this module holds the
fixtures over it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import NoReturn

import pytest
from system_deps import unavailable

from benchmarks.postgres import (
    PostgresCluster,
    Unavailable,
    check_loopback_only,
    pid_alive,
    postmaster_pid,
    running,
    start_cluster,
)

__all__ = ["postgres_url", "pg_database_url", "pg_cluster", "PostgresCluster"]


def _unavailable(reason: str) -> NoReturn:
    unavailable("PostgreSQL test server", reason, "AUTOTUNE_REQUIRE_POSTGRES")


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of a private PostgreSQL server (superuser ``autotune``, database ``postgres``) on 127.0.0.1.

    Started once per session on a free port; stopped and deleted at the end, also when tests fail.
    Skips (with the reason) when PostgreSQL cannot be started here.
    """
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable('psycopg is not installed; pip install "psycopg[binary]"')
    try:
        cluster = start_cluster()
    except Unavailable as exc:
        _unavailable(str(exc))
    try:
        check_loopback_only(cluster.url)
        yield cluster.url
    finally:
        cluster.stop()


@pytest.fixture()
def pg_database_url(postgres_url: str) -> Iterator[str]:
    """URL of a fresh database on the session's server, created for this test and dropped after it."""
    import sqlalchemy
    from sqlalchemy.engine import make_url

    name = f"autotune_test_{uuid.uuid4().hex[:16]}"
    admin = sqlalchemy.create_engine(postgres_url, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    try:
        with admin.connect() as conn:
            conn.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
        try:
            yield make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                # End connections the test left open (e.g. an Optuna storage's pool) so the drop succeeds.
                if int(conn.execute(sqlalchemy.text("SHOW server_version_num")).scalar_one()) >= 130000:
                    conn.execute(sqlalchemy.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                else:  # WITH (FORCE) arrived in PostgreSQL 13
                    conn.execute(sqlalchemy.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                                 "WHERE datname = :name"), {"name": name})
                    conn.execute(sqlalchemy.text(f'DROP DATABASE IF EXISTS "{name}"'))
    finally:
        admin.dispose()


@pytest.fixture()
def pg_cluster(postgres_url: str) -> Iterator[PostgresCluster]:
    """The session's running server, to restart or stop in a test (it is running again after the test)."""
    [cluster] = [c for c in running.values() if c.url == postgres_url]
    yield cluster
    pid = postmaster_pid(cluster.data)
    if pid is None or not pid_alive(pid):
        cluster.start_server()
