"""A missing PostgreSQL or Chromium skips a test with the reason, and fails it when
AUTOTUNE_REQUIRE_SYSTEM_DEPS is set (as .ci/run does)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from system_deps import REQUIRE_ENV, required, unavailable

TESTS = Path(__file__).resolve().parent

# The fixtures as the real tests use them, with the server's lookups (benchmarks/postgres.py) made to find nothing.
CONFTEST = '''
import test_dashboard

import benchmarks.postgres

benchmarks.postgres._find_bindir = lambda: None
benchmarks.postgres._install_postgresql = lambda: "installing is switched off by this test"
test_dashboard.CHROMIUM = None
'''
TESTS_FILE = '''
from pg_fixtures import postgres_url  # noqa: F401
from test_dashboard import chromium  # noqa: F401


def test_needs_postgres(postgres_url):
    pass


def test_needs_chromium(chromium):
    pass
'''


def _run_missing(tmp_path: Path, require: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_missing.py").write_text(TESTS_FILE)
    env = {k: v for k, v in os.environ.items() if k not in (REQUIRE_ENV, "AUTOTUNE_REQUIRE_POSTGRES")}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(TESTS / "search"), str(TESTS.parent), env.get("PYTHONPATH", "")])
    if require is not None:
        env[REQUIRE_ENV] = require
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rsE", "-p", "no:cacheprovider", "-o",
                           "addopts=", str(tmp_path / "test_missing.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_missing_system_deps_skip_with_the_reason_by_default(tmp_path: Path) -> None:
    proc = _run_missing(tmp_path, None)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "2 skipped" in out, out[-3000:]
    assert "PostgreSQL test server unavailable: PostgreSQL server binaries not found" in out
    assert "installing is switched off by this test" in out
    assert "headless Chromium unavailable: not installed" in out


def test_missing_system_deps_fail_when_required(tmp_path: Path) -> None:
    proc = _run_missing(tmp_path, "1")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "2 errors" in out and "skipped" not in out, out[-3000:]
    assert "PostgreSQL test server unavailable: PostgreSQL server binaries not found" in out
    assert f"headless Chromium unavailable: not installed (apt-get install chromium); .ci/run installs it " \
           f"({REQUIRE_ENV} is set: this test must run here)" in out


@pytest.mark.parametrize(("value", "expected"), [(None, False), ("", False), ("0", False), ("1", True),
                                                 ("yes", True)])
def test_required_reads_the_variable(monkeypatch: pytest.MonkeyPatch, value: str | None, expected: bool) -> None:
    monkeypatch.delenv("AUTOTUNE_REQUIRE_POSTGRES", raising=False)
    if value is None:
        monkeypatch.delenv(REQUIRE_ENV, raising=False)
    else:
        monkeypatch.setenv(REQUIRE_ENV, value)
    assert required() is expected
    exc_type = pytest.fail.Exception if expected else pytest.skip.Exception
    with pytest.raises(exc_type, match="thing unavailable: gone"):
        unavailable("thing", "gone")


def test_the_older_postgres_switch_still_requires_postgres(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    monkeypatch.setenv("AUTOTUNE_REQUIRE_POSTGRES", "1")
    with pytest.raises(pytest.fail.Exception, match="AUTOTUNE_REQUIRE_POSTGRES is set"):
        unavailable("PostgreSQL test server", "gone", "AUTOTUNE_REQUIRE_POSTGRES")
    with pytest.raises(pytest.skip.Exception):
        unavailable("headless Chromium", "gone")
