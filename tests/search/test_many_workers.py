"""Eight ``autotune worker`` processes through the storage proxy (``autotune proxy`` in front of the test
PostgreSQL), fake probes (``AUTOTUNE_FAKE_PROBE``), four tuning keys, one worker SIGKILLed mid-probe (its probe
lasts until it is killed, so the kill lands mid-probe however busy the machine): no point
probed twice, nothing finished lost, the killed worker's probe failed as stale and probed again by another,
every key's answer that of one worker alone, and the database holding no more connections than the proxy's
threads. The 256-worker version of this is ``benchmarks/bench_many_workers.py``.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections import Counter
from pathlib import Path
from typing import Any

import optuna
import pytest
from forked_cli import CliProcess, start_cli
from pg_fixtures import pg_database_url, postgres_url  # noqa: F401
from probe_fixtures import one_window_unet

from autotune.bundles.config import load_bundle_config, update_bundle_config
from autotune.bundles.model import BundleConfig
from autotune.search.storage.liveness import is_coordination_study
from autotune.stages import tune

pytestmark = pytest.mark.postgres

WORKERS, KEYS, THREADS = 8, 4, 4
FAKE = "sleep=0.3,base=64MiB,patch=32MiB,window=16MiB"
LIMIT = "300MiB"  # budget 270 MiB: 6 patches and every sw batch of the range fit
RANGES = ["--range-num-images-per-batch", "1", "8", "--range-num-sw-batch-size", "1", "4"]
MONITOR = "test-monitor"
States = optuna.trial.TrialState


def answer_of(config: BundleConfig) -> dict[str, Any]:
    """The tuned answer a bundle holds: its batch, sliding-window batch and where validation lives."""
    return {"num_patches_per_iter": config.num_patches_per_iter, "num_sw_batch_size": config.num_sw_batch_size,
            "sw_input_on_cpu": config.sw_input_on_cpu}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four bundles that differ in their optimizer's weight decay: four tuning keys."""
    source = one_window_unet(tmp_path_factory, "many_src")
    root = tmp_path_factory.mktemp("many") / "work"
    optimizer = load_bundle_config(source).optimizer.as_dict()
    for k in range(KEYS):
        shutil.copytree(source, root / f"unet_{k}")
        update_bundle_config(root / f"unet_{k}", {"optimizer": {**optimizer, "args": {
            **optimizer["args"], "weight_decay": 1.0e-5 * (k + 1)}}})
    return root


@pytest.fixture(scope="module")
def alone(work: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """What one worker alone finds for a key (SQLite, the same fake probes)."""
    root = tmp_path_factory.mktemp("alone")
    shutil.copytree(work / "unet_0", root / "unet_0")
    os.environ["AUTOTUNE_FAKE_PROBE"] = FAKE
    try:
        [result] = tune([root / "unet_0"], {"universal": {"range_num_images_per_batch": [1, 8],
                                                          "range_num_sw_batch_size": [1, 4]}},
                        device="cpu", memory_limit=LIMIT, margin=0.1, handoff="largest", progress=None,
                        storage=f"sqlite:///{root / 'alone.db'}")
    finally:
        del os.environ["AUTOTUNE_FAKE_PROBE"]
    assert result["status"] == "tuned" and result["num_patches_per_iter"] == 6
    return answer_of(load_bundle_config(root / "unet_0"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _monitor(url: str) -> optuna.storages.RDBStorage:
    return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"application_name": MONITOR}})


def _connections(storage: optuna.storages.RDBStorage, database: str) -> int:
    import sqlalchemy

    with storage.engine.connect() as conn:
        return int(conn.execute(sqlalchemy.text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = :d AND application_name <> :m"),
            {"d": database, "m": MONITOR}).scalar_one())


def _trials(storage: optuna.storages.RDBStorage) -> list[tuple[str, optuna.trial.FrozenTrial]]:
    return [(s.study_name, t) for s in storage.get_all_studies() if not is_coordination_study(s.study_name)
            for t in storage.get_all_trials(storage.get_study_id_from_name(s.study_name), deepcopy=False)]


def _start(argv: list[str], root: Path, name: str, env: dict[str, str]) -> CliProcess:
    return start_cli(argv, root / f"{name}.out", root / f"{name}.err", env)


def _probe_in_flight(monitor: Any, worker: CliProcess, deadline: float) -> tuple[str, int, str]:
    """The study, trial number and point of ``worker``'s probe once it is seen RUNNING."""
    while True:
        assert time.time() < deadline and worker.poll() is None, worker.communicate()[1][-2000:]
        for name, trial in _trials(monitor):
            if trial.state == States.RUNNING and "point_id" in trial.user_attrs \
                    and int(trial.user_attrs["owner"].rpartition(":")[2]) == worker.pid:
                return name, trial.number, trial.user_attrs["point_id"]
        time.sleep(0.1)


def test_eight_workers_through_the_proxy_one_killed(work: Path, alone: dict, pg_database_url: str,  # noqa: F811
                                                     tmp_path: Path) -> None:
    from sqlalchemy.engine import make_url

    database = make_url(pg_database_url).database
    port = _free_port()
    proxy = _start(["proxy", "--storage", pg_database_url, "--port", str(port), "--threads", str(THREADS)],
                   tmp_path, "proxy", dict(os.environ))
    monitor = _monitor(pg_database_url)
    workers: list[CliProcess] = []
    peak, killed = 0, None
    try:
        deadline = time.time() + 60
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert proxy.poll() is None and time.time() < deadline, proxy.communicate()[1][-2000:]
            time.sleep(0.1)
        env = {**os.environ, "AUTOTUNE_FAKE_PROBE": FAKE, "AUTOTUNE_CLAIM_STALE_SECONDS": "5"}
        argv = ["worker", "--work-dir", str(work), "--storage", f"grpc://127.0.0.1:{port}", "--device", "cpu",
                "--memory-limit", LIMIT, "--margin", "0.1", "--handoff", "largest", *RANGES]
        # the worker to kill probes for as long as it takes to see it mid-probe (killed, it never ends its
        # probe): started first, it is killed once its probe is seen RUNNING, with the others at work
        victim = _start(argv, tmp_path, "w0", {**env, "AUTOTUNE_FAKE_PROBE": FAKE.replace("sleep=0.3", "sleep=600")})
        workers = [victim]
        killed = _probe_in_flight(monitor, victim, time.time() + 120)
        workers += [_start(argv, tmp_path, f"w{i}", env) for i in range(1, WORKERS)]
        victim.kill()
        finished: dict[tuple[str, int], str] = {}
        deadline = time.time() + 180
        while any(w.poll() is None for w in workers):
            assert time.time() < deadline, "the workers did not finish"
            peak = max(peak, _connections(monitor, database))
            finished.update({(n, t.number): t.state.name for n, t in _trials(monitor) if t.state.is_finished()})
            time.sleep(0.2)
    finally:
        for worker in workers:
            worker.kill()
        proxy.kill()
    assert killed is not None, "a worker was killed mid-probe"
    for worker in workers:
        if worker is not victim:
            code = worker.returncode
            assert code == 0, worker.communicate()[1][-2000:]
    trials = _trials(monitor)
    states = {(n, t.number): t for n, t in trials}
    assert all(states[k].state.name == v for k, v in finished.items()), "nothing finished was lost"
    assert not [k for k, t in states.items() if t.state in (States.RUNNING, States.WAITING)], "nothing left open"
    probed = Counter((n, t.user_attrs["point_id"]) for n, t in trials
                     if t.state == States.COMPLETE and "reused_trial" not in t.user_attrs)
    assert probed and max(probed.values()) == 1, f"a point probed twice: {probed}"
    name, number, point = killed
    stale = states[(name, number)]
    assert stale.state == States.FAIL and stale.user_attrs["fail_reason"].startswith("stale: worker "), stale.user_attrs
    assert probed[(name, point)] == 1, "another worker probed the killed worker's point"
    for k in range(KEYS):
        assert answer_of(load_bundle_config(work / f"unet_{k}")) == alone, f"unet_{k}"
    assert 0 < peak <= THREADS, f"{peak} connections: the proxy's pool holds {THREADS}"
    monitor.engine.dispose()
