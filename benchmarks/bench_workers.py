"""Workers benchmark: TPE trials per minute with 1, 2 and 4 CPU workers on one PostgreSQL study,
and with one worker on SQLite; then a run with faults injected (simulated probe crashes and a
worker SIGKILLed halfway), counting what survived and what was lost.

Each worker is a separate process running ``tune(..., strategy="tpe", workers_share=True)`` -- what
``autotune worker`` runs -- on one tiny UNet bundle, with the fake-probe hook (``AUTOTUNE_FAKE_PROBE``,
no sleep) answering its points from the estimator's affine memory models, fitted once by the harness
(two FakeTensor passes per phase), so a trial costs no compute: the storage (trial rows, point
claims, the lookups of earlier points) and Optuna's TPE sampler are the load. Every worker
asks ``--trials`` trials (its share of the study), over patches per iteration 1-64 and
sliding-window batch 1-64.

Trials per minute counts every finished trial (COMPLETE or FAIL, reused ones included) between
the first trial's start and the last one's end; "new points" counts the trials that evaluated a
point (not reused). ``--distinct-seeds`` gives every worker its own TPE seed (by default all use
the bundle's seed, as ``autotune worker`` does today) to show what sharing one seed costs.

PostgreSQL: a throw-away server on 127.0.0.1 (tests/pg_fixtures.py; needs the postgresql
package) unless ``--postgres URL`` names one (a database per run is created there).

    python -m benchmarks.bench_workers [--trials 40] [--workers 1,2,4] [--distinct-seeds]
        [--out benchmarks/results/workers.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import LoadSampler, generate_bundles, new_database, parser, write_json

MARGIN = 0.10
SPACE = {"range_num_images_per_batch": [1, 64], "range_num_sw_batch_size": [1, 64]}
STALE_SECONDS = 10
HERE = Path(__file__).resolve().parent


# -- the worker process ---------------------------------------------------------------
def _install_model_answers(models: dict[str, Any], crash_every: int) -> None:
    """Answer every point from the fitted models; with ``crash_every`` > 0 some points 'crash'."""
    from autotune.search.curves import fake

    train, infer = models["train"], models["infer"]
    os.environ["AUTOTUNE_FAKE_PROBE"] = "sleep=0,base=1,patch=1,window=1"  # a FakeProber, answering as below

    def probe(self: Any, point: dict[str, Any], phases: tuple[str, ...]) -> dict[str, Any]:
        n = int(point.get("num_patches_per_iter") or 1)
        m = min(int(point.get("num_sw_batch_size") or 1), int(infer["cap"] or 10**9))
        result: dict[str, Any] = {"measured": False}
        if crash_every and (7 * n + 3 * m) % crash_every == 0:  # as a probe child killed by a signal
            return {**result, "status": "killed", "signal": 9, "error_type": "SIGKILL"}
        if "train" in phases:
            result["train_peak_bytes"] = int(train["intercept"] + train["slope"] * n)
        if "infer" in phases:
            result["infer_peak_bytes"] = int(infer["intercept"] + infer["slope"] * m)
        peak = max(v for k, v in result.items() if k.endswith("_peak_bytes"))
        result["peak_bytes"] = peak
        result["status"] = "oom" if peak > self.memory_limit else "ok"  # as a probe: over the budget is "does not fit"
        return result

    fake.FakeProber.probe = probe  # type: ignore[method-assign]


def _distinct_seed(index: int) -> None:
    import optuna

    original = optuna.samplers.TPESampler

    class Seeded(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, seed: int | None = None, **kwargs: Any) -> None:
            super().__init__(*args, seed=(seed or 0) + 1000 * index, **kwargs)

    optuna.samplers.TPESampler = Seeded  # type: ignore[misc]


def worker_main(args: argparse.Namespace) -> int:
    spec = json.loads(Path(args.spec).read_text())
    _install_model_answers(spec["models"], args.crash_every)
    if args.distinct_seeds:
        _distinct_seed(args.index)
    import optuna  # noqa: F401  (imports done before the start signal)

    from autotune.stages import tune

    barrier = Path(args.barrier)
    (barrier / f"ready.{args.index}").touch()
    while not (barrier / "go").exists():  # all workers start their search together
        time.sleep(0.02)
    results = tune([spec["bundle"]], {"universal": {**SPACE, "num_trials": args.trials}}, device="cpu",
                           memory_limit=spec["limit"], storage=args.storage, strategy="tpe",
                           margin=MARGIN, workers_share=True, progress=None, write_back=False)
    return 0 if results[0]["status"] == "tuned" else 1


# -- the harness ----------------------------------------------------------------------
def make_bundle(root: Path) -> Path:
    from autotune.bundles.templates import load_overrides
    from autotune.data.synthetic import make_demo_dataset

    data = make_demo_dataset(root / "data", cases=2, size=32, classes=2, seed=0)
    return generate_bundles(data, root / "work", ["unet"], overrides=load_overrides("tiny"))["unet"]


def fit_models(bundle: Path) -> tuple[dict[str, Any], int]:
    from autotune.probe.estimate import fit_memory_model

    train = fit_memory_model(bundle, phase="train", device="cpu")
    infer = fit_memory_model(bundle, phase="infer", device="cpu")
    # a limit whose budget holds about 12 patches' worth: the feasible region is a small corner
    limit = int((train.intercept + 12.5 * train.slope) / (1 - MARGIN))
    models = {"train": {"intercept": train.intercept, "slope": train.slope},
              "infer": {"intercept": infer.intercept, "slope": infer.slope, "cap": infer.cap}}
    return models, limit


class Postgres:
    """Databases on a given server, or on a throw-away one started here."""

    def __init__(self, url: str | None) -> None:
        self.cluster = None
        if url is None:
            from tests import pg_fixtures

            self.cluster = pg_fixtures._start_cluster()
            url = self.cluster.url
        self.url = url

    def new_database(self) -> str:
        return new_database(self.url, "bench_workers")[0]

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()


def _prepare(url: str) -> None:
    """Create Optuna's tables before the workers start (workers starting together on an empty
    database race to create them; see tests/search/test_workers.py)."""
    from autotune.search.storage.study import open_storage

    open_storage(url).engine.dispose()


def _study_trials(url: str) -> list[Any]:
    import optuna

    from autotune.search.storage.liveness import is_coordination_study

    storage = optuna.storages.RDBStorage(url)
    try:  # a key's studies: training and -infer (not the workers' and claims' studies)
        names = [s.study_name for s in storage.get_all_studies() if not is_coordination_study(s.study_name)]
        return [t for name in names for t in storage.get_all_trials(storage.get_study_id_from_name(name), deepcopy=False)]
    finally:
        storage.engine.dispose()


def _start_workers(url: str, workers: int, spec_path: Path, args: argparse.Namespace,
                   crash_every: int) -> list[subprocess.Popen]:
    """``workers`` worker processes, released together once every one has imported what it needs."""
    env = {**os.environ, "AUTOTUNE_CLAIM_STALE_SECONDS": str(STALE_SECONDS)}
    procs = []
    barrier = Path(tempfile.mkdtemp(prefix="barrier-", dir=spec_path.parent))
    for index in range(workers):
        cmd = [sys.executable, "-m", "benchmarks.bench_workers", "--worker", "--spec", str(spec_path), "--storage", url,
               "--trials", str(args.trials), "--index", str(index), "--crash-every", str(crash_every),
               "--barrier", str(barrier)]
        if args.distinct_seeds:
            cmd.append("--distinct-seeds")
        procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True, start_new_session=True,
                                      cwd=str(HERE.parent)))
    while len(list(barrier.glob("ready.*"))) < workers and all(p.poll() is None for p in procs):
        time.sleep(0.05)
    (barrier / "go").touch()
    return procs


def _watch(url: str, procs: list[subprocess.Popen], kill_after: int | None) -> tuple[dict[int, str], int | None]:
    """Until every worker has ended: every trial seen finished (number -> state), and the pid SIGKILLed once
    ``kill_after`` trials had finished (None when none was)."""
    from optuna.trial import TrialState

    seen_finished: dict[int, str] = {}
    killed_pid = None
    while any(p.poll() is None for p in procs):
        time.sleep(0.5)
        try:
            trials = _study_trials(url)
        except Exception:  # the study does not exist yet
            continue
        for t in trials:
            if t.state.is_finished():
                seen_finished.setdefault(t.number, t.state.name)
        if kill_after is not None and killed_pid is None and len(seen_finished) >= kill_after:
            # prefer a worker caught inside a trial; else any live one (it is mid-trial most of the time)
            alive = {p.pid: p for p in procs if p.poll() is None}
            owners = [int(t.user_attrs["owner"].rpartition(":")[2]) for t in trials
                      if t.state == TrialState.RUNNING and "owner" in t.user_attrs]
            victims = [pid for pid in owners if pid in alive] or list(alive)
            if victims:
                killed_pid = victims[0]
                os.killpg(killed_pid, signal.SIGKILL)
                alive[killed_pid].wait()
    return seen_finished, killed_pid


def _sweep_stale(url: str) -> list[int]:
    """What the next worker to start does first: fail the dead worker's trials (their numbers)."""
    import optuna

    from autotune.search.storage.liveness import Liveness, is_coordination_study, owner_tag
    from autotune.search.storage.study import open_storage

    stale_failed: list[int] = []
    storage = open_storage(url)
    liveness = Liveness(storage, owner_tag())
    for summary in storage.get_all_studies():  # a key's studies: training and -infer
        if is_coordination_study(summary.study_name):
            continue
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        stale_failed += liveness.fail_stale_trials(storage, study)
    liveness.close()
    storage.engine.dispose()
    return stale_failed


def _figures(trials: list[Any], seen_finished: dict[int, str]) -> dict[str, Any]:
    """The run's figures from the study's trials at the end (``finished`` is checked non-empty first)."""
    from optuna.trial import TrialState

    finished = [t for t in trials if t.state.is_finished()]
    lost = [n for n, state in seen_finished.items() if n >= len(trials) or trials[n].state.name != state]
    seconds = (max(t.datetime_complete for t in finished) - min(t.datetime_start for t in finished)).total_seconds()
    new_points = [t for t in finished if "reused_trial" not in t.user_attrs]
    complete_per_point: dict[str, int] = {}
    for t in new_points:
        if t.state == TrialState.COMPLETE:
            complete_per_point[t.user_attrs["point_id"]] = complete_per_point.get(t.user_attrs["point_id"], 0) + 1
    return {
        "finished_trials": len(finished),
        "new_points": len(new_points),
        "seconds": round(seconds, 2),
        "trials_per_minute": round(60.0 * len(finished) / seconds, 1) if seconds > 0 else None,
        "new_points_per_minute": round(60.0 * len(new_points) / seconds, 1) if seconds > 0 else None,
        "points_evaluated_twice": sum(1 for c in complete_per_point.values() if c > 1),
        "left_running": sum(1 for t in trials if t.state == TrialState.RUNNING),
        "crash_answers": sum(1 for t in trials if t.state == TrialState.FAIL
                             and str(t.user_attrs.get("fail_reason", "")).startswith("killed")),
        "finished_trials_lost": len(lost),
    }


def run(url: str, workers: int, spec_path: Path, args: argparse.Namespace, crash_every: int = 0,
        kill_after: int | None = None) -> dict[str, Any]:
    """Start ``workers`` processes on ``url``; with ``kill_after``, SIGKILL one once the study holds
    that many finished trials. Returns the figures of the run."""
    _prepare(url)
    load = LoadSampler(interval_s=1.0).start()  # runs last seconds: sample often
    procs = _start_workers(url, workers, spec_path, args, crash_every)
    seen_finished, killed_pid = _watch(url, procs, kill_after)
    load_during_run = load.stop()
    errors = [p.stderr.read().strip()[-300:] for p in procs if p.returncode not in (0, -signal.SIGKILL)]
    stale_failed = _sweep_stale(url) if killed_pid is not None else []
    trials = _study_trials(url)
    if not any(t.state.is_finished() for t in trials):
        raise SystemExit(f"no trial finished with {workers} worker(s); their errors: {errors or 'none'}")
    return {"storage": url.split("+")[0].split(":")[0], "workers": workers, "trials_per_worker": args.trials,
            **_figures(trials, seen_finished), "workers_killed": int(killed_pid is not None),
            "stale_trials_failed": len(stale_failed), "worker_errors": errors, "load_during_run": load_during_run}


STORAGE_NAMES = {"postgresql": "PostgreSQL", "sqlite": "SQLite"}


def _rows_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| storage | workers | finished trials | new points | seconds | trials/min | new points/min "
             "| points evaluated twice |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {STORAGE_NAMES.get(r['storage'], r['storage'])} | {r['workers']} | {r['finished_trials']} | "
                     f"{r['new_points']} | {r['seconds']} | {r['trials_per_minute']:.0f} | "
                     f"{r['new_points_per_minute']:.0f} | {r['points_evaluated_twice']} |")
    return "\n".join(lines)


def markdown_table(report: dict[str, Any]) -> str:
    """The markdown table of the undisturbed runs (what BENCHMARKS.md shows)."""
    return _rows_table(report["runs"])


def fault_summary(report: dict[str, Any]) -> str:
    """One line on the fault run, or a note that there was none."""
    fault = report.get("fault_run")
    if not fault:
        return "No fault run in this report."
    return (f"Fault run ({fault['workers']} {STORAGE_NAMES.get(fault['storage'], fault['storage'])} workers, "
            f"{fault['crash_answers']} simulated probe crashes, {fault['workers_killed']} worker SIGKILLed halfway): "
            f"{fault['finished_trials']} finished trials, **{fault['finished_trials_lost']} finished trials lost**, "
            f"{fault['points_evaluated_twice']} points evaluated twice, {fault['left_running']} trials left RUNNING, "
            f"{fault['stale_trials_failed']} stale trials failed by the next worker's sweep, "
            f"{len(fault.get('worker_errors') or [])} surviving worker(s) ending with an error"
            + (f" (last line: `{fault['worker_errors'][0].splitlines()[-1]}`)" if fault.get("worker_errors") else "")
            + ".")


def _parser() -> argparse.ArgumentParser:
    p = parser(__doc__, "workers.json", report_only=False)
    p.add_argument("--trials", type=int, default=40, help="the study's trial budget, shared by its workers (default 40)")
    p.add_argument("--workers", default="1,2,4", help="PostgreSQL worker counts (default 1,2,4)")
    p.add_argument("--postgres", default=None, help="URL of a server to use (default: start a throw-away one)")
    p.add_argument("--distinct-seeds", action="store_true", help="a different TPE seed per worker")
    p.add_argument("--no-faults", action="store_true", help="skip the fault run")
    # worker mode (internal)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--storage", help=argparse.SUPPRESS)
    p.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--crash-every", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--barrier", help=argparse.SUPPRESS)
    return p


def _measure(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any] | None, int]:
    """The runs (PostgreSQL at each worker count, then SQLite), the fault run (or None) and the memory limit."""
    from autotune.search.storage.study import redact_url

    counts = [int(c) for c in args.workers.split(",") if c.strip()]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        root = Path(tmp)
        bundle = make_bundle(root)
        models, limit = fit_models(bundle)
        spec_path = root / "spec.json"
        spec_path.write_text(json.dumps({"bundle": str(bundle), "limit": limit, "models": models}))
        print(f"bundle {bundle.name}, limit {limit} bytes; {args.trials} trials per worker", file=sys.stderr)
        pg = Postgres(args.postgres)
        try:
            print(f"PostgreSQL at {redact_url(pg.url)}", file=sys.stderr)
            for workers in counts:
                rows.append(run(pg.new_database(), workers, spec_path, args))
                print(json.dumps(rows[-1]), file=sys.stderr)
            rows.append(run(f"sqlite:///{root / 'one.db'}", 1, spec_path, args))
            print(json.dumps(rows[-1]), file=sys.stderr)
            fault = None
            if not args.no_faults:
                workers = max(counts)
                fault = run(pg.new_database(), workers, spec_path, args, crash_every=11,
                            kill_after=args.trials // 2)
                print(json.dumps(fault), file=sys.stderr)
        finally:
            pg.close()
    return rows, fault, limit


def main() -> int:
    args = _parser().parse_args()
    if args.worker:
        return worker_main(args)
    rows, fault, limit = _measure(args)
    command = "python -m benchmarks.bench_workers " + " ".join(sys.argv[1:])
    report = {
        "command": command.strip(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "load_average_at_end": os.getloadavg()},
        "setup": {"bundle": "tiny unet (32^3 roi)", "space": SPACE, "strategy": "tpe, fake probes, workers_share",
                  "answers": "estimator's fitted affine models (no compute per trial)", "margin": MARGIN,
                  "memory_limit": limit, "claim_stale_seconds": STALE_SECONDS,
                  "distinct_seeds": bool(args.distinct_seeds)},
        "runs": rows,
        "fault_run": fault,
    }
    out = Path(args.out)
    write_json(out, report)
    print(markdown_table(report))
    print(fault_summary(report))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
