"""``autotune tune``, ``autotune run`` and ``autotune dashboard``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_tuning_args(p: argparse.ArgumentParser) -> None:
    """Options shared by ``tune`` and ``run``."""
    g = p.add_argument_group("tuning")
    g.add_argument("--device", default="auto",
                   help="where probes run: cpu or cuda:N (default: the first GPU if there is one, else cpu)")
    g.add_argument("--memory-limit", default=None, help="e.g. 8GiB; default the device's total memory")
    g.add_argument("--storage", default=None, help="SQLAlchemy URL of the Optuna storage (default sqlite under studies/)")
    g.add_argument("--strategy", default="fast", help="fast (default), tpe (Auto3DSeg baseline) or estimate (no probes)")
    g.add_argument("--objective", default="max-batch",
                   help="max-batch (default: the largest batch that fits) or throughput (the fastest that fits; a "
                   "smaller batch wins only if its advantage survives a repeated measurement)")
    g.add_argument("--margin", type=float, default=0.10, help="share of the limit kept free (default 0.10)")
    g.add_argument("--specs", default=None, help="YAML of Auto3DSeg gpu_customization_specs")
    g.add_argument("--num-trials", type=int, default=None, help="trial budget of the tpe strategy (default 20)")
    g.add_argument("--range-num-images-per-batch", type=int, nargs=2, metavar=("MIN", "MAX"), default=None,
                   help="range of patches per forward pass to search")
    g.add_argument("--range-num-sw-batch-size", type=int, nargs=2, metavar=("MIN", "MAX"), default=None,
                   help="range of sliding-window batch sizes to search")
    g.add_argument("--validation-devices", default=None, help="comma-separated from device,cpu (default both)")
    g.add_argument("--timeout", type=float, default=300.0, help="seconds before a probe is killed (default 300)")
    g.add_argument("--target-gpu", default=None, help="with --strategy estimate: a catalogue GPU, e.g. a100-80gb")
    g.add_argument("--target-memory", default=None, help="with --strategy estimate: memory of a GPU not in the catalogue")


def specs_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Specs from --specs merged with the command-line ranges (which win, under ``universal``)."""
    from autotune.errors import SpecError
    from autotune.utils import read_yaml

    specs: dict[str, Any] = {}
    if args.specs:
        loaded = read_yaml(args.specs, SpecError)
        if loaded is not None and not isinstance(loaded, dict):
            raise SpecError(f"{args.specs}: specs must be a mapping of 'universal' or algorithm names")
        specs = dict(loaded or {})
    universal = dict(specs.get("universal") or {})
    if args.num_trials is not None:
        universal["num_trials"] = args.num_trials
    if args.range_num_images_per_batch is not None:
        universal["range_num_images_per_batch"] = list(args.range_num_images_per_batch)
    if args.range_num_sw_batch_size is not None:
        universal["range_num_sw_batch_size"] = list(args.range_num_sw_batch_size)
    if args.validation_devices:
        universal["validation_devices"] = [v.strip() for v in args.validation_devices.split(",") if v.strip()]
    if universal:
        specs["universal"] = universal
    return specs


def tune_from_args(
    bundles: list[str], args: argparse.Namespace, summary_path: Path | None, workers_share: bool = False
) -> list[dict[str, Any]]:
    """Run the tuner with the command-line options; prints progress and the table."""
    from autotune.search.report import format_results
    from autotune.search.targets import resolve_target
    from autotune.search.tune import tune_bundles

    target = resolve_target(args.strategy, args.target_gpu, args.target_memory, args.device)
    results = tune_bundles(
        bundles,
        specs_from_args(args),
        device=args.device,
        memory_limit=args.memory_limit,
        storage=args.storage,
        strategy=args.strategy,
        objective=args.objective,
        margin=args.margin,
        timeout=args.timeout,
        target=target,
        summary_path=summary_path,
        workers_share=workers_share,
        progress=None if getattr(args, "quiet", False) else lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(format_results(results))
    if summary_path:
        print(f"summary: {summary_path}")
    return results


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``tune``, ``run`` and ``dashboard``."""
    p = sub.add_parser(
        "tune",
        help="tune bundles' patches per iteration, sw batch size and validation device",
        description="Find, for each bundle, the largest patches per iteration and sliding-window batch size that fit "
        "the memory limit (less a margin) (or, with --objective throughput, run fastest); write them back with provenance. Folds share one search.",
    )
    p.add_argument("bundles", nargs="+", help="bundle folders made by 'autotune generate'")
    add_tuning_args(p)
    p.add_argument("--summary", default=None, help="write the JSON summary here")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=run_tune)

    r = sub.add_parser(
        "run",
        help="analyse, generate, tune (and with --train, train) in one go",
        description="The whole job: analyse INPUT, generate bundles for --algos, tune them, write WORK_DIR/"
        "autotune_summary.json; with --train, train the tuned bundles. Rerunning resumes from the storage.",
    )
    from autotune.commands.bundles import add_generate_args

    add_generate_args(r)
    add_tuning_args(r)
    t = r.add_argument_group("training (with --train)")
    t.add_argument("--train", action="store_true", help="train the tuned bundles afterwards")
    t.add_argument("--epochs", type=int, default=None, help="epochs per bundle (default the config's)")
    t.add_argument("--max-time", default=None, help="time budget per bundle, e.g. 30m")
    t.add_argument("--folds", default=None, help="comma-separated folds to train (default all generated)")
    r.add_argument("--quiet", action="store_true", help="no progress lines")
    r.set_defaults(func=run_run)

    w = sub.add_parser(
        "worker",
        help="take tuning work from a shared storage (many GPUs or nodes)",
        description="Tune the bundles in WORK_DIR together with other workers on the same storage (use "
        "PostgreSQL for several processes). Each tuning key is searched by one worker at a time; TPE studies are "
        "shared point by point; a worker that dies is taken over once its heartbeat is stale.",
    )
    w.add_argument("--work-dir", required=True, help="the work folder holding <algo>_<fold>/ bundles")
    w.add_argument("--algos", default=None, help="only bundles of these algorithms (comma-separated)")
    add_tuning_args(w)
    w.add_argument("--quiet", action="store_true", help="no progress lines")
    w.set_defaults(func=run_worker)

    v = sub.add_parser(
        "verify",
        help="check a tuned or planned bundle on the real device; retune if the plan fails",
        description="Probe at the bundle's tuned values and one patch above, compare the estimate with the "
        "measured peak, and set the provenance to 'measured' when the plan holds (else retune with 'fast').",
    )
    v.add_argument("bundle", help="a tuned bundle folder")
    v.add_argument("--device", default="auto", help="cpu or cuda:N (default: the first GPU if there is one, else cpu)")
    v.add_argument("--memory-limit", default=None, help="default: the limit the bundle was tuned for")
    v.add_argument("--storage", default=None, help="storage for a retune (default sqlite under studies/)")
    v.add_argument("--timeout", type=float, default=300.0, help="seconds before a probe is killed")
    v.add_argument("--no-retune", action="store_true", help="only report; do not retune when the plan fails")
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    v.set_defaults(func=run_verify)

    d = sub.add_parser(
        "dashboard",
        help="serve optuna-dashboard on the tuning storage",
        description="Start optuna-dashboard on the same storage the tuner writes (default the SQLite file under "
        "studies/); bound to 127.0.0.1 unless --host says otherwise.",
    )
    d.add_argument("--storage", default=None, help="SQLAlchemy URL (default sqlite under studies/)")
    d.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    d.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    d.set_defaults(func=run_dashboard)


def run_tune(args: argparse.Namespace) -> int:
    """Handler of ``autotune tune``."""
    from autotune.device import resolve_device

    args.device = resolve_device(args.device)
    results = tune_from_args(list(args.bundles), args, Path(args.summary) if args.summary else None)
    return 0 if all(r.get("status") in ("tuned", "unsupported") for r in results) else 1


def run_run(args: argparse.Namespace) -> int:
    """Handler of ``autotune run``."""
    from autotune.commands.bundles import generate_bundles
    from autotune.device import resolve_device
    from autotune.errors import SpecError

    args.device = resolve_device(args.device)

    work = Path(args.work_dir)
    say = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    folds = None
    if args.folds:
        try:
            folds = {int(f) for f in args.folds.split(",") if f.strip()}
        except ValueError as exc:
            raise SpecError(f"--folds must be comma-separated integers, got {args.folds!r}") from exc
    say(f"[1/3] analysing {args.input}")
    bundles = generate_bundles(args)
    say(f"[2/3] generated {len(bundles)} bundles in {work.resolve()}; tuning")
    results = tune_from_args([b["path"] for b in bundles], args, work / "autotune_summary.json")
    ok = all(r.get("status") in ("tuned", "unsupported") for r in results)
    if args.train:
        from autotune.train.runner import parse_duration, train

        max_time = parse_duration(args.max_time) if args.max_time else None
        say("[3/3] training the tuned bundles")
        for b in bundles:
            if folds is not None and b["fold"] not in folds:
                continue
            summary = train(b["path"], device=args.device, epochs=args.epochs, max_time=max_time)
            say(f"  {b['identifier']}: best mean Dice {summary.get('best_metric')}")
    return 0 if ok else 1


def find_bundles(work_dir: str, algos: str | None = None) -> list[str]:
    """Bundle folders under ``work_dir`` (those holding configs/hyper_parameters.yaml), sorted."""
    from autotune.bundles.bundlegen import parse_algos
    from autotune.bundles.templates import list_templates
    from autotune.errors import ConfigError

    root = Path(work_dir)
    if not root.is_dir():
        raise ConfigError(f"{root}: work folder not found; run 'autotune generate' first")
    bundles = sorted(str(p.parent.parent) for p in root.glob("*/configs/hyper_parameters.yaml"))
    if algos:
        wanted = set(parse_algos(algos, list_templates()))
        bundles = [b for b in bundles if Path(b).name.rsplit("_", 1)[0] in wanted]
    if not bundles:
        raise ConfigError(f"{root}: no bundles found; run 'autotune generate --work-dir {root}' first")
    return bundles


def run_worker(args: argparse.Namespace) -> int:
    """Handler of ``autotune worker``."""
    from autotune.device import resolve_device

    args.device = resolve_device(args.device)
    results = tune_from_args(find_bundles(args.work_dir, args.algos), args, None, workers_share=True)
    return 0 if all(r.get("status") in ("tuned", "unsupported") for r in results) else 1


def run_verify(args: argparse.Namespace) -> int:
    """Handler of ``autotune verify``: 0 when the plan holds (or was retuned), 1 otherwise."""
    import json

    from autotune.device import resolve_device
    from autotune.search.verify import verify_bundle

    args.device = resolve_device(args.device)

    report = verify_bundle(
        args.bundle, device=args.device, memory_limit=args.memory_limit, storage=args.storage,
        timeout=args.timeout, retune=not args.no_retune,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
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


def run_dashboard(args: argparse.Namespace) -> int:
    """Handler of ``autotune dashboard``."""
    from autotune.errors import AutotuneError
    from autotune.search.study import default_storage_url, open_storage, redact_url

    try:
        import optuna_dashboard
    except ModuleNotFoundError as exc:
        raise AutotuneError("optuna-dashboard is not installed; pip install 'autotune[dashboard]'") from exc
    url = args.storage or default_storage_url()
    storage = open_storage(url, heartbeat=False)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: --host {args.host} serves the dashboard beyond this machine with no login: anyone who "
              "reaches it can read and delete studies (optuna-dashboard's write API); prefer 127.0.0.1 and an "
              "SSH tunnel", file=sys.stderr, flush=True)
    print(f"optuna-dashboard on {redact_url(url)}: http://{args.host}:{args.port}/dashboard/", flush=True)
    optuna_dashboard.run_server(storage, host=args.host, port=args.port)
    return 0
