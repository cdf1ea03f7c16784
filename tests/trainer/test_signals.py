"""Stop signals during training: an ``autotune train`` process sent SIGTERM inside an epoch writes a
checkpoint, prints one line and exits 143; ``--resume`` then reaches bitwise the same weights as a run
that was never stopped (CPU, fp32, one thread, same seed). The processes are forked with torch imported
(``forked_cli``), but for the DDP run a scheduler would start: ``python -m autotune train --nproc 2``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bundle_fixtures import copy_bundle
from forked_cli import CliProcess, start_cli

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def _env(tmp_path: Path, mark_at: int | None = None) -> dict[str, str]:
    """One torch thread and fp32 (bitwise comparable runs); with ``mark_at``, the mark of ``mark_hook``
    (a fresh interpreter, a DDP rank, loads it through ``sitecustomize``)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "AUTOTUNE_PRECISION": "fp32"}
    if mark_at is not None:
        hook = tmp_path / "hook"
        hook.mkdir(exist_ok=True)
        (hook / "sitecustomize.py").write_text("import mark_hook\nmark_hook.install()\n")
        env.update(PYTHONPATH=os.pathsep.join((str(hook), str(HERE), str(REPO))), MARK_AT_PASS=str(mark_at),
                   MARK_FILE=str(tmp_path / "mark"))
    return env


def _train_argv(bundle: Path, *extra: str, epochs: int = 3) -> list[str]:
    return ["train", str(bundle), "--device", "cpu", "--epochs", str(epochs), "-q", *extra]


def _train(argv: list[str], env: dict[str, str], logs: Path) -> CliProcess:
    """``autotune train`` as a process of its own, forked (``forked_cli``) with the hook of ``mark_hook``;
    its output in ``logs`` + ``.out`` and ``.err``."""
    return start_cli(argv, logs.with_suffix(".out"), logs.with_suffix(".err"), env, target="mark_hook:main")


def _signal_at_mark(proc: CliProcess | subprocess.Popen, mark: Path, signum: int) -> tuple[int, str]:
    """Send ``signum`` to ``proc`` when the mark appears; its exit code and stderr."""
    try:
        deadline = time.monotonic() + 300
        while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mark.exists(), f"the run never reached the mark: {proc.poll()}"
        proc.send_signal(signum)
        _out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return int(proc.returncode), err


def _weights(bundle: Path) -> dict:
    import torch

    return torch.load(bundle / "model_fold0" / "last.pt", map_location="cpu", weights_only=True)


def test_sigterm_inside_an_epoch_resumes_to_the_same_weights(bundles: dict[str, Path], tmp_path: Path) -> None:
    import torch

    reference = copy_bundle(bundles["segresnet_0"], tmp_path / "reference")
    # the run never stopped goes on beside the stopped one (one torch thread each: both cores of a 2-core machine)
    never_stopped = _train(_train_argv(reference), _env(tmp_path), tmp_path / "reference")
    bundle = copy_bundle(bundles["segresnet_0"], tmp_path / "stopped")
    try:
        # 3 batches of one pass per epoch: the 5th pass is batch 2 of epoch 2
        code, err = _signal_at_mark(_train(_train_argv(bundle), _env(tmp_path, mark_at=5), tmp_path / "stopped"),
                                    tmp_path / "mark", signal.SIGTERM)
        _, reference_err = never_stopped.communicate(timeout=600)
    finally:
        if never_stopped.poll() is None:
            never_stopped.kill()
    assert never_stopped.returncode == 0, reference_err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith("autotune ")]
    assert code == 143, err[-2000:]
    assert lines == [f"autotune train: stopped: SIGTERM received: stopped in epoch 2 after batch 2 of 3; "
                     f"{bundle / 'model_fold0' / 'last.pt'} holds epoch 2 up to batch 2 of 3; "
                     f"continue with 'autotune train {bundle} --resume --epochs 3'"]
    saved = _weights(bundle)
    assert saved["epoch"] == 1 and saved["partial"]["batches"] == 2 and saved["partial"]["epoch"] == 2
    resumed = _train(_train_argv(bundle, "--resume"), _env(tmp_path), tmp_path / "resumed")
    _, resumed_err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, resumed_err[-2000:]
    final, expected = _weights(bundle), _weights(reference)
    assert final["epoch"] == expected["epoch"] == 3 and final["partial"] is None
    assert all(torch.equal(final["model"][k], expected["model"][k]) for k in expected["model"])  # bitwise
    assert final["best_metric"] == expected["best_metric"]


def test_sigint_and_sigusr1_exit_with_their_codes(bundles: dict[str, Path], tmp_path: Path) -> None:
    """One process per signal, side by side: each exits 128 + its number after the batch it was in."""
    from concurrent.futures import ThreadPoolExecutor

    def stop(signum: int) -> tuple[int, str]:
        folder = tmp_path / signal.Signals(signum).name
        folder.mkdir()
        bundle = copy_bundle(bundles["segresnet_0"], folder / "b")
        return _signal_at_mark(_train(_train_argv(bundle), _env(folder, mark_at=2), folder / "stopped"), folder / "mark", signum)

    cases = {signal.SIGINT: 130, signal.SIGUSR1: 138}
    with ThreadPoolExecutor(len(cases)) as pool:
        done = dict(zip(cases, pool.map(stop, cases), strict=True))
    for signum, code in cases.items():
        name = signal.Signals(signum).name
        assert done[signum][0] == code, done[signum][1][-2000:]
        assert f"{name} received: stopped in epoch 1 after batch 2 of 3" in done[signum][1]
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
    """The process a scheduler starts, ``python -m autotune train --nproc 2`` (a fresh interpreter), gets
    SIGTERM; the run never stopped goes on beside it."""
    import torch

    reference = copy_bundle(bundles["segresnet_0"], tmp_path / "reference")
    never_stopped = _train(_train_argv(reference, "--nproc", "2", epochs=2), _env(tmp_path), tmp_path / "reference")
    bundle = copy_bundle(bundles["segresnet_0"], tmp_path / "stopped")
    # 3 training cases over 2 ranks: 2 batches per rank and epoch; rank 0's 3rd pass is batch 1 of epoch 2.
    # The signal goes to the spawning process only: it passes it on to both ranks.
    stopped = subprocess.Popen([sys.executable, "-m", "autotune", *_train_argv(bundle, "--nproc", "2", epochs=2)],
                               env=_env(tmp_path, mark_at=3), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        code, err = _signal_at_mark(stopped, tmp_path / "mark", signal.SIGTERM)
        _, reference_err = never_stopped.communicate(timeout=600)
    finally:
        if never_stopped.poll() is None:
            never_stopped.kill()
    assert never_stopped.returncode == 0, reference_err[-2000:]
    assert code == 143, err[-2000:]
    [line] = [line for line in err.splitlines() if line.startswith("autotune ")]  # one line, not one per rank
    assert "SIGTERM received: stopped in epoch 2 after batch 1 of 2" in line and "--resume --epochs 2 --nproc 2" in line
    assert "Terminating process" not in err  # the ranks stopped together: none was killed
    assert _weights(bundle)["partial"]["rank_batches"] == [1, 1]  # both ranks stopped at the same batch
    resumed = _train(_train_argv(bundle, "--resume", "--nproc", "2", epochs=2), _env(tmp_path), tmp_path / "resumed")
    _, resumed_err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, resumed_err[-2000:]
    final, expected = _weights(bundle), _weights(reference)
    assert final["epoch"] == 2
    assert all(torch.equal(final["model"][k], expected["model"][k]) for k in expected["model"])  # bitwise


# Marks the moment rank 0 starts to split its data (before training: the cache is not built yet), then holds.
_BEFORE_TRAINING_HOOK = '''
import os, time
import autotune.data.split as _data
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
    started, not torchrun's 1. SIGUSR1 to ``autotune train --nproc 2`` (forked) before its ranks train: 138.
    Side by side."""
    from concurrent.futures import ThreadPoolExecutor

    def popen(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def torchrun() -> tuple[Path, tuple[int, str]]:
        folder = tmp_path / "torchrun"
        folder.mkdir()
        bundle = copy_bundle(bundles["segresnet_0"], folder / "b")
        cmd = [sys.executable, "-m", "autotune.torchrun", "--standalone", "--nproc-per-node", "2", "-m",
               "autotune.trainer", str(bundle), "--device", "cpu", "--epochs", "2", "-q"]
        return bundle, _signal_at_mark(popen(cmd, _env(folder, mark_at=3)), folder / "mark", signal.SIGTERM)

    def launcher() -> tuple[Path, tuple[int, str]]:
        folder = tmp_path / "launcher"
        (folder / "hook").mkdir(parents=True)
        (folder / "hook" / "sitecustomize.py").write_text(_BEFORE_TRAINING_HOOK)
        env = {**_env(folder), "PYTHONPATH": f"{folder / 'hook'}{os.pathsep}{REPO}", "MARK_FILE": str(folder / "mark")}
        bundle = copy_bundle(bundles["segresnet_0"], folder / "b")
        # forked (the fresh ``python -m autotune train --nproc 2`` a scheduler starts is the test above's)
        proc = start_cli(_train_argv(bundle, "--nproc", "2", epochs=2), folder / "out", folder / "err", env)
        return bundle, _signal_at_mark(proc, folder / "mark", signal.SIGUSR1)

    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(torchrun), pool.submit(launcher)]
        (elastic, (torchrun_code, torchrun_err)), (spawned, (launcher_code, launcher_err)) = (
            run.result() for run in runs)
    assert torchrun_code == 143, torchrun_err[-3000:]
    [line] = [line for line in torchrun_err.splitlines() if line.startswith("autotune train")]
    assert "SIGTERM received: stopped in epoch 2 after batch 1 of 2" in line
    assert f"continue with 'python -m autotune.torchrun ... -m autotune.trainer {elastic} --resume --epochs 2'" in line
    assert _weights(elastic)["partial"]["rank_batches"] == [1, 1]
    assert launcher_code == 138, launcher_err[-3000:]
    assert launcher_err.splitlines()[-1] == (
        "autotune train: stopped: SIGUSR1 received before training started (while the processes started or the "
        "cache was built): nothing was trained or written; run the same command again")
    assert not (spawned / "model_fold0" / "last.pt").exists()
