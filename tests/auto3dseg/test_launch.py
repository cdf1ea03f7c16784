"""``python -m autotune.launch``: a script runs under the memory limit, its peak recorded; stopped, the launcher
keeps its record and leaves no process behind.

The launches run forked from the probes' fork server with torch imported (``monai_fixtures.start_launcher``,
the launcher's ``main`` in a process of its own); the bad arguments start ``python -m autotune.launch`` itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from monai_fixtures import run_launcher, start_launcher

SCRIPT = '''
import sys
import torch

def step(n):
    model = torch.nn.Linear(256, 256, bias=False)
    model.train()
    x = torch.ones(n * 1024, 256, requires_grad=True)  # n MiB
    model(x).sum().backward()
    model.eval()
    with torch.no_grad():
        y = torch.zeros(3 * n * 1024, 256)  # 3n MiB, validation-like
    return y.sum()

if __name__ == "__main__":
    step(int(sys.argv[2]))
    sys.exit(int(sys.argv[3]))
'''


def _launch(tmp_path: Path, limit: str, size: int, code: int = 0) -> tuple[SimpleNamespace, dict]:
    """The launch to its end: (its ``returncode`` and ``stderr``, its record)."""
    bundle = tmp_path / "bundle"
    (bundle / "scripts").mkdir(parents=True, exist_ok=True)
    script = bundle / "scripts" / "train.py"
    script.write_text(SCRIPT)
    returncode, stderr = run_launcher(["--memory-limit", limit, "--device", "cpu", "--", str(script), "run",
                                       str(size), str(code)], tmp_path, timeout=300)
    record = json.loads((bundle / "autotune" / "launch.json").read_text())
    return SimpleNamespace(returncode=returncode, stderr=stderr), record


def test_the_script_runs_under_the_limit_and_its_peaks_are_recorded(tmp_path: Path) -> None:
    proc, record = _launch(tmp_path, "64MiB", 4, code=5)
    assert proc.returncode == 5, proc.stderr  # the script's own exit code
    assert record["status"] == "error" and record["exit_code"] == 5 and record["memory_limit"] == 64 * 2**20
    # training: x with model(x), then with x's gradient (4 MiB each); validation: 12 MiB of zeros
    assert 8 * 2**20 <= record["train_peak_bytes"] <= 13 * 2**20
    assert 12 * 2**20 <= record["validation_peak_bytes"] <= record["peak_bytes"] <= 30 * 2**20
    assert record["peak_rss_bytes"] > record["peak_bytes"] and "launch.json" in proc.stderr


def test_crossing_the_limit_is_an_out_of_memory_exit(tmp_path: Path) -> None:
    proc, record = _launch(tmp_path, "6MiB", 4)
    assert proc.returncode == 3 and record["status"] == "oom" and record["within_limit"] is False
    assert "OutOfMemoryError" in record["error"] and "exceeds the memory limit" in record["error"]
    # MONAI's train.py cannot split a step: one line names what failed and the command that re-tunes
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("autotune.launch:")]
    assert line.startswith("autotune.launch: out of memory in training with its batch under 6.00 MiB on cpu (peak ")
    assert f"re-tune with 'autotune tune {tmp_path / 'bundle'} --device cpu --memory-limit {6 * 2**20}'" in line
    assert record["failed_point"]["phase"] == "training" and record["failed_point"]["study"] is None  # not tuned


def test_bad_arguments_exit_2_in_one_line(tmp_path: Path) -> None:
    for args in (["--memory-limit", "lots", "--", "x.py"], ["--memory-limit", "1GiB", "--", str(tmp_path / "no.py")],
                 ["--memory-limit", "1GiB"]):
        proc = subprocess.run([sys.executable, "-m", "autotune.launch", *args], capture_output=True, text=True)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


STARTS_CHILDREN = '''
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

PIDS = Path(sys.argv[2])

def note(pid):
    (PIDS / str(pid)).write_text("")

def idle():  # a data-loader worker's stand-in
    note(os.getpid())
    time.sleep(600)

def leave_the_group():  # a grandchild in a session of its own whose parent is gone
    if os.fork() == 0:
        os.setsid()
        note(os.getpid())
        time.sleep(600)
    os._exit(0)

if __name__ == "__main__":
    model = torch.nn.Linear(256, 256, bias=False)
    model.train()
    out = model(torch.ones(4 * 1024, 256))  # 4 MiB in, 4 MiB out: the training peak so far
    context = mp.get_context("fork")
    workers = [context.Process(target=idle, daemon=True) for _ in range(2)]
    for worker in workers:
        worker.start()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    note(sleeper.pid)
    note(os.getpid())
    escaper = context.Process(target=leave_the_group)
    escaper.start()
    escaper.join()
    while len(list(PIDS.iterdir())) < 5:
        time.sleep(0.01)
    (PIDS.parent / "ready").write_text("")
    time.sleep(600)
'''


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads processes from /proc (Linux)")
def test_a_stopped_launch_keeps_its_record_and_leaves_no_process_behind(tmp_path: Path) -> None:
    import os
    import signal
    import time

    script = tmp_path / "bundle" / "scripts" / "train.py"
    script.parent.mkdir(parents=True)
    script.write_text(STARTS_CHILDREN)
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    proc = start_launcher(["--memory-limit", "64MiB", "--device", "cpu", "--", str(script), "run", str(pids_dir)],
                          tmp_path)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "ready").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = [int(p.name) for p in pids_dir.iterdir()]
        assert len(pids) == 5, proc.err.read_text() if proc.poll() is not None else "the script did not start"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 143, err
        record = json.loads((script.parents[1] / "autotune" / "launch.json").read_text())
        assert (record["status"], record["signal"], record["exit_code"]) == ("stopped", "SIGTERM", 143)
        assert record["script_exit_code"] is None and record["stopped_processes"] >= 5
        assert 8 * 2**20 <= record["train_peak_bytes"] <= record["peak_bytes"] <= record["memory_limit"]
        assert record["device"] == "cpu" and record["peak_rss_bytes"] > 0 and "stopped by SIGTERM" in err
        deadline = time.monotonic() + 5
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in pids if _alive(pid)]
    finally:
        for pid in [proc.pid, *pids]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_stop_after_the_script_ended_records_its_exit_status(tmp_path: Path) -> None:
    import signal

    from autotune.auto3dseg.supervise import SharedPeaks, _stopped_record

    shared = SharedPeaks()
    shared.raise_to("train_peak_bytes", 5 * 2**20)
    shared.raise_to("train_peak_bytes", 2**20)  # a peak only rises
    shared.set("peak_bytes", 6 * 2**20)
    running = tmp_path / "launch.json"
    running.write_text(json.dumps({"device": "cpu", "measure": "tracked", "status": "running"}))
    base = {"script": "train.py", "args": [], "device": "auto", "memory_limit": 2**30}
    before = _stopped_record(base, shared, signal.SIGUSR1, None, 0, 1.0, running)
    assert before["script_exit_code"] is None and before["status"] == "stopped" and before["exit_code"] == 138
    shared.script_ended(5)
    after = _stopped_record(base, shared, signal.SIGTERM, 123, 2, 1.0, running)
    assert (after["script_exit_code"], after["signal"], after["exit_code"]) == (5, "SIGTERM", 143)
    assert after["train_peak_bytes"] == 5 * 2**20 and after["within_limit"] is True and after["peak_rss_bytes"] == 123
    assert after["device"] == "cpu" and after["measure"] == "tracked"  # what the worker wrote when it started
    assert _stopped_record(base, shared, signal.SIGKILL, None, 0, 1.0, None)["status"] == "killed"
