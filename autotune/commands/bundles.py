"""``autotune generate``: a shim over ``autotune.pipeline.generate``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from autotune.checks import options as types
from autotune.commands import add_command
from autotune.commands.data import MAX_FOLDS

__all__ = ["register", "add_generate_args", "generation_options"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``generate`` subcommand."""
    add_command(sub, "generate", generate_command, add_generate_args, quiet="no progress output")


def add_generate_args(p: argparse.ArgumentParser) -> None:
    """The input and generation options shared by ``generate`` and ``run``."""
    p.add_argument("--input", required=True, type=types.path_text, help="input.yaml, a datalist .json, or a Decathlon task folder")
    p.add_argument("--work-dir", required=True, type=types.path_text, help="where datastats.yaml, the bundles (and the summary) go")
    p.add_argument("--algos", default=None, help="comma-separated: segresnet,dints,unet (default: all)")
    p.add_argument("--num-fold", type=types.positive_int(MAX_FOLDS), default=5, help="folds to generate bundles for (default 5)")
    p.add_argument("--templates", default=None, type=types.existing_path("folder"), help="folder of <algo>/template.yaml (default: the shipped ones)")
    p.add_argument(
        "--overrides",
        default=None,
        type=types.path_text,
        help="a preset name (tiny) or a YAML of values merged into every config; a top-level algorithm name "
        "scopes values to it",
    )


def generation_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``autotune.generate`` (and ``run``) from the options ``add_generate_args`` adds."""
    return {"algos": args.algos, "num_fold": args.num_fold, "templates": args.templates, "overrides": args.overrides}


def generate_command(args: argparse.Namespace) -> int:
    """Write training bundles <algo>_<fold>/ filled from the data stats.

    Analyse INPUT into WORK_DIR/datastats.yaml (skipped when unchanged), then write
    WORK_DIR/<algo>_<fold>/configs/hyper_parameters.yaml and bundle.json for every algorithm and fold.
    """
    from autotune.bundles.config import load_bundle_config
    from autotune.pipeline import generate

    bundles = generate(args.input, args.work_dir, progress=not args.quiet, **generation_options(args))
    if not args.quiet:
        print(f"{'bundle':<14} {'network':<10} {'roi_size':<16} {'spacing':<20} {'in':>3} {'out':>4}")
        for b in bundles:
            config = load_bundle_config(b["path"])
            spacing = "x".join(f"{v:g}" for v in config.resample_resolution)
            roi = "x".join(str(v) for v in config.roi_size)
            print(
                f"{b['identifier']:<14} {config.network.name:<10} {roi:<16} {spacing:<20} "
                f"{config.input_channels:>3} {config.output_classes:>4}"
            )
        print(f"{len(bundles)} bundles in {Path(args.work_dir).resolve()}")
    return 0
