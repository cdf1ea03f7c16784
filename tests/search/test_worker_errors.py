"""``autotune worker`` (and the tuner under it) refuses bad environments before doing any work:
a corrupt or truncated bundle config, a work folder it cannot write, a storage it cannot reach.
Each gives one line on stderr naming the culprit (exit code 2), never a traceback, never a
password, and nothing half-written: no bundle changed, no stray temp file, no storage created.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from probe_fixtures import shared_tiny_bundles, two_fold_work

from autotune.cli import main

CONFIG = Path("configs") / "hyper_parameters.yaml"
LIMIT = str(64 * 2**20)
SECRET = "s3cret-pw"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_tiny_bundles(tmp_path_factory, algos=("unet",))["unet"]


@pytest.fixture()
def work(tiny: Path, tmp_path: Path) -> Path:
    return two_fold_work(tiny, tmp_path / "work")


def _snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` with its content hash: equal snapshots = nothing written."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _worker(work: Path, storage: str | None, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    args = ["worker", "--work-dir", str(work), "--memory-limit", LIMIT, "--strategy", "estimate",
            "--range-num-images-per-batch", "1", "2", "--range-num-sw-batch-size", "1", "1", "--quiet", *extra]
    if storage is not None:
        args += ["--storage", storage]
    code = main(args)
    captured = capsys.readouterr()
    return code, (captured.err + captured.out).strip()


def _assert_one_line(code: int, output: str, *needles: str) -> None:
    assert code == 2, output
    assert len(output.splitlines()) == 1, output
    assert output.startswith("autotune worker: error: ") and "Traceback" not in output
    for needle in needles:
        assert needle.lower() in output.lower(), output


def _garbage(path: Path) -> None:
    path.write_text("algo: unet\nnetwork: {name: UNet, args: [1, 2\n")


def _truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _binary(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 8)


def _bad_value(path: Path) -> None:
    path.write_text(path.read_text().replace("num_sw_batch_size: 4", "num_sw_batch_size: -4"))


@pytest.mark.parametrize(
    "damage, needle",
    [(_garbage, "not valid YAML"), (_truncated, ""), (_empty, "top level must be a mapping"),
     (_binary, "UTF-8"), (_bad_value, "num_sw_batch_size")],
    ids=["garbage", "truncated", "empty", "binary", "bad-value"],
)
def test_corrupt_bundle_config(work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               damage: Callable[[Path], None], needle: str) -> None:
    bad = work / "unet_1" / CONFIG
    damage(bad)
    before = _snapshot(work)
    db = tmp_path / "studies" / "s.db"
    code, output = _worker(work, f"sqlite:///{db}", capsys)
    _assert_one_line(code, output, str(bad), needle)
    assert _snapshot(work) == before, "the good bundle was not tuned half-way, no temp file left"
    assert not db.exists() and not db.parent.exists(), "no storage created for a run that cannot start"


@contextlib.contextmanager
def _unwritable(folder: Path) -> Iterator[None]:
    """Make ``folder`` refuse new files, also for root (``chattr +i``); skip where neither way works."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    if shutil.which("chattr") is None:
        pytest.skip("running as root without chattr: cannot make a folder unwritable")
    done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"chattr +i is not supported here: {done.stderr.strip()}")
    try:
        probe = folder / ".probe"
        with contextlib.suppress(OSError):
            probe.write_text("x")
            probe.unlink()
            pytest.skip("the immutable flag does not stop root here")
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True)


def test_unwritable_bundle_fails_before_any_trial(work: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    folder = work / "unet_1" / "configs"
    db = tmp_path / "studies" / "s.db"
    before = _snapshot(work)
    with _unwritable(folder):
        code, output = _worker(work, f"sqlite:///{db}", capsys)
    _assert_one_line(code, output, str(folder), "cannot write")
    assert _snapshot(work) == before, "neither bundle was written: the check comes before the search"
    assert not db.exists(), "no study was started"


def _refused_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again: nothing listens there


@pytest.mark.parametrize("how", ["option", "environment"])
def test_unreachable_storage_never_prints_the_password(work: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    url = f"postgresql+psycopg://autotune:{SECRET}@127.0.0.1:{_refused_port()}/studies"
    before = _snapshot(work)
    if how == "environment":
        monkeypatch.setenv("AUTOTUNE_STORAGE", url)
    code, output = _worker(work, url if how == "option" else None, capsys)
    _assert_one_line(code, output, "cannot connect", "autotune:***@127.0.0.1")
    assert SECRET not in output
    assert _snapshot(work) == before


def test_missing_driver_is_named_and_password_hidden(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if importlib.util.find_spec("pymysql") is not None:
        pytest.skip("pymysql is installed here")
    code, output = _worker(work, f"mysql+pymysql://autotune:{SECRET}@127.0.0.1/studies", capsys)
    _assert_one_line(code, output, "pymysql", "not installed")
    assert SECRET not in output


def test_bad_claim_stale_setting(work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_CLAIM_STALE_SECONDS", "soon")
    before = _snapshot(work)
    code, output = _worker(work, f"sqlite:///{tmp_path / 's.db'}", capsys)
    _assert_one_line(code, output, "AUTOTUNE_CLAIM_STALE_SECONDS", "soon", "number of seconds above 0")
    assert _snapshot(work) == before


def test_work_dir_without_bundles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    code, output = _worker(tmp_path / "empty", f"sqlite:///{tmp_path / 's.db'}", capsys)
    _assert_one_line(code, output, "no bundles found", "autotune generate")
    code, output = _worker(tmp_path / "missing", f"sqlite:///{tmp_path / 's.db'}", capsys)
    _assert_one_line(code, output, "work folder not found")
    assert not (tmp_path / "s.db").exists()
