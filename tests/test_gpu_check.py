"""The GPU check runs end to end on the CPU (``--dry-run``), so CI keeps it working for the GPU runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_dry_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = dict(os.environ, AUTOTUNE_GPU_CHECK_WORK=str(tmp_path / "work"))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out", str(out), "--dry-run",
                           "--deadline", "1200"], capture_output=True, text=True, env=env, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "gpu_check.json").read_text())
    sections = results["sections"]
    assert [s for s in ("env", "data", "probes", "calibrate", "tune_train", "fast_regular", "precision", "ddp")
            if not str(sections[s]["status"]).startswith("ok")] == []
    points = sections["probes"]["points"]
    assert {(p["dataset"], p["n"]) for p in points} == {("hippocampus", 1), ("hippocampus", 2), ("ct", 1)}
    for p in points:  # on the CPU probe and estimate share one tracker: this checks the fake pass
        assert p["probe"]["status"] == "ok"
        assert p["estimate"]["train"] == p["probe"]["train_peak_bytes"]
        assert p["estimate"]["infer"] == p["probe"]["infer_peak_bytes"]
    calibrate = sections["calibrate"]  # on the CPU the fit runs on tracked peaks and finds no allowance
    assert calibrate["rows_count"] == 2 * len(points) and calibrate["worst_estimate_vs_allocated"] == 0
    assert calibrate["fit"]["cudnn_workspace_bytes"] == 0 and calibrate["fit"]["allocator_slack_fraction"] == 0
    [tuned] = sections["tune_train"]["bundles"].values()
    assert tuned["train_rc"] == 0 and tuned["epochs_run"] == 1
    assert 0 < tuned["peak_bytes"] <= tuned["budget_bytes"]
    runs = {r["mode"]: r for r in sections["fast_regular"]["runs"]}
    assert runs["fast"]["rc"] == 0 and runs["regular"]["rc"] == 0
    assert runs["fast"]["epoch_s_median_after_first"] > 0 and runs["regular"]["epoch_s_median_after_first"] > 0
    [fp32] = sections["precision"]["runs"]  # a dry run trains once, in fp32 (the GPU run: fp16 and bf16)
    assert fp32["rc"] == 0 and fp32["precision"] == "fp32" and fp32["epoch_s_median_after_first"] > 0
    assert sections["ddp"]["rc"] == 0 and sections["ddp"]["world_size"] == 1
    assert "fast vs regular per epoch" in proc.stdout
    assert (out / "gpu_check_logs.txt").is_file()
