"""``autotune tune``, ``run``, ``worker``, ``verify`` and ``dashboard``: shims over ``autotune.pipeline``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from autotune.checks import options as types
from autotune.commands import add_command, add_precision_arg, progress_printer
from autotune.commands.bundles import add_generate_args, generation_options
from autotune.commands.data import MAX_FOLDS
from autotune.search.driver.options import TuningOptions, add_option_args
from autotune.tunables import TUNABLES

__all__ = ["register", "add_tuning_args", "specs_from_args", "tuning_options", "MAX_BATCH", "MAX_EPOCHS"]

MAX_BATCH = 65_536  # patches or windows per pass; beyond any device
MAX_EPOCHS = 1_000_000


def add_tuning_args(p: argparse.ArgumentParser) -> None:
    """Options shared by ``tune``, ``run`` and ``worker``: the tuning options (``TuningOptions``: flag, default,
    checker and help declared there) and the search space (``--specs`` and the ranges, under ``universal``)."""
    g = p.add_argument_group("tuning")
    add_option_args(g, ("device", "memory_limit", "storage", "strategy", "objective", "handoff", "margin"))
    g.add_argument("--specs", default=None, type=types.path_text, help="YAML of Auto3DSeg gpu_customization_specs")
    g.add_argument("--num-trials", type=types.positive_int(10_000), default=None, help="trial budget of the tpe strategy (default 20)")
    for t in TUNABLES:  # each tunable's range (its choices), from its definition (autotune.tunables)
        if t.kind == "choice":
            g.add_argument(t.spec_flag, default=None, type=types.names(t.choices, t.name.replace("_", " ")),
                           help=t.spec_flag_help)
        else:
            g.add_argument(t.spec_flag, type=types.positive_int(MAX_BATCH), nargs=2, metavar=("MIN", "MAX"),
                           default=None, help=t.spec_flag_help)
    add_option_args(g, ("timeout", "target_gpu", "target_memory"))
    add_precision_arg(g)  # every command's (through AUTOTUNE_PRECISION), not a tuning option here


def specs_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Specs from --specs merged with the command-line ranges (which win, under ``universal``)."""
    from autotune.stages import load_specs

    specs = load_specs(args.specs)
    universal = dict(specs.get("universal") or {})
    if args.num_trials is not None:
        universal["num_trials"] = args.num_trials
    for t in TUNABLES:
        given = getattr(args, t.spec_names[-1])
        if given and t.kind == "choice":
            universal[t.spec_names[-1]] = [v.strip() for v in given.split(",") if v.strip()]
        elif given is not None and t.kind != "choice":
            universal[t.spec_names[-1]] = list(given)
    if universal:
        specs["universal"] = universal
    return specs


def tuning_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``autotune.tune`` (and ``run``) from the options ``add_tuning_args`` adds."""
    given = {name: getattr(args, name) for name in TuningOptions.cli_names()}
    return {"specs": specs_from_args(args), "progress": progress_printer(args), **given}


def _training_args(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("training (with --train)")
    t.add_argument("--train", action="store_true", help="train the tuned bundles afterwards")
    t.add_argument("--epochs", type=types.positive_int(MAX_EPOCHS), default=None,
                   help="epochs per bundle (default the config's)")
    t.add_argument("--max-time", default=None, type=types.duration, help="time budget per bundle, e.g. 30m")
    t.add_argument("--folds", default=None, type=types.int_list(0, MAX_FOLDS - 1),
                   help="comma-separated folds to train (default all generated)")


def _tune_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundles", nargs="+", type=types.path_text, help="bundle folders made by 'autotune generate'")
    add_tuning_args(p)
    p.add_argument("--summary", default=None, type=types.path_text, help="write the JSON summary here")


def _worker_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--work-dir", required=True, type=types.path_text, help="the work folder holding <algo>_<fold>/ bundles")
    p.add_argument("--algos", default=None, help="only bundles of these algorithms (comma-separated)")
    add_tuning_args(p)


def _verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", type=types.path_text, help="a tuned bundle folder")
    p.add_argument("--device", default=TuningOptions.device, type=types.device, help="cpu or cuda:N (default: the first GPU if there is one, else cpu)")
    add_precision_arg(p)
    p.add_argument("--memory-limit", default=None, type=types.size, help="default: the limit the bundle was tuned for")
    p.add_argument("--storage", default=TuningOptions.storage, type=types.storage,
                   help="storage for a retune (default sqlite under studies/)")
    p.add_argument("--timeout", type=types.seconds(), default=TuningOptions.timeout, help="seconds before a probe is killed")
    p.add_argument("--no-retune", action="store_true", help="only report; do not retune when the plan fails")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _dashboard_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage", default=None, type=types.storage,
                   help="SQLAlchemy URL, grpc://HOST:PORT or journal:///PATH (default sqlite under studies/)")
    p.add_argument("--host", default="127.0.0.1", type=types.host, help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=types.port, default=8080, help="port, 1 to 65535 (default 8080)")


def _proxy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage", required=True, type=types.storage,
                   help="the database's SQLAlchemy URL, e.g. postgresql+psycopg://autotune@localhost/autotune")
    p.add_argument("--host", default="127.0.0.1", type=types.host,
                   help="address to bind (default 127.0.0.1; 0.0.0.0 for workers on other nodes)")
    p.add_argument("--port", type=types.port, default=13000, help="port, 1 to 65535 (default 13000)")
    p.add_argument("--threads", type=types.positive_int(1024), default=16,
                   help="requests served at once, and the most database connections held (default 16)")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``tune``, ``run``, ``worker``, ``proxy``, ``verify`` and ``dashboard``."""
    add_command(sub, "tune", tune_command, _tune_args, quiet="no progress lines")
    add_command(sub, "run", run_command, add_generate_args, add_tuning_args, _training_args, quiet="no progress lines")
    add_command(sub, "worker", worker_command, _worker_args, quiet="no progress lines")
    add_command(sub, "proxy", proxy_command, _proxy_args)
    add_command(sub, "verify", verify_command, _verify_args)
    add_command(sub, "dashboard", dashboard_command, _dashboard_args)


def _report(results: Sequence[dict[str, Any]], summary_path: object | None = None) -> int:
    """Print the results table (and where the summary is); 0 when every bundle was tuned (or unsupported)."""
    from autotune.search.driver.report import format_results

    print(format_results(results))
    if summary_path:
        print(f"summary: {summary_path}")
    return 0 if all(r.get("status") in ("tuned", "unsupported") for r in results) else 1


def tune_command(args: argparse.Namespace) -> int:
    """Tune bundles' patches per iteration, sw batch size and validation device.

    Find, for each bundle, the largest patches per iteration and sliding-window batch size that fit the
    memory limit (less a margin) (or, with --objective throughput, run fastest); write them back with
    provenance. Folds share one search.
    """
    from autotune.stages import tune

    return _report(tune(args.bundles, summary_path=args.summary, **tuning_options(args)), args.summary)


def run_command(args: argparse.Namespace) -> int:
    """Analyse, generate, tune (and with --train, train) in one go.

    The whole job: analyse INPUT, generate bundles for --algos, tune them, write
    WORK_DIR/autotune_summary.json; with --train, train the tuned bundles. Rerunning resumes from the
    storage.
    """
    from autotune.pipeline import run

    folds = set(args.folds) if args.folds else None
    codes: list[int] = []  # the table is printed when tuning ends, before any training
    run(args.input, args.work_dir, train=args.train, epochs=args.epochs, max_time=args.max_time, folds=folds,
        on_tuned=lambda records, summary: codes.append(_report(records, summary)),
        **generation_options(args), **tuning_options(args))
    return codes[0]


def worker_command(args: argparse.Namespace) -> int:
    """Take tuning work from a shared storage (many GPUs or nodes).

    Tune the bundles in WORK_DIR together with other workers on the same storage (use PostgreSQL for
    several processes). Each tuning key is searched by one worker at a time; TPE studies are shared point
    by point; a worker that dies is taken over once its heartbeat is stale.
    """
    from autotune.stages import tune_worker

    return _report(tune_worker(args.work_dir, args.algos, **tuning_options(args)))


def proxy_command(args: argparse.Namespace) -> int:
    """Serve a database to many workers through Optuna's gRPC storage proxy.

    Run next to the database: one process holds the database connections (at most --threads) and workers on
    any node reach it with --storage grpc://HOST:PORT, however many they are. Runs until stopped (SIGTERM,
    Ctrl-C). No login: bind it to an address only the cluster reaches.
    """
    from autotune.errors import StorageError
    from autotune.search.storage.backends import serve_proxy, storage_kind
    from autotune.search.storage.legacy import refuse_live_legacy_workers
    from autotune.search.storage.liveness import stale_after_default
    from autotune.search.storage.study import open_storage, redact_url

    if storage_kind(args.storage) != "sql":
        raise StorageError(f"--storage {redact_url(args.storage)}: the proxy serves a database; give its "
                           "SQLAlchemy URL, e.g. postgresql+psycopg://autotune@localhost/autotune")
    storage = open_storage(args.storage, pool=args.threads)
    refuse_live_legacy_workers(storage, redact_url(args.storage), stale_after_default())
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: --host {args.host}: the proxy has no login; anyone who reaches this port can read and "
              "write every study: keep it on the cluster's private network", file=sys.stderr, flush=True)
    import socket

    reach = socket.gethostname() if args.host in ("0.0.0.0", "::") else args.host
    print(f"storage proxy for {redact_url(args.storage)} on {args.host}:{args.port} ({args.threads} threads); "
          f"workers: --storage grpc://{reach}:{args.port}", flush=True)
    serve_proxy(storage, args.host, args.port, args.threads)
    return 0


def verify_command(args: argparse.Namespace) -> int:
    """Check a tuned or planned bundle on the real device; retune if the plan fails.

    Probe at the bundle's tuned values and one patch above, compare the estimate with the measured peak,
    and set the provenance to 'measured' when the plan holds (else retune with 'fast'). Exit code 0 when
    the plan holds (or was retuned), 1 otherwise.
    """
    import json

    from autotune.stages import verify

    report = verify(args.bundle, device=args.device, memory_limit=args.memory_limit, storage=args.storage,
                    timeout=args.timeout, retune=not args.no_retune, progress=progress_printer(args))
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        err = report.get("estimate_error")
        print(f"{args.bundle}: plan {'holds' if report['holds'] else 'does not hold'}; estimate error "
              f"{'-' if err is None else f'{100 * err:.2f}%'}")
    if report["holds"]:
        return 0
    retuned = report.get("retuned")
    return 0 if retuned and retuned.get("status") == "tuned" else 1


def dashboard_command(args: argparse.Namespace) -> int:
    """Serve optuna-dashboard on the tuning storage.

    Start optuna-dashboard on the same storage the tuner writes (default the SQLite file under studies/);
    bound to 127.0.0.1 unless --host says otherwise.
    """
    from autotune.errors import AutotuneError
    from autotune.search.storage.study import check_storage, default_storage_url, open_storage, redact_url

    try:
        import optuna_dashboard
    except ModuleNotFoundError as exc:
        raise AutotuneError("optuna-dashboard is not installed; pip install 'autotune[dashboard]'") from exc
    url = args.storage or default_storage_url()
    check_storage(url, must_exist=True)  # a reader: it creates no database where none was tuned
    storage = open_storage(url)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: --host {args.host} serves the dashboard beyond this machine with no login: anyone who "
              "reaches it can read and delete studies (optuna-dashboard's write API); prefer 127.0.0.1 and an "
              "SSH tunnel", file=sys.stderr, flush=True)
    print(f"optuna-dashboard on {redact_url(url)}: http://{args.host}:{args.port}/dashboard/", flush=True)
    try:
        optuna_dashboard.run_server(storage, host=args.host, port=args.port)
    except OSError as exc:  # the address is taken, or not this machine's, or the port needs privileges
        raise AutotuneError(f"--host {args.host} --port {args.port}: cannot listen there ({exc.strerror or exc}); "
                            "choose another port, or a host address of this machine") from exc
    return 0
