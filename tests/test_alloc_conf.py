"""One CUDA allocator setting everywhere (``autotune.cuda_alloc``): read, compared, and inherited by every
child process autotune starts (a probe forked from the server, the MONAI launcher's script, training)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cuda_alloc import alloc_conf, differs, expandable_segments

CONF = "expandable_segments:True"


def test_the_setting_is_read_and_compared() -> None:
    assert alloc_conf({"PYTORCH_CUDA_ALLOC_CONF": "  "}) is None and alloc_conf({}) is None
    assert alloc_conf({"PYTORCH_CUDA_ALLOC_CONF": f" {CONF} "}) == CONF
    assert expandable_segments("max_split_size_mb:128,expandable_segments:true")
    assert not expandable_segments("expandable_segments:False") and not expandable_segments(None)
    assert not differs(CONF, "expandable_segments:True ") and differs(None, CONF)
    assert not differs("a:1,b:2", "b:2,a:1")


def test_training_warns_when_the_setting_differs_from_the_tuned_one(monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture) -> None:
    from autotune.bundles.plan import TuningPlan
    from autotune.trainer.memory import alloc_conf_warning

    plan = TuningPlan(tuned={"num_patches_per_iter": 2, "num_sw_batch_size": 4}, memory_limit=1 << 30,
                      device="cuda:0", alloc_conf=CONF)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    line = alloc_conf_warning(plan, "cuda:0")
    assert line and f"tuned under PYTORCH_CUDA_ALLOC_CONF={CONF} but running under PYTORCH_CUDA_ALLOC_CONF=(unset)" in line
    assert line in capsys.readouterr().err
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", CONF)
    assert alloc_conf_warning(plan, "cuda:0") is None
    assert alloc_conf_warning(plan, "cpu") is None  # the CPU has no such allocator


SCRIPT = '''
import os, sys
print("script sees", os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
sys.exit(0)
'''


def test_the_setting_reaches_every_child(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Set once in the environment of the process that starts them: a probe child (forked from the server,
    which may have started under another environment), the launcher's script, and training record it."""
    from bundle_fixtures import copy_bundle
    from probe_fixtures import shared_tiny_bundles

    from autotune.probe import run_probe

    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", CONF)
    bundle = shared_tiny_bundles(tmp_path_factory)["unet"]
    probe = run_probe(bundle, device="cpu", phases=("train",), warmup_steps=0, measure_steps=1,
                      num_patches_per_iter=1)
    assert probe["status"] == "ok" and probe["alloc_conf"] == CONF

    script = tmp_path / "bundle" / "scripts" / "train.py"
    script.parent.mkdir(parents=True)
    script.write_text(SCRIPT)
    launched = subprocess.run([sys.executable, "-m", "autotune.launch", "--memory-limit", "64MiB", "--device", "cpu",
                               "--", str(script)], capture_output=True, text=True, timeout=300)
    record = json.loads((tmp_path / "bundle" / "autotune" / "launch.json").read_text())
    assert launched.returncode == 0 and record["alloc_conf"] == CONF and f"script sees {CONF}" in launched.stdout

    own = copy_bundle(Path(bundle), tmp_path / "trained")  # its own model folder
    trained = subprocess.run([sys.executable, "-m", "autotune", "train", str(own), "--device", "cpu", "--epochs", "1",
                              "--val-every", "5", "--quiet"], capture_output=True, text=True, timeout=600)
    assert trained.returncode == 0, trained.stderr
    summary = json.loads((own / "model_fold0" / "train_summary.json").read_text())
    assert summary["alloc_conf"] == CONF
