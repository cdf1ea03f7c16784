"""``python -m autotune.launch``: a script runs in-process under the memory limit, its peak recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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


def _launch(tmp_path: Path, limit: str, size: int, code: int = 0) -> tuple[subprocess.CompletedProcess, dict]:
    bundle = tmp_path / "bundle"
    (bundle / "scripts").mkdir(parents=True, exist_ok=True)
    script = bundle / "scripts" / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "autotune.launch", "--memory-limit", limit, "--device", "cpu", "--",
                           str(script), "run", str(size), str(code)], capture_output=True, text=True, timeout=300)
    record = json.loads((bundle / "autotune" / "launch.json").read_text())
    return proc, record


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


def test_bad_arguments_exit_2_in_one_line(tmp_path: Path) -> None:
    for args in (["--memory-limit", "lots", "--", "x.py"], ["--memory-limit", "1GiB", "--", str(tmp_path / "no.py")],
                 ["--memory-limit", "1GiB"]):
        proc = subprocess.run([sys.executable, "-m", "autotune.launch", *args], capture_output=True, text=True)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
