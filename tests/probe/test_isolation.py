"""Probe children forked from the preloaded server: imports paid once, isolation kept, the
parent's main script never run again in a child."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from probe_fixtures import shared_tiny_bundles

from autotune.probe import isolation, runner
from autotune.probe.isolation import CHECKED_PYTHONS, ISOLATION_ENV, isolation_mode
from autotune.probe.runner import run_probe

REPO = Path(__file__).resolve().parents[2]
QUICK = {"warmup_steps": 0, "measure_steps": 1, "num_patches_per_iter": 1, "num_sw_batch_size": 1, "timeout": 240,
         "phases": ("train",)}


@pytest.fixture(scope="module")
def unet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_tiny_bundles(tmp_path_factory, algos=("unet",))["unet"]


forkserver_checked = pytest.mark.skipif(sys.version_info[:2] not in CHECKED_PYTHONS,
                                        reason="the fork-server launch is not checked on this Python")


@forkserver_checked
def test_forked_child_finds_torch_and_monai_imported(unet: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ISOLATION_ENV, raising=False)
    assert isolation_mode() == "forkserver"
    result = run_probe(unet, **QUICK)
    assert result["status"] == "ok", result["error_tail"]
    # a fresh interpreter spends seconds importing torch and MONAI; a forked child finds them loaded
    assert result["timings"]["imports"] < 0.5, result["timings"]


def test_subprocess_isolation_still_works(unet: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ISOLATION_ENV, "subprocess")
    result = run_probe(unet, env={"AUTOTUNE_PROBE_FAULT": "raise"}, **QUICK)
    assert result["status"] == "error" and result["error_type"] == "ValueError"


def test_a_script_without_main_guard_runs_once(unet: Path, tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from autotune.probe.runner import run_probe\n"
        "print('main ran', flush=True)\n"
        f"r = run_probe({str(unet)!r}, env={{'AUTOTUNE_PROBE_FAULT': 'raise'}}, num_patches_per_iter=1, timeout=120)\n"
        "print('status', r['status'], r['error_type'], flush=True)\n"
        "import torch\n"
        "print('cuda initialised in parent', torch.cuda.is_initialized(), flush=True)\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("main ran") == 1, out.stdout
    assert "status error ValueError" in out.stdout
    assert "cuda initialised in parent False" in out.stdout


@forkserver_checked
def test_prestart_returns_before_the_server_has_imported_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuner starts the fork server before it estimates: the server's imports (seconds) overlap the
    estimator's trace instead of delaying the first probe. A fresh interpreter, so the server is new."""
    code = (
        "import time, sys\n"
        "from multiprocessing import forkserver\n"
        "from autotune.probe.isolation import prestart\n"
        "start = time.perf_counter()\n"
        "assert prestart() is True\n"
        "took = time.perf_counter() - start\n"
        "assert forkserver._forkserver._forkserver_pid is not None\n"
        "assert 'torch' not in sys.modules\n"
        "print(took)\n"
    )
    monkeypatch.delenv(ISOLATION_ENV, raising=False)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.strip()) < 1.0  # torch and MONAI alone take longer than that to import
    monkeypatch.setenv(ISOLATION_ENV, "subprocess")
    from autotune.probe.isolation import prestart

    assert prestart() is False


def test_an_unchecked_python_starts_fresh_interpreters(unet: Path, monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    """On a Python whose private fork-server launch was not compared with ``_Popen._launch``, probes
    start as fresh interpreters even when the environment asks for the fork server."""
    monkeypatch.setattr(sys, "version_info", (3, 99, 0, "final", 0))
    monkeypatch.setenv(ISOLATION_ENV, "forkserver")
    assert isolation_mode() == "subprocess"
    assert isolation.prestart() is False
    with pytest.raises(OSError, match="not checked on Python 3.99"):
        isolation.start_forked(str(tmp_path / "request.json"), str(tmp_path / "out"), str(tmp_path / "err"), {})

    def no_fork(*args: object) -> None:
        raise AssertionError("a probe was forked from the server on an unchecked Python")

    monkeypatch.setattr(runner, "_run_forked", no_fork)
    result = run_probe(unet, env={"AUTOTUNE_PROBE_FAULT": "raise"}, **QUICK)
    assert result["status"] == "error" and result["error_type"] == "ValueError"


def test_the_running_python_uses_the_fork_server_where_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ISOLATION_ENV, raising=False)
    for version in CHECKED_PYTHONS:
        monkeypatch.setattr(sys, "version_info", (*version, 0, "final", 0))
        assert isolation_mode() == "forkserver"


def test_the_server_lets_go_of_its_callers_output_at_once() -> None:
    """A caller that started the server and exits: a reader of its output pipe sees the end right after the
    caller's last line, not after the server's imports and teardown (the GPU check's tune looked hung after its
    summary)."""
    import time

    code = ("from autotune.probe.isolation import prestart\nprestart()\nimport time\ntime.sleep(2)\n"
            "print('caller done', flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "caller done"
    last_line = time.monotonic()
    assert proc.stdout.read() == ""  # the end of the pipe
    waited = time.monotonic() - last_line
    proc.wait(timeout=60)
    assert waited < 3.0  # about 0.1 s here; 16 s in all while the server held the pipe through its imports and teardown
    import autotune.probe.server_output as server_output

    assert not server_output.in_the_fork_server()  # imported here: this process's output stays


def ask_the_server(argv: list[str]) -> int:
    """A forked child's target: fork a child of its own (``report`` ARGV), say what it saw as JSON lines in
    ``argv[0]``/child.json, and either wait for the child or (``argv[1] == "leave"``) sleep until killed."""
    import json
    import os
    import time
    from multiprocessing import forkserver

    folder, mode = Path(argv[0]), argv[1]
    child = isolation.start_forked_call("test_isolation:report", [str(folder), mode], str(folder / "g.out"),
                                        str(folder / "g.err"), dict(os.environ))
    seen = {"pid": os.getpid(), "ppid": os.getppid(), "grandchild": child.pid, "prestart": isolation.prestart(),
            "server_started_here": forkserver._forkserver._forkserver_pid is not None}
    (folder / "child.json").write_text(json.dumps(seen))
    if mode == "leave":
        time.sleep(300)
    return child.wait()


def report(argv: list[str]) -> int:
    """The grandchild: its parent's pid in ``argv[0]``/grandchild.json, then exit 7 (or sleep, to be ended)."""
    import json
    import os
    import time

    folder = Path(argv[0])
    (folder / "grandchild.json").write_text(json.dumps({"pid": os.getpid(), "ppid": os.getppid()}))
    if argv[1] == "leave":
        time.sleep(300)
    return 7


def _read_when_there(path: Path, child: object) -> dict:
    import json
    import time

    deadline = time.monotonic() + 120
    while not path.is_file() or not path.read_text():
        assert time.monotonic() < deadline, f"{path.name} never written"
        assert child.returncode is None or path.is_file(), f"the child ended with {child.returncode}"  # type: ignore[attr-defined]
        time.sleep(0.05)
    return json.loads(path.read_text())


@forkserver_checked
def test_a_forked_child_forks_its_children_through_the_same_server(tmp_path: Path) -> None:
    """No second server (a second import of torch and MONAI): the grandchild is the server's child too, its exit
    code reaches the child; a grandchild whose asker is killed outright ends with it."""
    import os
    import signal
    import time

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    for mode in ("wait", "leave"):
        folder = tmp_path / mode
        folder.mkdir()
        child = isolation.start_forked_call("test_isolation:ask_the_server", [str(folder), mode],
                                            str(folder / "c.out"), str(folder / "c.err"), env)
        seen = _read_when_there(folder / "child.json", child)
        grandchild = _read_when_there(folder / "grandchild.json", child)
        assert seen["prestart"] is True and seen["server_started_here"] is False
        assert grandchild["ppid"] == seen["ppid"] != os.getpid()  # both forked by the one server
        if mode == "wait":
            assert child.wait() == 7, (folder / "c.err").read_text()[-2000:]
            continue
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        deadline = time.monotonic() + 60
        while _exists(grandchild["pid"]):
            assert time.monotonic() < deadline, "the grandchild outlived the child that asked for it"
            time.sleep(0.05)


def _exists(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:  # a zombie the server has not reaped yet is gone too
            return stat.read().split(") ")[-1][:1] != "Z"
    except FileNotFoundError:  # reaped meanwhile
        return False
