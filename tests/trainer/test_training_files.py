"""A training run never loses its files: ``--resume`` refuses a ``last.pt`` it cannot continue from before anything is
written (a folder, bare weights, garbage), a folder where an output goes is refused before training, a fault's line
names only checkpoints that exist, and a second ``autotune train`` of a bundle is refused while the first holds the
model folder's lock (a killed run's lock is taken over)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from bundle_fixtures import copy_bundle

from autotune.trainer.lock import LOCK_NAME


def _train(bundle: Path, *extra: str) -> int:
    from autotune.cli import main

    return main(["train", str(bundle), "--device", "cpu", "--val-every", "1", "--quiet", *extra])


def _error_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("autotune ")]


def _snapshot(folder: Path) -> dict[str, Any]:
    """Every file and folder under ``folder``: its kind, and a file's bytes and modification time."""
    return {p.relative_to(folder).as_posix(): ("dir",) if p.is_dir() else
            (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


def _named_files_exist(line: str) -> bool:
    return all(Path(path).exists() for path in re.findall(r"(/[^\s;,()']+\.pt)\b", line))


@pytest.fixture(scope="module")
def trained(small_demo_bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small SegResNet bundle trained one epoch: ``model_fold0`` holds best.pt, last.pt and the records."""
    bundle = copy_bundle(small_demo_bundles["segresnet_0"], tmp_path_factory.mktemp("trained") / "segresnet_0")
    assert _train(bundle, "--epochs", "1") == 0
    return bundle


def _a_folder(last: Path) -> None:
    last.unlink()
    last.mkdir()
    (last / "copied-by-hand.pt").write_bytes(b"x")


def _bare_weights(last: Path) -> None:
    import torch

    torch.save(torch.load(last, weights_only=True)["model"], last)


def _garbage(last: Path) -> None:
    last.write_bytes(b"\x00garbage" * 64)


@pytest.mark.parametrize(("spoil", "needle"), [
    (_a_folder, "a folder, not a checkpoint; move it away"),
    (_bare_weights, "bare weights (a state_dict of "),
    (_garbage, "unreadable checkpoint (UnpicklingError"),
], ids=["folder", "bare-weights", "garbage"])
def test_resume_refuses_what_is_no_checkpoint_before_writing_anything(
        trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], spoil: Any, needle: str) -> None:
    bundle = copy_bundle(trained, tmp_path / "segresnet_0")
    out = bundle / "model_fold0"
    spoil(out / "last.pt")
    before = _snapshot(out)
    assert _train(bundle, "--epochs", "2", "--resume") == 2
    captured = capsys.readouterr()
    [line] = [line for line in captured.err.splitlines() if line.startswith("autotune ")]
    assert line.startswith(f"autotune train: error: {out / 'last.pt'}") and needle in line and "move it away" in line
    assert "--mode None" not in line and "no checkpoint" not in captured.out + captured.err
    assert _snapshot(out) == before  # best.pt, metrics and the spoiled last.pt as they were; no lock left


def test_a_folder_where_an_output_goes_is_refused_before_training(
        bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = bundle / "model_fold0"
    (out / "metrics.json").mkdir(parents=True)
    before = _snapshot(out)
    assert _train(bundle, "--epochs", "1") == 2
    [line] = _error_lines(capsys)
    assert line == (f"autotune train: error: {out / 'metrics.json'}: a folder is in its place, where the run writes "
                    "its metrics.json; move it away (or write elsewhere), then run the same command again")
    assert _snapshot(out) == before


@pytest.mark.parametrize("fail_in_epoch", [1, 2])
def test_an_out_of_memory_line_names_only_a_checkpoint_that_was_written(
        bundle: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fail_in_epoch: int) -> None:
    import torch

    import autotune.trainer.training_run as training_run

    real, calls = training_run.train_epoch, [0]

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == fail_in_epoch:
            raise torch.OutOfMemoryError("fake: CUDA out of memory")
        return real(*args, **kwargs)

    monkeypatch.setattr(training_run, "train_epoch", failing)
    out = bundle / "model_fold0"
    assert _train(bundle, "--epochs", "2") == 3
    [line] = _error_lines(capsys)
    assert "out of memory in " in line and f" of epoch {fail_in_epoch} " in line and _named_files_exist(line)
    if fail_in_epoch == 1:
        assert line.endswith(f"no checkpoint was written; start again with 'autotune train {bundle} --epochs 2'")
        assert "last.pt" not in line and not list(out.glob("*.pt"))
    else:
        assert line.endswith(f"{out / 'last.pt'} holds epoch 1; continue with 'autotune train {bundle} --resume "
                             "--epochs 2'")
        assert torch.load(out / "last.pt", weights_only=True)["epoch"] == 1


def test_a_second_training_of_a_bundle_is_refused_while_the_first_runs(
        bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch
    from forked_cli import start_cli

    out, mark, gate = bundle / "model_fold0", tmp_path / "holding", tmp_path / "go-on"
    argv = ["train", str(bundle), "--device", "cpu", "--epochs", "2", "--val-every", "1", "--quiet"]
    first = start_cli(argv, tmp_path / "first.out", tmp_path / "first.err",
                      {**os.environ, "HOLD_MARK": str(mark), "HOLD_GATE": str(gate)}, target="lock_hook:main")
    try:
        deadline = time.monotonic() + 240
        while not mark.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)  # until the first run holds the lock and has checked everything
        assert mark.exists(), (tmp_path / "first.err").read_text()
        holder = json.loads((out / LOCK_NAME).read_text())
        assert (holder["pid"], holder["host"]) == (first.pid, socket.gethostname())
        before = _snapshot(out)
        assert _train(bundle, "--epochs", "2") == 2
        [line] = _error_lines(capsys)
        assert line == (f"autotune train: error: {bundle}: another 'autotune train' of this bundle is running (pid "
                        f"{first.pid} on {socket.gethostname()}, started {holder['started']}), writing {out}; wait "
                        "for it to end or stop it, then run this command again")
        assert _snapshot(out) == before  # the second run touched nothing
        gate.touch()
        assert first.wait(timeout=300) == 0, (tmp_path / "first.err").read_text()
    finally:
        gate.touch()
        first.kill()
    summary = json.loads((out / "train_summary.json").read_text())
    best, last = (torch.load(out / name, map_location="cpu", weights_only=True) for name in ("best.pt", "last.pt"))
    assert (summary["best_metric"], summary["best_epoch"]) == (best["best_metric"], best["epoch"])
    assert summary["last_epoch"] == last["epoch"] == 2 and last["best_metric"] == best["best_metric"]
    assert [row["epoch"] for row in json.loads((out / "metrics.json").read_text())["rows"]] == [1, 2]
    assert not (out / LOCK_NAME).exists()


def test_the_lock_of_a_run_that_is_gone_is_taken_over_in_one_line(
        bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    out = bundle / "model_fold0"
    gone = subprocess.Popen(["true"])
    gone.wait()
    out.mkdir()
    (out / LOCK_NAME).write_text(json.dumps({"pid": gone.pid, "host": socket.gethostname(),
                                             "started": "2025-01-02 03:04:05", "command": "autotune train ..."}))
    assert _train(bundle, "--epochs", "1") == 0
    assert (f"taking over the training lock {out / LOCK_NAME} of a run that ended without releasing it (pid "
            f"{gone.pid} on {socket.gethostname()}, started 2025-01-02 03:04:05; it is gone)"
            in capsys.readouterr().err.splitlines())
    assert torch.load(out / "last.pt", weights_only=True)["epoch"] == 1 and not (out / LOCK_NAME).exists()
