"""Stop signals during training: a real ``python -m autotune train`` process sent SIGTERM inside an
epoch writes a checkpoint, prints one line and exits 143; ``--resume`` then reaches bitwise the
same weights as a run that was never stopped (CPU, fp32, one thread, same seed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bundle_fixtures import copy_bundle

REPO = Path(__file__).resolve().parents[2]
# Loaded at interpreter start (sitecustomize): marks the moment the Nth training pass of rank 0 is done,
# then holds that pass for a few seconds, so the test's signal arrives inside a known batch.
_MARK_HOOK = '''
import os, time
import autotune.step as _step
_train_step, _calls = _step.train_step, [0]
def train_step(*args, **kwargs):
    result = _train_step(*args, **kwargs)
    _calls[0] += 1
    if _calls[0] == int(os.environ["MARK_AT_PASS"]) and os.environ.get("RANK", "0") == "0":
        open(os.environ["MARK_FILE"], "w").close()
        time.sleep(3)
    return result
_step.train_step = train_step
'''


def _env(tmp_path: Path, mark_at: int | None = None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "AUTOTUNE_PRECISION": "fp32"}
    if mark_at is not None:
        hook = tmp_path / "hook"
        hook.mkdir(exist_ok=True)
        (hook / "sitecustomize.py").write_text(_MARK_HOOK)
        env.update(PYTHONPATH=f"{hook}{os.pathsep}{REPO}", MARK_AT_PASS=str(mark_at),
                   MARK_FILE=str(tmp_path / "mark"))
    return env


def _train_cmd(bundle: Path, *extra: str, epochs: int = 3) -> list[str]:
    return [sys.executable, "-m", "autotune", "train", str(bundle), "--device", "cpu", "--epochs", str(epochs), "-q",
            *extra]


def _signal_at_mark(cmd: list[str], env: dict[str, str], mark: Path, signum: int) -> subprocess.CompletedProcess:
    """Run ``cmd``, send ``signum`` when the mark appears; the finished process."""
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not mark.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mark.exists(), f"the run never reached the mark: {child.poll()}"
        child.send_signal(signum)
        out, err = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return subprocess.CompletedProcess(cmd, child.returncode, out, err)


def _weights(bundle: Path) -> dict:
    import torch

    return torch.load(bundle / "model_fold0" / "last.pt", map_location="cpu", weights_only=True)


def test_sigterm_inside_an_epoch_resumes_to_the_same_weights(bundles: dict[str, Path], tmp_path: Path) -> None:
    import torch

    reference = copy_bundle(bundles["segresnet_0"], tmp_path / "reference")
    # the run never stopped goes on beside the stopped one (one torch thread each: both cores of a 2-core machine)
    never_stopped = subprocess.Popen(_train_cmd(reference), env=_env(tmp_path), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
    bundle = copy_bundle(bundles["segresnet_0"], tmp_path / "stopped")
    try:
        # 3 batches of one pass per epoch: the 5th pass is batch 2 of epoch 2
        done = _signal_at_mark(_train_cmd(bundle), _env(tmp_path, mark_at=5), tmp_path / "mark", signal.SIGTERM)
        _, reference_err = never_stopped.communicate(timeout=600)
    finally:
        if never_stopped.poll() is None:
            never_stopped.kill()
            never_stopped.wait()
    assert never_stopped.returncode == 0, reference_err[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("autotune ")]
    assert done.returncode == 143, done.stderr[-2000:]
    assert lines == [f"autotune train: stopped: SIGTERM received: stopped in epoch 2 after batch 2 of 3; "
                     f"{bundle / 'model_fold0' / 'last.pt'} holds epoch 2 up to batch 2 of 3; "
                     f"continue with 'autotune train {bundle} --resume --epochs 3'"]
    saved = _weights(bundle)
    assert saved["epoch"] == 1 and saved["partial"]["batches"] == 2 and saved["partial"]["epoch"] == 2
    resumed = subprocess.run(_train_cmd(bundle, "--resume"), env=_env(tmp_path), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    final, expected = _weights(bundle), _weights(reference)
    assert final["epoch"] == expected["epoch"] == 3 and final["partial"] is None
    assert all(torch.equal(final["model"][k], expected["model"][k]) for k in expected["model"])  # bitwise
    assert final["best_metric"] == expected["best_metric"]


def test_sigint_and_sigusr1_exit_with_their_codes(bundles: dict[str, Path], tmp_path: Path) -> None:
    """One process per signal, side by side: each exits 128 + its number after the batch it was in."""
    from concurrent.futures import ThreadPoolExecutor

    def stop(signum: int) -> subprocess.CompletedProcess:
        folder = tmp_path / signal.Signals(signum).name
        folder.mkdir()
        bundle = copy_bundle(bundles["segresnet_0"], folder / "b")
        return _signal_at_mark(_train_cmd(bundle), _env(folder, mark_at=2), folder / "mark", signum)

    cases = {signal.SIGINT: 130, signal.SIGUSR1: 138}
    with ThreadPoolExecutor(len(cases)) as pool:
        done = dict(zip(cases, pool.map(stop, cases), strict=True))
    for signum, code in cases.items():
        name = signal.Signals(signum).name
        assert done[signum].returncode == code, done[signum].stderr[-2000:]
        assert f"{name} received: stopped in epoch 1 after batch 2 of 3" in done[signum].stderr
        assert _weights(tmp_path / name / "b")["partial"]["batches"] == 2


def test_the_handlers_before_training_are_restored(bundles: dict[str, Path], tmp_path: Path) -> None:
    from autotune.trainer.runner import train

    def mine(signum: int, frame: object) -> None:
        pass

    previous = signal.signal(signal.SIGUSR1, mine)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        train(copy_bundle(bundles["segresnet_0"], tmp_path / "b"), device="cpu", epochs=1, progress=False)
        assert signal.getsignal(signal.SIGUSR1) is mine
        assert {s: signal.getsignal(s) for s in before} == before
    finally:
        signal.signal(signal.SIGUSR1, previous)


@pytest.mark.slow
def test_sigterm_stops_every_ddp_rank_at_the_same_batch(bundles: dict[str, Path], tmp_path: Path) -> None:
    import torch

    reference = copy_bundle(bundles["segresnet_0"], tmp_path / "reference")
    subprocess.run(_train_cmd(reference, "--nproc", "2", epochs=2), env=_env(tmp_path), check=True, capture_output=True)
    bundle = copy_bundle(bundles["segresnet_0"], tmp_path / "stopped")
    # 3 training cases over 2 ranks: 2 batches per rank and epoch; rank 0's 3rd pass is batch 1 of epoch 2.
    # The signal goes to the spawning process only: it passes it on to both ranks.
    done = _signal_at_mark(_train_cmd(bundle, "--nproc", "2", epochs=2), _env(tmp_path, mark_at=3), tmp_path / "mark",
                           signal.SIGTERM)
    assert done.returncode == 143, done.stderr[-2000:]
    [line] = [line for line in done.stderr.splitlines() if line.startswith("autotune ")]  # one line, not one per rank
    assert "SIGTERM received: stopped in epoch 2 after batch 1 of 2" in line and "--resume --epochs 2 --nproc 2" in line
    assert "Terminating process" not in done.stderr  # the ranks stopped together: none was killed
    assert _weights(bundle)["partial"]["rank_batches"] == [1, 1]  # both ranks stopped at the same batch
    resumed = subprocess.run(_train_cmd(bundle, "--resume", "--nproc", "2", epochs=2), env=_env(tmp_path), capture_output=True,
                             text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    final, expected = _weights(bundle), _weights(reference)
    assert final["epoch"] == 2
    assert all(torch.equal(final["model"][k], expected["model"][k]) for k in expected["model"])  # bitwise


# Marks the moment rank 0 starts to split its data (before training: the cache is not built yet), then holds.
_BEFORE_TRAINING_HOOK = '''
import os, time
import autotune.trainer.data as _data
_split = _data.split_datalist
def split_datalist(*args, **kwargs):
    if os.environ.get("RANK") == "0":
        open(os.environ["MARK_FILE"], "w").close()
        time.sleep(5)
    return _split(*args, **kwargs)
_data.split_datalist = split_datalist
'''


@pytest.mark.slow
def test_a_scheduler_sees_the_signals_code_from_either_launcher(bundles: dict[str, Path], tmp_path: Path) -> None:
    """SIGTERM to torchrun (through ``python -m autotune.torchrun``) inside an epoch: 143 from the process
    started, not torchrun's 1. SIGUSR1 to ``autotune train --nproc 2`` before its ranks train: 138. Side by side."""
    from concurrent.futures import ThreadPoolExecutor

    def torchrun() -> tuple[Path, subprocess.CompletedProcess]:
        folder = tmp_path / "torchrun"
        folder.mkdir()
        bundle = copy_bundle(bundles["segresnet_0"], folder / "b")
        cmd = [sys.executable, "-m", "autotune.torchrun", "--standalone", "--nproc-per-node", "2", "-m",
               "autotune.trainer", str(bundle), "--device", "cpu", "--epochs", "2", "-q"]
        return bundle, _signal_at_mark(cmd, _env(folder, mark_at=3), folder / "mark", signal.SIGTERM)

    def launcher() -> tuple[Path, subprocess.CompletedProcess]:
        folder = tmp_path / "launcher"
        (folder / "hook").mkdir(parents=True)
        (folder / "hook" / "sitecustomize.py").write_text(_BEFORE_TRAINING_HOOK)
        env = {**_env(folder), "PYTHONPATH": f"{folder / 'hook'}{os.pathsep}{REPO}", "MARK_FILE": str(folder / "mark")}
        bundle = copy_bundle(bundles["segresnet_0"], folder / "b")
        return bundle, _signal_at_mark(_train_cmd(bundle, "--nproc", "2", epochs=2), env, folder / "mark",
                                       signal.SIGUSR1)

    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(torchrun), pool.submit(launcher)]
        (elastic, by_torchrun), (spawned, by_launcher) = (run.result() for run in runs)
    assert by_torchrun.returncode == 143, by_torchrun.stderr[-3000:]
    [line] = [line for line in by_torchrun.stderr.splitlines() if line.startswith("autotune train")]
    assert "SIGTERM received: stopped in epoch 2 after batch 1 of 2" in line
    assert f"continue with 'python -m autotune.torchrun ... -m autotune.trainer {elastic} --resume --epochs 2'" in line
    assert _weights(elastic)["partial"]["rank_batches"] == [1, 1]
    assert by_launcher.returncode == 138, by_launcher.stderr[-3000:]
    assert by_launcher.stderr.splitlines()[-1] == (
        "autotune train: stopped: SIGUSR1 received before training started (while the processes started or the "
        "cache was built): nothing was trained or written; run the same command again")
    assert not (spawned / "model_fold0" / "last.pt").exists()
