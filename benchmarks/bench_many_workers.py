"""Hundreds of workers on one storage: 256 worker processes through Optuna's gRPC storage proxy over
PostgreSQL, and directly on PostgreSQL with one connection per call (``AUTOTUNE_STORAGE_POOL=none``, the
pool that fits its 100 connections); then 32 workers, one SIGKILLed every few seconds and replaced.

Each worker runs what ``autotune worker`` runs (``tune(..., workers_share=True)``, the fast strategy) on one
work folder of ``--keys`` bundles: copies of a tiny UNet bundle that differ in the optimizer's weight decay,
so each is a tuning key of its own. Fake probes (``AUTOTUNE_FAKE_PROBE``: sleep ``--sleep`` s, then a
synthetic peak and speed) take the place of the device, so the storage and the coordination are the load.

How the processes are made: this process imports everything a worker needs (torch, MONAI, Optuna,
SQLAlchemy, psycopg, grpc) and loads the bundles once, then forks the workers (copy-on-write: 256 fresh
interpreters would not fit in memory; ``gc.freeze`` keeps the collector off the shared objects). The
bundles' configs are read from that copy rather than from disk (each worker would otherwise parse every
bundle, ``--keys`` x workers YAML files on 2 cores: per-node work on a cluster, not coordination), and tuned
values are not written back into the bundles (``write_back=False``: 256 workers rewriting every bundle is the
same kind of per-node work); the answers are read from the studies.
Each worker has a host name of its own (``node-NNN``), so a killed worker is taken over only once its
heartbeat lapses (the grace, ``--grace`` s), as on a cluster, never by the same-host shortcut.

What it measures, from the storage after each run (and while it runs):

- points probed twice: per study, points with more than one COMPLETE trial that ran a probe;
- finished trials lost: every trial seen finished while polling (every 2 s) is still finished, in the same
  state, at the end;
- killed workers: the trial each was probing ends FAIL as stale and its point is probed again by another
  worker; seconds from the SIGKILL to that stale FAIL (the grace plus a beat);
- workers declared dead that were not killed (a heartbeat starved of CPU past the grace: work redone, never
  wrong);
- answers: every key's stored answer against one worker alone on SQLite with the same fake probes;
- wall (the first worker's start to the last one's exit) against the ideal: the COMPLETE probe trials times
  the probe's sleep over the workers;
- PostgreSQL's client connections at their peak (``pg_stat_activity``, every 0.25 s) and its
  ``max_connections``; the workers' memory at its peak (sums of RSS and PSS, ``/proc/PID/smaps_rollup``);
- the storage calls the workers made (each finished worker counts its own), per probe.

PostgreSQL: a throw-away server on 127.0.0.1 (``benchmarks/postgres.py``, the tests' server too), default settings
(``max_connections`` 100) but for ``fsync``, ``synchronous_commit`` and ``full_page_writes`` (off).
A run is given up when the machine's available memory falls under 3 GiB (``given_up_low_memory``).

    python -m benchmarks.bench_many_workers [--workers 256] [--keys 64] [--sleep 2] [--runs proxy,direct,churn]
        [--out benchmarks/results/many_workers.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.common import cpu_name, new_database, parser, write_json

HERE = Path(__file__).resolve().parent
MARGIN = 0.10
LIMIT = "600MiB"
FAKE = "sleep={sleep},base=64MiB,patch=32MiB,window=16MiB"
SPECS = {"universal": {"range_num_images_per_batch": [1, 16], "range_num_sw_batch_size": [1, 8]}}
ANSWER = ("num_patches_per_iter", "num_sw_batch_size", "validation_device", "sw_input_on_cpu")  # a stored answer
MONITOR = "bench-monitor"
LOW_MEMORY = 3 * 2**30  # MemAvailable below which a run is given up
MEMORY_EVERY = 20.0  # seconds between two samples of the workers' memory (reading 256 smaps takes a core for ~1 s)


_BUNDLES: dict[str, Any] = {}  # bundle path -> loaded Bundle, read once before the workers fork


# -- preparing (in a fresh interpreter: the parent forks workers, so it must not have run torch ops) -------
def prepare(root: Path, keys: int, sleep: float) -> dict[str, Any]:
    """The work folder of ``keys`` bundles and the answer one worker alone finds (SQLite)."""
    from autotune.bundles.config import load_bundle_config, update_bundle_config
    from autotune.stages import tune
    from benchmarks.tiny_bundles import make_tiny_bundles

    source = make_tiny_bundles(root / "src", algos=("unet",))["unet"]
    optimizer = load_bundle_config(source).optimizer.as_dict()
    work = root / "work"
    for k in range(keys):
        shutil.copytree(source, work / f"unet_{k}")
        args = {**optimizer["args"], "weight_decay": 3.0e-5 * (k + 1)}
        update_bundle_config(work / f"unet_{k}", {"optimizer": {**optimizer, "args": args}})
    single = root / "single" / "unet_0"
    shutil.copytree(work / "unet_0", single)
    os.environ["AUTOTUNE_FAKE_PROBE"] = FAKE.format(sleep=sleep)
    import optuna

    started = time.perf_counter()
    url = f"sqlite:///{root / 'single.db'}"
    [record] = tune([single], SPECS, device="cpu", memory_limit=LIMIT, margin=MARGIN, handoff="largest",
                    storage=url, progress=None, write_back=False)
    [answer] = _measure_studies(optuna.storages.RDBStorage(url))[1].values()
    return {"answer": answer, "probes": record["probes"],
            "single_seconds": round(time.perf_counter() - started, 2),
            "bundles": sorted(str(p) for p in work.iterdir())}


# -- the worker process ---------------------------------------------------------------------------------------
def _worker(index: int, storage: str, bundles: list[str], env: dict[str, str], logs: Path, go: int | None) -> None:
    """The forked child: its own session and host name, then what ``autotune worker`` runs; never returns."""
    code = 3
    try:
        os.setsid()
        out = os.open(logs / f"w{index:03d}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        host = f"node-{index:03d}"
        socket.gethostname = lambda: host  # type: ignore[assignment]
        os.environ.update(env)
        if go is not None:
            os.read(go, 1)  # every first worker starts together
        from autotune.stages import tune

        results = tune(bundles, SPECS, device="cpu", memory_limit=LIMIT, margin=MARGIN, handoff="largest",
                       storage=storage, workers_share=True, write_back=False,
                       progress=lambda line: print(line, file=sys.stderr, flush=True))
        code = 0 if all(r.get("status") == "tuned" for r in results) else 1
        print("CALLS " + json.dumps({n: [c, round(CALL_SECONDS[n], 3)] for n, c in CALLS.items()}), flush=True)
        print("SITES " + json.dumps(dict(CALL_SITES)), flush=True)
    except BaseException as exc:  # noqa: BLE001 - the exit code and the log say it
        import traceback

        traceback.print_exc()
        code = 2 if not isinstance(exc, SystemExit) else int(exc.code or 0)
    finally:
        sys.stderr.flush()
        os._exit(code)


def _preload(bundles: list[str]) -> None:
    """Import what a worker needs and read the bundles once, before forking."""
    import grpc  # noqa: F401
    import monai  # noqa: F401
    import optuna
    import psycopg  # noqa: F401
    import torch  # noqa: F401

    import autotune.search.driver.bundles as driver
    import autotune.stages  # noqa: F401
    from autotune.bundles.config import load_bundle
    from autotune.search.storage import backends, claims, legacy  # noqa: F401
    from autotune.search.storage.study import quiet_optuna

    quiet_optuna()
    optuna.storages.RDBStorage  # noqa: B018
    from autotune.search.storage.retry import rdb_storage_class

    _count_calls(backends._grpc_class())
    _count_calls(rdb_storage_class(retry=True))  # the key open_storage asks for (lru_cache keys by keyword)
    for path in bundles:
        _BUNDLES[str(Path(path))] = load_bundle(path)
    driver.load_bundle = lambda bundle: _BUNDLES[str(Path(bundle))]  # type: ignore[assignment]
    import gc

    # every object made so far is the workers' shared memory: kept out of the collector's passes, so a worker's
    # collection does not write to each of their pages and copy it (256 copies of the preloaded heap)
    gc.collect()
    gc.freeze()


CALLS: Counter[str] = Counter()  # storage calls of this process (a worker's, after the fork), by method
CALL_SECONDS: Counter[str] = Counter()
CALL_SITES: Counter[str] = Counter()  # "outer autotune function > inner one: method", for where the calls come from


def _call_site(name: str) -> str:
    """Where a storage call comes from: the two innermost functions of autotune on the stack (the storage's own
    wrappers, ``retry`` and ``backends``, left out) and the method."""
    frame = sys._getframe(2)
    names: list[str] = []
    while frame is not None and len(names) < 2:
        path = frame.f_code.co_filename
        if "/autotune/" in path and not path.endswith(("retry.py", "backends.py")):
            names.append(f"{Path(path).stem}.{frame.f_code.co_name}")
        frame = frame.f_back
    return " > ".join(reversed(names)) + f": {name}"


def _count_calls(cls: type) -> None:
    """Count (and time) the public storage calls made through ``cls`` in this process."""
    import functools

    for name in [n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))]:
        method = getattr(cls, name)

        def counted(self: Any, *a: Any, __m: Any = method, __n: str = name, **k: Any) -> Any:
            started = time.perf_counter()
            try:
                return __m(self, *a, **k)
            finally:
                CALLS[__n] += 1
                CALL_SECONDS[__n] += time.perf_counter() - started
                CALL_SITES[_call_site(__n)] += 1

        setattr(cls, name, functools.wraps(method)(counted))


class Fleet:
    """The forked workers of one run."""

    def __init__(self, storage: str, bundles: list[str], env: dict[str, str], logs: Path) -> None:
        self.storage, self.bundles, self.env, self.logs = storage, bundles, env, logs
        self.alive: dict[int, int] = {}  # pid -> index
        self.codes: dict[int, int] = {}  # index -> exit code (or -signal)
        self.count = 0

    def start(self, go: int | None) -> int:
        index = self.count
        self.count += 1
        pid = os.fork()
        if pid == 0:
            _worker(index, self.storage, self.bundles, self.env, self.logs, go)
        self.alive[pid] = index
        return pid

    def reap(self) -> None:
        while self.alive:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            index = self.alive.pop(pid, None)
            if index is not None:
                self.codes[index] = os.waitstatus_to_exitcode(status)

    def kill(self, pid: int) -> None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def memory(self) -> dict[str, int]:
        """Sums of RSS and PSS (bytes) over the live workers."""
        rss = pss = 0
        for pid in list(self.alive):
            try:
                text = Path(f"/proc/{pid}/smaps_rollup").read_text()
            except OSError:
                continue
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in text.splitlines()[1:]}
            rss += fields.get("Rss", 0)
            pss += fields.get("Pss", 0)
        return {"rss": rss, "pss": pss, "workers": len(self.alive)}


# -- watching a run -------------------------------------------------------------------------------------------
def _conninfo(url: str, database: str | None = None) -> str:
    from sqlalchemy.engine import make_url

    u = make_url(url)
    return f"host={u.host} port={u.port} user={u.username} dbname={database or u.database} application_name={MONITOR}"


def _connections(admin: Any, database: str) -> int:
    return int(admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND backend_type = "
                             "'client backend' AND application_name <> %s", (database, MONITOR)).fetchone()[0])


def _finished(db: Any) -> dict[int, str]:
    rows = db.execute("SELECT trial_id, state FROM trials WHERE state IN ('COMPLETE', 'FAIL')").fetchall()
    return {int(r[0]): str(r[1]) for r in rows}


def _probing(db: Any) -> dict[int, list[int]]:
    """pid -> RUNNING probe trials (trial ids) of the measurement studies."""
    rows = db.execute(
        "SELECT t.trial_id, a.value_json FROM trials t JOIN trial_user_attributes a ON a.trial_id = t.trial_id "
        "AND a.key = 'owner' JOIN studies s ON s.study_id = t.study_id WHERE t.state = 'RUNNING' "
        "AND s.study_name NOT LIKE '%%-claims' AND s.study_name <> 'autotune-workers'").fetchall()
    found: dict[int, list[int]] = {}
    for trial_id, owner in rows:
        pid = json.loads(owner).rpartition(":")[2]
        if pid.isdigit():
            found.setdefault(int(pid), []).append(int(trial_id))
    return found


def watch(fleet: Fleet, url: str, database: str, kill_at: list[float], churn_every: float | None,
          timeout: float) -> dict[str, Any]:
    """Poll until every worker has exited: connections, finished trials, memory; kill as scheduled."""
    import psycopg

    admin = psycopg.connect(_conninfo(url, "postgres"), autocommit=True)
    db = psycopg.connect(_conninfo(url, database), autocommit=True)
    started = time.monotonic()
    seen: dict[int, str] = {}
    peak_connections, kills, memory = 0, [], {"rss": 0, "pss": 0, "workers": 0}
    low_memory = False
    next_finished = next_memory = next_churn = started
    schedule = sorted(kill_at)
    while fleet.alive and time.monotonic() - started < timeout:
        now = time.monotonic()
        peak_connections = max(peak_connections, _connections(admin, database))
        if now >= next_finished:
            seen.update({k: v for k, v in _finished(db).items() if k not in seen})
            next_finished = now + 2.0
        if now >= next_memory:
            sample = fleet.memory()
            if sample["pss"] > memory["pss"]:
                memory = sample
            next_memory = now + MEMORY_EVERY
            if _available_memory() < LOW_MEMORY:  # the machine is shared: give the run up before it swaps or OOMs
                low_memory = True
                break
        due = (schedule and now - started >= schedule[0]) or (churn_every and now >= next_churn + churn_every)
        if due:
            victims = [(pid, trials) for pid, trials in _probing(db).items() if pid in fleet.alive]
            if victims:
                pid, trials = victims[0]
                fleet.kill(pid)
                kills.append({"pid": pid, "at": dt.datetime.now().isoformat(), "seconds": round(now - started, 2),
                              "trials": trials})
                if schedule:
                    schedule.pop(0)
                if churn_every:
                    next_churn = now
                    fleet.start(None)  # a replacement, as a scheduler restarts a lost task
        fleet.reap()
        time.sleep(0.25)
    timed_out = bool(fleet.alive) and not low_memory
    for pid in list(fleet.alive):
        fleet.kill(pid)
    time.sleep(0.5)
    fleet.reap()
    seen.update({k: v for k, v in _finished(db).items() if k not in seen})
    admin.close()
    db.close()
    return {"wall_seconds": round(time.monotonic() - started, 2), "seen_finished": seen, "kills": kills,
            "peak_connections": peak_connections, "memory": memory, "timed_out": timed_out,
            "given_up_low_memory": low_memory}


def _available_memory() -> int:
    """The machine's available memory (``MemAvailable``, bytes)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 1 << 62


# -- reading the outcome --------------------------------------------------------------------------------------
def _measure_studies(storage: Any) -> tuple[list[Any], dict[str, Any], list[Any], list[Any]]:
    """(trials of the measurement studies, key study name -> its stored answer, worker trials, claims)."""
    from autotune.search.storage.liveness import WORKERS_STUDY, is_coordination_study

    trials, answers, workers, tickets = [], {}, [], []
    for summary in storage.get_all_studies():
        study_id = storage.get_study_id_from_name(summary.study_name)
        found = storage.get_all_trials(study_id, deepcopy=False)
        if summary.study_name == WORKERS_STUDY:
            workers = found
        elif is_coordination_study(summary.study_name):
            tickets += found
        else:
            trials += [(summary.study_name, t) for t in found]
            stored = [v for k, v in summary.user_attrs.items() if k.startswith("result:")]
            if stored:
                answers[summary.study_name] = {k: stored[0].get(k) for k in ANSWER}
    return trials, answers, workers, tickets


def outcome(url: str, watched: dict[str, Any], reference: dict[str, Any], workers: int, keys: int,
            sleep: float) -> dict[str, Any]:
    """The figures of one run, read from its storage."""
    import optuna
    from optuna.trial import TrialState

    storage = optuna.storages.RDBStorage(url)
    try:
        trials, answers, worker_trials, tickets = _measure_studies(storage)
    finally:
        storage.engine.dispose()
    by_id = {t._trial_id: (name, t) for name, t in trials}
    probed = [(name, t) for name, t in trials if t.user_attrs.get("kind") == "fake" and "reused_trial" not in t.user_attrs]
    complete = Counter((name, t.user_attrs.get("point_id")) for name, t in probed if t.state == TrialState.COMPLETE)
    lost = [i for i, state in watched["seen_finished"].items()
            if i in by_id and by_id[i][1].state.name != state]
    killed_pids = {k["pid"] for k in watched["kills"]}
    dead = [t for t in worker_trials if t.state == TrialState.FAIL]
    wrongly = [t for t in dead if int(t.user_attrs.get("pid", -1)) not in killed_pids]
    takeovers = [_takeover(kill, by_id, trials) for kill in watched["kills"]]
    ideal = sum(complete.values()) * sleep / workers
    per_key = Counter(name.removesuffix("-infer") for (name, _point), _count in complete.items())
    bound = max(per_key.values(), default=0) * sleep  # a key's probes run one after another, whoever runs them
    return {
        "workers": workers, "keys": keys, "probe_seconds": sleep,
        "keys_answered": len(answers), "answers_equal_single_worker": sum(a == reference["answer"] for a in answers.values()),
        "probes_complete": sum(complete.values()), "probe_trials": len(probed),
        "points_probed_twice": sum(1 for c in complete.values() if c > 1),
        "finished_trials_seen": len(watched["seen_finished"]), "finished_trials_lost": len(lost),
        "left_running": sum(1 for _, t in trials if t.state == TrialState.RUNNING),
        "workers_killed": len(watched["kills"]), "killed_trials_taken_over": sum(t["taken_over"] for t in takeovers),
        "killed_trials": sum(len(k["trials"]) for k in watched["kills"]),
        "stale_after_kill_seconds": sorted(t["seconds"] for t in takeovers if t["seconds"] is not None),
        "worker_trials": len(worker_trials), "declared_dead": len(dead), "declared_dead_not_killed": len(wrongly),
        "claim_tickets": len(tickets),
        "wall_seconds": watched["wall_seconds"], "ideal_seconds": round(ideal, 2), "key_bound_seconds": bound,
        "wall_over_ideal": round(watched["wall_seconds"] / ideal, 2) if ideal else None,
        "peak_connections": watched["peak_connections"], "memory_at_peak": watched["memory"],
        "timed_out": watched["timed_out"], "given_up_low_memory": watched["given_up_low_memory"], "kills": watched["kills"], "takeovers": takeovers,
    }


def _takeover(kill: dict[str, Any], by_id: dict[int, Any], trials: list[Any]) -> dict[str, Any]:
    """Whether the points a killed worker was probing were failed as stale and probed again by another."""
    from optuna.trial import TrialState

    at = dt.datetime.fromisoformat(kill["at"])
    seconds, taken, points = None, 0, []
    for trial_id in kill["trials"]:
        if trial_id not in by_id:
            continue
        name, trial = by_id[trial_id]
        if trial.state == TrialState.FAIL and str(trial.user_attrs.get("fail_reason", "")).startswith("stale: "):
            seconds = round((trial.datetime_complete - at).total_seconds(), 1)
        point = trial.user_attrs.get("point_id")
        later = [t for n, t in trials if n == name and t.user_attrs.get("point_id") == point and t.number > trial.number]
        taken += any(t.state == TrialState.COMPLETE for t in later)
        points.append({"study": name, "point": point, "state": trial.state.name,
                       "fail_reason": trial.user_attrs.get("fail_reason"),
                       "later": [(t.number, t.state.name, t.user_attrs.get("owner")) for t in later]})
    return {"pid": kill["pid"], "seconds": seconds, "taken_over": taken, "points": points}


# -- one run --------------------------------------------------------------------------------------------------
def _start_proxy(url: str, threads: int, logs: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = open(logs / "proxy.log", "w")  # noqa: SIM115 - open for the proxy's life
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "proxy", "--storage", url, "--port", str(port),
                             "--threads", str(threads)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"grpc://127.0.0.1:{port}"
        if proc.poll() is not None:
            raise RuntimeError(f"the proxy ended: {(logs / 'proxy.log').read_text()[-500:]}")
        time.sleep(0.2)
    raise RuntimeError("the proxy did not start")


def run(name: str, admin_url: str, prepared: dict[str, Any], args: argparse.Namespace, workers: int,
        kill_at: list[float], churn_every: float | None, via_proxy: bool, logs: Path, grace: float) -> dict[str, Any]:
    """One run: a fresh database, the proxy (or not), ``workers`` forked workers; its figures."""
    from autotune.search.storage.study import open_storage

    url, database = new_database(admin_url, "bench_many")
    open_storage(url).engine.dispose()  # Optuna's tables, before the workers race to make them
    proxy, storage = (_start_proxy(url, args.threads, logs) if via_proxy else (None, url))
    env = {"AUTOTUNE_FAKE_PROBE": FAKE.format(sleep=args.sleep), "AUTOTUNE_CLAIM_STALE_SECONDS": str(grace)}
    if not via_proxy:
        env["AUTOTUNE_STORAGE_POOL"] = "none"
    run_logs = logs / name
    run_logs.mkdir(parents=True, exist_ok=True)
    fleet = Fleet(storage, prepared["bundles"][: args.keys], env, run_logs)
    go_read, go_write = os.pipe()
    for _ in range(workers):
        fleet.start(go_read)
    os.write(go_write, b"x" * workers)
    try:
        watched = watch(fleet, url, database, kill_at, churn_every, args.timeout)
    except BaseException:  # Ctrl-C or a bug: no worker outlives the benchmark
        for pid in list(fleet.alive):
            fleet.kill(pid)
        raise
    finally:
        if proxy is not None:
            os.killpg(proxy.pid, signal.SIGTERM)
            proxy.wait(timeout=60)
    result = outcome(url, watched, prepared, workers, args.keys, args.sleep)  # the ideal: workers alive at once
    result["workers_started"] = fleet.count  # the churn run's replacements too
    result["claim_stale_seconds"] = grace
    bad = {i: c for i, c in fleet.codes.items() if c not in (0, -signal.SIGKILL)}
    calls = _storage_calls(run_logs)
    result["storage_calls"] = calls
    result["storage_calls_per_probe"] = round(calls["calls"] / result["probes_complete"], 1) \
        if result["probes_complete"] else None
    result.update(name=name, storage="gRPC proxy over PostgreSQL" if via_proxy else "PostgreSQL, a connection per call",
                  proxy_threads=args.threads if via_proxy else None, worker_errors=len(bad),
                  worker_error_tails=[_tail(run_logs / f"w{i:03d}.log") for i in sorted(bad)[:3]])
    print(json.dumps({k: v for k, v in result.items() if k not in ("kills", "takeovers")}), file=sys.stderr, flush=True)
    return result


def _storage_calls(logs: Path) -> dict[str, Any]:
    """The storage calls of the workers that finished (each prints its count on its last line), summed."""
    total: Counter[str] = Counter()
    sites: Counter[str] = Counter()
    workers = 0
    for path in sorted(logs.glob("w*.log")):
        lines = path.read_text(errors="replace").splitlines()
        calls = [line for line in lines if line.startswith("CALLS ")]
        if calls:
            workers += 1
            total.update({n: c for n, (c, _s) in json.loads(calls[-1][6:]).items()})
            sites.update(json.loads(next((line[6:] for line in reversed(lines) if line.startswith("SITES ")), "{}")))
    return {"workers_reporting": workers, "calls": sum(total.values()), "by_method": dict(total.most_common()),
            "by_site": dict(sites.most_common(40))}


def _tail(path: Path) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-3:])[-400:]
    except OSError:
        return ""


# -- the report -----------------------------------------------------------------------------------------------
def _gib(n: int) -> str:
    return f"{n / 2**30:.1f}"


def _row(figure: str, checks: str, runs: list[dict[str, Any]], cell: Any) -> str:
    return f"| {figure} | " + " | ".join(str(cell(r)) for r in runs) + f" | {checks} |"


def _stale(r: dict[str, Any]) -> str:
    stale = r["stale_after_kill_seconds"]
    return f"{min(stale):.0f}-{max(stale):.0f}" if stale else "-"


def _memory(r: dict[str, Any]) -> str:
    mem = r["memory_at_peak"]
    return f"{_gib(mem['rss'])} / {_gib(mem['pss'])} ({mem['workers']} live)"


def markdown_table(report: dict[str, Any]) -> str:
    """The runs of ``report``, one column each, a row per figure with the claim it checks (BENCHMARKS.md)."""
    runs, single = report["runs"], report["setup"]["single_worker"]["probes"]
    max_conn = report["postgres"]["max_connections"]
    rows = [
        ("storage", "", lambda r: r["storage"] + (f" ({r['proxy_threads']} threads)" if r["proxy_threads"] else "")),
        ("workers started (SIGKILLed)", "", lambda r: f"{r['workers_started']} ({r['workers_killed']})"),
        ("keys answered / keys", "every key is tuned", lambda r: f"{r['keys_answered']} / {r['keys']}"),
        ("probes completed of keys x one worker's (s each)", "",
         lambda r: f"{r['probes_complete']} of {r['keys'] * single} ({r['probe_seconds']:g})"),
        ("**points probed twice**", "a point is probed by one worker at a time, once",
         lambda r: f"**{r['points_probed_twice']}**"),
        ("**finished trials lost**", "nothing finished is lost (every trial seen finished while polling)",
         lambda r: f"**{r['finished_trials_lost']}** of {r['finished_trials_seen']}"),
        ("killed mid-probe: probes taken over", "a SIGKILLed worker's point is probed again by another",
         lambda r: f"{r['killed_trials_taken_over']} / {r['killed_trials']}"),
        ("grace (AUTOTUNE_CLAIM_STALE_SECONDS), s", "", lambda r: f"{r['claim_stale_seconds']:g}"),
        ("SIGKILL to stale FAIL, s", "taken over once the heartbeat lapses (the grace)", _stale),
        ("declared dead, not killed", "a live worker starved of CPU is not declared dead",
         lambda r: r["declared_dead_not_killed"]),
        ("trials left RUNNING", "no trial is left open", lambda r: r["left_running"]),
        ("answers = one worker's", "sharing does not change the answer",
         lambda r: f"{r['answers_equal_single_worker']} / {r['keys_answered']}"),
        ("wall s", "", lambda r: f"> {r['wall_seconds']:.0f} (given up)" if r["timed_out"] else f"{r['wall_seconds']:.0f}"),
        ("ideal s (probes x s / workers)", "", lambda r: f"{r['ideal_seconds']:.1f}"),
        ("one key's probes in a row, s", "the least wall however many workers", lambda r: f"{r['key_bound_seconds']:.0f}"),
        ("wall / ideal", "what coordination costs on this machine",
         lambda r: f"> {r['wall_over_ideal']}" if r["timed_out"] else r["wall_over_ideal"]),
        ("storage calls per probe", "the load a probe puts on the storage",
         lambda r: r["storage_calls_per_probe"] if r["storage_calls"]["workers_reporting"] else "-"),
        (f"peak PostgreSQL connections (max {max_conn})", "hundreds of workers fit in the database's connections",
         lambda r: r["peak_connections"]),
        ("workers' RSS / PSS at peak, GiB", "", _memory),
        ("worker errors, timed out", "", lambda r: f"{r['worker_errors']}, {'yes' if r['timed_out'] else 'no'}"),
    ]
    lines = ["| figure | " + " | ".join(r["name"] for r in runs) + " | what it checks |",
             "|---|" + "---:|" * len(runs) + "---|"]
    lines += [_row(figure, checks, runs, cell) for figure, checks, cell in rows]
    return "\n".join(lines)


def main() -> int:
    p = parser(__doc__, "many_workers.json", report_only=False)
    p.add_argument("--workers", type=int, default=256)
    p.add_argument("--keys", type=int, default=64, help="tuning keys (bundles) in the work folder")
    p.add_argument("--sleep", type=float, default=2.0, help="seconds a fake probe sleeps")
    p.add_argument("--grace", type=float, default=60.0,
                        help="AUTOTUNE_CLAIM_STALE_SECONDS of the proxy and direct runs (autotune's default: 60)")
    p.add_argument("--churn-grace", type=float, default=10.0, help="AUTOTUNE_CLAIM_STALE_SECONDS of the churn run")
    p.add_argument("--threads", type=int, default=16, help="the proxy's threads (its database connections)")
    p.add_argument("--kills", default="20,40", help="seconds after the start at which a probing worker is killed")
    p.add_argument("--runs", default="proxy,direct,churn")
    p.add_argument("--churn-workers", type=int, default=32)
    p.add_argument("--churn-every", type=float, default=3.0, help="seconds between kills in the churn run")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before a run is given up")
    p.add_argument("--prepare", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.prepare:
        print(json.dumps(prepare(Path(args.prepare), args.keys, args.sleep)))
        return 0
    root = Path(tempfile.mkdtemp(prefix="bench-many-"))
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench_many_workers", "--prepare", str(root), "--keys", str(args.keys),
                           "--sleep", str(args.sleep)], capture_output=True, text=True, check=True, cwd=str(HERE.parent))
    prepared = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"one worker alone: {prepared['answer']}, {prepared['probes']} probes, {prepared['single_seconds']} s",
          file=sys.stderr)
    from benchmarks.postgres import start_cluster

    cluster = start_cluster()
    runs = []
    try:
        pg = _postgres_facts(cluster.url)
        _preload(prepared["bundles"][: args.keys])
        kills = [float(s) for s in args.kills.split(",") if s.strip()]
        wanted = [r.strip() for r in args.runs.split(",") if r.strip()]
        for name in wanted:
            churn = name == "churn"
            runs.append(run(name, cluster.url, prepared, args, args.churn_workers if churn else args.workers,
                            [] if churn else kills, args.churn_every if churn else None, name != "direct", root,
                            args.churn_grace if churn else args.grace))
    finally:
        cluster.stop()
    report = _report(args, prepared, pg, runs)
    write_json(Path(args.out), report)
    print(markdown_table(report))
    print(f"wrote {args.out}; logs in {root}")
    return 0


def _postgres_facts(url: str) -> dict[str, Any]:
    """The server's version and ``max_connections``."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as conn:
            return {"version": conn.execute(sqlalchemy.text("SHOW server_version")).scalar_one(),
                    "max_connections": int(conn.execute(sqlalchemy.text("SHOW max_connections")).scalar_one())}
    finally:
        engine.dispose()


def _report(args: argparse.Namespace, prepared: dict[str, Any], pg: dict[str, Any],
            runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON written: the command, the machine, the server, the set-up and the runs."""
    return {
        "command": ("python -m benchmarks.bench_many_workers " + " ".join(sys.argv[1:])).strip(),
        "machine": {"cpu": cpu_name(), "cpus": os.cpu_count(), "gpu": None, "platform": platform.platform(),
                    "python": platform.python_version(), "load_average_at_end": os.getloadavg(),
                    "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)},
        "postgres": pg,
        "setup": {"strategy": "fast", "fake_probe": FAKE.format(sleep=args.sleep), "memory_limit": LIMIT,
                  "margin": MARGIN, "space": SPECS["universal"], "claim_stale_seconds": args.grace, "churn_claim_stale_seconds": args.churn_grace,
                  "single_worker": {k: prepared[k] for k in ("answer", "probes", "single_seconds")}},
        "runs": runs,
    }


if __name__ == "__main__":
    sys.exit(main())
