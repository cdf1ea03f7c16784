"""``autotune tune`` sent SIGTERM (a scheduler's stop) while a probe runs: one line, exit 143, nothing left
RUNNING, claims released and the worker's trial closed, and the same command continues from the stored trials."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import optuna
import pytest
from forked_cli import CliProcess, start_cli
from probe_fixtures import limit_for_patches, one_window_unet

from autotune.search.storage.liveness import is_coordination_study

MARGIN = 0.10
SPACE = ["--range-num-images-per-batch", "1", "8", "--range-num-sw-batch-size", "1", "4"]
States = optuna.trial.TrialState


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return one_window_unet(tmp_path_factory, "stop_src")


def _tune(bundle: Path, storage: str, limit: int, name: str = "first", fault: str | None = None) -> CliProcess:
    """An ``autotune worker`` process on ``bundle``'s work folder (forked with torch and MONAI imported);
    ``fault``: its probes' ``AUTOTUNE_PROBE_FAULT``."""
    argv = ["worker", "--work-dir", str(bundle.parent), "--storage", storage, "--device", "cpu", "--memory-limit",
            str(limit), "--margin", str(MARGIN), "--timeout", "240", *SPACE]
    root = bundle.parent.parent
    env = {**os.environ, **({"AUTOTUNE_PROBE_FAULT": fault} if fault else {})}
    return start_cli(argv, root / f"{name}.out", root / f"{name}.err", env)


def _running_trial(storage: str, proc: CliProcess, timeout: float = 240.0, n: int | None = None) -> int:
    """Wait until a trial of ``proc`` (at ``n`` patches per pass, if given) is RUNNING (a probe is in flight); its
    number."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        try:
            for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
                study = optuna.load_study(study_name=summary.study_name, storage=storage)
                running = [t.number for t in study.get_trials(deepcopy=False, states=(States.RUNNING,))
                           if "point_id" in t.user_attrs and n in (None, t.params.get("num_patches_per_iter"))]
                if running:
                    return running[0]
        except Exception:  # noqa: BLE001 - the worker may be creating the tables
            pass
        time.sleep(0.2)
    raise AssertionError("no probe ran")


def test_sigterm_fails_the_trial_in_flight_and_exits_143(tiny: Path, tmp_path: Path) -> None:
    import shutil

    bundle = tmp_path / "work" / "unet_0"
    shutil.copytree(tiny, bundle)
    limit = limit_for_patches(bundle, 3.5, MARGIN)
    storage = f"sqlite:///{tmp_path / 'stop.db'}"
    # the edge's first point (3) is probed; the probe of 4 hangs, so the signal finds a probe in flight however
    # quickly the probes run (the search's points come from the estimator: the same on any machine)
    proc = _tune(bundle, storage, limit, fault="hang@num_patches_per_iter=4")
    number = _running_trial(storage, proc, n=4)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith("autotune worker:")]
    assert len(lines) == 1 and "stopped by SIGTERM" in lines[0] and "run the same command" in lines[0], err
    assert "Traceback" not in err, err
    trials = [t for s in optuna.get_all_study_summaries(storage, include_best_trial=False)
              if not is_coordination_study(s.study_name)
              for t in optuna.load_study(study_name=s.study_name, storage=storage).get_trials()]
    assert not [t.number for t in trials if t.state == States.RUNNING], "nothing left RUNNING"
    [stopped] = [t for t in trials if t.number == number and t.state == States.FAIL]
    assert stopped.user_attrs["fail_reason"].startswith("interrupted: Stopped"), stopped.user_attrs
    owner = f"{os.uname().nodename}:{proc.pid}"
    coordination = [t for s in optuna.get_all_study_summaries(storage, include_best_trial=False)
                    if is_coordination_study(s.study_name)
                    for t in optuna.load_study(study_name=s.study_name, storage=storage).get_trials()
                    if t.user_attrs.get("owner") == owner]
    [worker] = [t for t in coordination if "host" in t.user_attrs]
    assert worker.state == States.COMPLETE, "the stopped worker closed its worker trial"
    assert not [t for t in coordination if t.state == States.RUNNING], "no claim held by the stopped worker"
    done_before = [t for t in trials if t.state == States.COMPLETE]
    assert done_before and stopped.params["num_patches_per_iter"] == 4, "one point finished, the next in flight"
    again = _tune(bundle, storage, limit, "again")
    _out, err = again.communicate(timeout=480)
    assert again.returncode == 0, err[-2000:]
    assert err.count("from study") >= len(done_before), "the rerun reads the finished points back"
