"""``autotune generate``: analyse the data (when needed) and write one bundle per algorithm and fold."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``generate`` subcommand."""
    p = sub.add_parser(
        "generate",
        help="write training bundles <algo>_<fold>/ filled from the data stats",
        description=(
            "Analyse INPUT into WORK_DIR/datastats.yaml (skipped when unchanged), then write "
            "WORK_DIR/<algo>_<fold>/configs/hyper_parameters.yaml and bundle.json for every algorithm and fold."
        ),
    )
    add_generate_args(p)
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=run_generate)


def add_generate_args(p: argparse.ArgumentParser) -> None:
    """The input and generation options shared by ``generate`` and ``run``."""
    p.add_argument("--input", required=True, help="input.yaml, a datalist .json, or a Decathlon task folder")
    p.add_argument("--work-dir", required=True, help="where datastats.yaml, the bundles (and the summary) go")
    p.add_argument("--algos", default=None, help="comma-separated: segresnet,dints,unet (default: all)")
    p.add_argument("--num-fold", type=int, default=5, help="folds to generate bundles for (default 5)")
    p.add_argument("--templates", default=None, help="folder of <algo>/template.yaml (default: the shipped ones)")
    p.add_argument(
        "--overrides",
        default=None,
        help="a preset name (tiny) or a YAML of values merged into every config; a top-level algorithm name "
        "scopes values to it",
    )


def load_overrides(path: str | None) -> dict:
    """Read ``--overrides`` (a preset name or a YAML of plain data) or return {}."""
    from autotune.bundles.templates import load_overrides as load

    return load(path)


def generate_bundles(args: argparse.Namespace) -> list[dict]:
    """Analyse then generate, as ``generate`` and ``run`` both do; returns the bundles."""
    from autotune.bundles.bundlegen import BundleGen
    from autotune.data.analyze import analyze
    from autotune.errors import SpecError

    if args.num_fold < 1:
        raise SpecError(f"--num-fold must be at least 1, got {args.num_fold}")
    work = Path(args.work_dir)
    overrides = load_overrides(getattr(args, "overrides", None))
    result = analyze(args.input, work, num_fold=max(args.num_fold, 1), progress=not args.quiet)
    gen = BundleGen(
        work,
        algos=args.algos,
        templates_path=getattr(args, "templates", None),
        data_stats_filename=result.datastats,
        data_src_cfg_name=result.data_src,
    )
    return gen.generate(work, num_fold=args.num_fold, overrides=overrides)


def run_generate(args: argparse.Namespace) -> int:
    """Handler of ``autotune generate``."""
    from autotune.bundles.config import load_bundle_config

    bundles = generate_bundles(args)
    if not args.quiet:
        print(f"{'bundle':<14} {'network':<10} {'roi_size':<16} {'spacing':<20} {'in':>3} {'out':>4}")
        for b in bundles:
            cfg = load_bundle_config(b["path"])
            spacing = "x".join(f"{v:g}" for v in cfg["resample_resolution"])
            roi = "x".join(str(v) for v in cfg["roi_size"])
            print(
                f"{b['identifier']:<14} {cfg['network']['name']:<10} {roi:<16} {spacing:<20} "
                f"{cfg['input_channels']:>3} {cfg['output_classes']:>4}"
            )
        print(f"{len(bundles)} bundles in {Path(args.work_dir).resolve()}")
    return 0
