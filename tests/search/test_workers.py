"""Several ``autotune worker`` processes on one PostgreSQL storage, and workers that die.

- workers started together on an empty database all open it (no table-creation race);
- four workers, one tuning key: one searches, the others wait for its result; no point is
  evaluated twice, none is lost, every bundle gets the same values;
- the same with the searching worker SIGKILLed halfway: another takes over once the killed
  worker is not live (same host: its process is gone), its RUNNING trial is failed as stale,
  nothing finished is lost, same values;
- one worker SIGKILLed, then started again: the rerun resumes from the study;
- four TPE workers with real probes share one study point by point: each point probed once;
- the server restarted while two workers tune: nothing lost or evaluated twice, the undisturbed
  run's answer and trial count; a server down past the retry budget: one line, exit 2, and a
  rerun continues from the stored trials.

The estimate strategy (no probe children) keeps the first ones quick; the values are checked
against an in-process run of the same search on SQLite. ``AUTOTUNE_CLAIM_STALE_SECONDS``
shortens the liveness grace from 60 s to a few seconds. A hung worker is
``tests/search/test_liveness.py``.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pytest
from forked_cli import CliProcess, start_cli
from pg_fixtures import PostgresCluster, pg_cluster, pg_database_url, postgres_url  # noqa: F401
from probe_fixtures import limit_for_patches, one_window_unet, two_fold_work

from autotune.bundles.config import load_bundle_config
from autotune.bundles.model import BundleConfig
from autotune.search.storage.liveness import is_coordination_study
from autotune.stages import tune

pytestmark = pytest.mark.postgres

MARGIN = 0.10
STALE_SECONDS = 10
SPACE = ["--range-num-images-per-batch", "1", "8", "--range-num-sw-batch-size", "1", "4"]
States = optuna.trial.TrialState


def tuned_values(config: BundleConfig) -> dict[str, Any]:
    """The values the tuner writes back, as the bundle holds them."""
    return {"num_patches_per_iter": config.num_patches_per_iter, "num_images_per_batch": config.num_images_per_batch,
            "num_sw_batch_size": config.num_sw_batch_size, "sw_input_on_cpu": config.sw_input_on_cpu}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return one_window_unet(tmp_path_factory, "workers_src")


@pytest.fixture(scope="module")
def limit(tiny: Path) -> int:
    return limit_for_patches(tiny, 3.5, MARGIN)  # at most 3 patches per iteration fit


@pytest.fixture(scope="module")
def reference(tiny: Path, limit: int, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """What one uninterrupted process finds (estimate strategy, SQLite): every worker must agree."""
    work = tmp_path_factory.mktemp("reference")
    shutil.copytree(tiny, work / "unet_0")
    specs = {"universal": {"range_num_images_per_batch": [1, 8], "range_num_sw_batch_size": [1, 4]}}
    result = tune([work / "unet_0"], specs, device="cpu", memory_limit=limit, strategy="estimate",
                          margin=MARGIN, storage=f"sqlite:///{work / 'ref.db'}", progress=None)[0]
    assert result["status"] == "tuned"
    return tuned_values(load_bundle_config(work / "unet_0"))


@pytest.fixture()
def work(tiny: Path, tmp_path: Path) -> Path:
    return two_fold_work(tiny, tmp_path / "work")


@dataclass
class Worker:
    proc: CliProcess

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        self.proc.kill()  # reaped: its pid no longer exists, as for a worker killed on a real node

    def finish(self, timeout: float) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return int(self.proc.returncode), out, err


def _start(work: Path, url: str, limit: int, name: str, *extra: str, target: str = "worker") -> Worker:
    """An ``autotune worker`` process (forked with torch and MONAI already imported: ``forked_cli``), whose
    waiters look for the searching worker's result every second (``worker_processes.worker``; a test that
    kills an estimating worker mid-trial takes ``worker_every_pass``, whose trials each make a pass)."""
    argv = ["worker", "--work-dir", str(work), "--storage", url, "--device", "cpu", "--memory-limit", str(limit),
            "--margin", str(MARGIN), *extra]
    env = {**os.environ, "AUTOTUNE_CLAIM_STALE_SECONDS": str(STALE_SECONDS)}
    return Worker(start_cli(argv, work.parent / f"{name}.out", work.parent / f"{name}.err", env,
                            target=f"worker_processes:{target}"))


def _prepare(url: str) -> None:
    """Create Optuna's tables once, so these tests see the workers, not the empty-database race
    (which ``test_workers_started_together_on_an_empty_database`` covers)."""
    from autotune.search.storage.study import open_storage

    open_storage(url).engine.dispose()


def _trials(storage: optuna.storages.RDBStorage) -> list[optuna.trial.FrozenTrial]:
    """All trials of the storage's one tuning key: its training study and its ``-infer`` study (none yet: []);
    the workers' and claims' studies left out."""
    names = sorted(s.study_name for s in storage.get_all_studies() if not is_coordination_study(s.study_name))
    assert len(names) <= 2 and all(n == names[0] or n == names[0] + "-infer" for n in names), \
        f"one tuning key, one study per phase: {names}"
    return [t for name in names for t in storage.get_all_trials(storage.get_study_id_from_name(name), deepcopy=False)]


def _check_study(trials: list[optuna.trial.FrozenTrial]) -> None:
    """Nothing lost, nothing evaluated twice."""
    assert trials, "the study has trials"
    assert not [t.number for t in trials if t.state in (States.RUNNING, States.WAITING)], "no trial left open"
    evaluated = Counter(t.user_attrs["point_id"] for t in trials
                        if t.state == States.COMPLETE and "reused_trial" not in t.user_attrs)
    assert evaluated and max(evaluated.values()) == 1, f"a point evaluated twice: {evaluated}"
    for trial in trials:
        if trial.state == States.FAIL:
            assert trial.user_attrs["fail_reason"].startswith("stale: "), trial.user_attrs


def _check_bundles(work: Path, expected: dict) -> None:
    for name in ("unet_0", "unet_1"):
        cfg = load_bundle_config(work / name)
        assert tuned_values(cfg) == expected, name
        assert cfg.plan is not None and cfg.plan.status == "tuned" and (cfg.plan.storage or "").startswith("postgresql")


def _wait_for_midway(storage: optuna.storages.RDBStorage, workers: list[Worker],
                     timeout: float = 180.0) -> tuple[Worker, list[int], int]:
    """Wait until a trial has finished and another runs; returns (its worker, finished, running trial)."""
    by_pid = {w.pid: w for w in workers}
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert any(w.proc.poll() is None for w in workers), "every worker ended before one could be killed"
        trials = _trials(storage)
        done = [t.number for t in trials if t.state == States.COMPLETE]
        running = [t for t in trials if t.state == States.RUNNING and "owner" in t.user_attrs]
        if done and running:
            pid = int(running[0].user_attrs["owner"].rpartition(":")[2])
            if pid in by_pid and by_pid[pid].proc.poll() is None:
                return by_pid[pid], done, running[0].number
        time.sleep(0.1)
    raise AssertionError("no moment with a finished and a running trial")


def test_workers_started_together_on_an_empty_database(pg_database_url: str, tmp_path: Path) -> None:  # noqa: F811
    """Workers of a job array start at once on an empty database: all must open it. Each is a process of its own
    (forked: ``tests/worker_processes.py``); they meet before opening the storage and again after claiming."""
    marks = tmp_path / "marks"
    marks.mkdir()
    procs = [start_cli([pg_database_url, str(marks), str(i), "6"], tmp_path / f"p{i}.out", tmp_path / f"p{i}.err",
                       target="worker_processes:open_together") for i in range(6)]
    outcomes = [p.communicate(timeout=120) for p in procs]
    failed = [(err.strip().splitlines() or ["(no output)"])[-1] for (out, err), p in zip(outcomes, procs, strict=True)
              if p.returncode != 0 or "opened" not in out]
    assert not failed, failed
    assert sum("held" in out for out, _err in outcomes) == 1, "one of the workers starting at once holds the claim"


def test_four_workers_one_study(work: Path, pg_database_url: str, limit: int,  # noqa: F811
                                reference: dict) -> None:
    _prepare(pg_database_url)
    workers = [_start(work, pg_database_url, limit, f"w{i}", "--strategy", "estimate", *SPACE) for i in range(4)]
    ends = [w.finish(timeout=300) for w in workers]
    for code, out, err in ends:
        assert code == 0, err
        assert "unet_0" in out and "unet_1" in out
    searched = [err for _code, _out, err in ends if "] tuning autotune-" in err]
    assert len(searched) == 1, "one worker searched the key; the others waited for its result"
    assert sum("answered from storage" in err for _code, _out, err in ends) == 3
    storage = optuna.storages.RDBStorage(pg_database_url)
    trials = _trials(storage)
    _check_study(trials)
    assert not [t for t in trials if t.state == States.FAIL]
    assert len({t.user_attrs["owner"] for t in trials}) == 1, "all trials are the searching worker's"
    _check_bundles(work, reference)
    storage.engine.dispose()


def test_four_workers_one_killed_halfway(work: Path, pg_database_url: str, limit: int,  # noqa: F811
                                         reference: dict) -> None:
    _prepare(pg_database_url)
    storage = optuna.storages.RDBStorage(pg_database_url)
    workers = [_start(work, pg_database_url, limit, f"w{i}", "--strategy", "estimate", *SPACE,
                      target="worker_every_pass") for i in range(4)]
    victim, done_before, running = _wait_for_midway(storage, workers)
    victim.kill()
    survivors = [w for w in workers if w is not victim]
    ends = [w.finish(timeout=300) for w in survivors]
    for code, _out, err in ends:
        assert code == 0, err
    takers = [err for _code, _out, err in ends if "] tuning autotune-" in err]
    assert len(takers) == 1, "one survivor took the key over; the others waited for its result"
    assert "marked stale RUNNING trials" in takers[0]
    trials = _trials(storage)
    _check_study(trials)
    by_number = {t.number: t for t in trials}
    assert all(by_number[n].state == States.COMPLETE for n in done_before), "nothing finished was lost"
    stale = by_number[running]
    assert stale.state == States.FAIL
    assert stale.user_attrs["fail_reason"] == f"stale: worker {stale.user_attrs['owner']} is gone"
    assert [t.number for t in trials if t.state == States.FAIL] == [running]
    _check_bundles(work, reference)
    storage.engine.dispose()


def test_worker_killed_then_rerun(work: Path, pg_database_url: str, limit: int,  # noqa: F811
                                  reference: dict) -> None:
    _prepare(pg_database_url)
    storage = optuna.storages.RDBStorage(pg_database_url)
    first = _start(work, pg_database_url, limit, "first", "--strategy", "estimate", *SPACE,
                   target="worker_every_pass")
    victim, done_before, running = _wait_for_midway(storage, [first])
    victim.kill()
    assert load_bundle_config(work / "unet_0").plan is None, "a killed worker wrote nothing back"
    started = time.time()
    code, _out, err = _start(work, pg_database_url, limit, "rerun", "--strategy", "estimate", *SPACE).finish(300)
    assert code == 0, err
    assert "marked stale RUNNING trials" in err
    assert time.time() - started < 240
    trials = _trials(storage)
    _check_study(trials)
    by_number = {t.number: t for t in trials}
    assert all(by_number[n].state == States.COMPLETE for n in done_before), "nothing finished was lost"
    assert by_number[running].state == States.FAIL
    assert by_number[running].user_attrs["fail_reason"].startswith("stale: worker ")
    reused = [t for t in trials if "reused_trial" in t.user_attrs]
    assert not reused, "the fast strategy looks finished points up without new trials"
    assert err.count("from study") >= len(done_before), "the rerun answered the finished points from the study"
    _check_bundles(work, reference)
    storage.engine.dispose()


def test_tpe_workers_share_points(work: Path, pg_database_url: str, limit: int) -> None:  # noqa: F811
    """Four TPE workers with real probes on a two-point space: each point is probed once."""
    _prepare(pg_database_url)
    extra = ["--strategy", "tpe", "--num-trials", "4", "--range-num-images-per-batch", "2", "3",
             "--range-num-sw-batch-size", "1", "1", "--timeout", "240"]
    workers = [_start(work, pg_database_url, limit, f"t{i}", *extra) for i in range(4)]
    ends = [w.finish(timeout=480) for w in workers]
    for code, _out, err in ends:
        assert code == 0, err
    storage = optuna.storages.RDBStorage(pg_database_url)
    trials = _trials(storage)
    _check_study(trials)
    assert not [t for t in trials if t.state == States.FAIL]
    probed = [t for t in trials if "reused_trial" not in t.user_attrs]
    assert len(probed) == len({t.user_attrs["point_id"] for t in trials}) <= 2
    assert all(t.user_attrs["kind"] == "probe" and t.user_attrs["status"] == "ok" for t in probed)
    for trial in trials:  # a reused trial carries the measurement of the trial it points to
        if "reused_trial" in trial.user_attrs:
            source = trials[trial.user_attrs["reused_trial"]]
            assert source.user_attrs["point_id"] == trial.user_attrs["point_id"] and source.value == trial.value
    cfgs = [load_bundle_config(work / name) for name in ("unet_0", "unet_1")]
    assert cfgs[0].num_patches_per_iter in (2, 3) and cfgs[0].num_sw_batch_size == 1
    assert tuned_values(cfgs[0]) == tuned_values(cfgs[1])
    # each worker prints the values it found: bundle, status, patches, images x crops, sw batch, validation
    tables = [[line.split()[:8] for line in out.splitlines()[-2:]] for _code, out, _err in ends]
    assert all(table == tables[0] for table in tables), tables
    storage.engine.dispose()


# the largest fit is handed over: the goodput rule's verdict rests on timings, the memory answer does not
FAST = ["--strategy", "fast", "--handoff", "largest", "--timeout", "240", *SPACE]


def _undisturbed_fast(tiny: Path, limit: int, root: Path) -> tuple[dict, int]:
    """The values and the number of finished trials of one uninterrupted fast search on SQLite."""
    shutil.copytree(tiny, root / "unet_0")
    specs = {"universal": {"range_num_images_per_batch": [1, 8], "range_num_sw_batch_size": [1, 4]}}
    result = tune([root / "unet_0"], specs, device="cpu", memory_limit=limit, margin=MARGIN, progress=None,
                  storage=f"sqlite:///{root / 'undisturbed.db'}", timeout=240, handoff="largest")[0]
    storage = optuna.storages.RDBStorage(f"sqlite:///{root / 'undisturbed.db'}")
    finished = [t for t in _trials(storage) if t.state == States.COMPLETE]
    storage.engine.dispose()
    assert result["status"] == "tuned"
    return tuned_values(load_bundle_config(root / "unet_0")), len(finished)


def test_server_restart_while_two_workers_tune(work: Path, tiny: Path, pg_database_url: str,  # noqa: F811
                                               pg_cluster: PostgresCluster, limit: int, tmp_path: Path) -> None:  # noqa: F811
    """``pg_ctl restart -m fast`` while a probe runs and the other worker waits: both finish (exit 0), no trial is
    lost, failed or evaluated twice, and the answer and the trial count are the undisturbed run's."""
    _prepare(pg_database_url)
    storage = optuna.storages.RDBStorage(pg_database_url, engine_kwargs={"pool_pre_ping": True})
    workers = [_start(work, pg_database_url, limit, f"r{i}", *FAST) for i in range(2)]
    _wait_for_midway(storage, workers)
    pg_cluster.restart()
    ends = [w.finish(timeout=480) for w in workers]
    for code, _out, err in ends:
        assert code == 0, err
    trials = _trials(storage)
    _check_study(trials)
    assert not [t for t in trials if t.state == States.FAIL], "the restart failed no trial"
    expected, finished = _undisturbed_fast(tiny, limit, tmp_path / "undisturbed")
    assert len([t for t in trials if t.state == States.COMPLETE]) == finished
    _check_bundles(work, expected)
    storage.engine.dispose()


def test_server_down_past_the_retry_budget_then_rerun(work: Path, pg_database_url: str,  # noqa: F811
                                                      pg_cluster: PostgresCluster, limit: int,  # noqa: F811
                                                      reference: dict) -> None:
    """A server that stays down past ``AUTOTUNE_STORAGE_RETRY_SECONDS``: the worker says so in one line and exits 2;
    with the server back, the same command continues from the stored trials."""
    _prepare(pg_database_url)
    storage = optuna.storages.RDBStorage(pg_database_url, engine_kwargs={"pool_pre_ping": True})
    os.environ["AUTOTUNE_STORAGE_RETRY_SECONDS"] = "3"  # the worker's environment (read when it starts)
    try:
        first = _start(work, pg_database_url, limit, "down", *FAST)
    finally:
        os.environ.pop("AUTOTUNE_STORAGE_RETRY_SECONDS", None)
    _, done_before, _running = _wait_for_midway(storage, [first])
    storage.engine.dispose()
    pg_cluster.stop_server()
    try:
        code, _out, err = first.finish(timeout=300)
    finally:
        pg_cluster.start_server()
    lines = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and len(lines) == 1, err[-2000:]
    assert "database server was unreachable" in lines[0] and "run the same command to continue" in lines[0]
    assert "Traceback" not in err
    code, _out, err = _start(work, pg_database_url, limit, "again", *FAST).finish(timeout=480)
    assert code == 0, err
    storage = optuna.storages.RDBStorage(pg_database_url, engine_kwargs={"pool_pre_ping": True})
    trials = _trials(storage)
    _check_study(trials)
    by_number = {t.number: t for t in trials}
    assert all(by_number[n].state == States.COMPLETE for n in done_before), "nothing finished was lost"
    assert err.count("from study") >= len(done_before), "the rerun answered the finished points from the study"
    _check_bundles(work, reference)
    storage.engine.dispose()
