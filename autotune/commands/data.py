"""``autotune analyze`` and ``autotune demo-data``: shims over ``autotune.data``."""

from __future__ import annotations

import argparse

from autotune.checks import options as types
from autotune.commands import add_command
from autotune.errors import InputError

__all__ = ["register", "MAX_FOLDS"]

MAX_FOLDS = 100  # more folds than this is a typo


def _analyze_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", "-i", required=True, metavar="INPUT", type=types.path_text,
                   help="input.yaml, datalist .json, or a Decathlon task folder with dataset.json")
    p.add_argument("--work-dir", "-w", required=True, metavar="DIR", type=types.path_text, help="folder for the outputs")
    p.add_argument("--num-fold", type=types.positive_int(MAX_FOLDS), default=5, metavar="N",
                   help="folds to assign when the datalist has none (default 5)")
    p.add_argument("--force", action="store_true", help="analyse again even if datastats.yaml is up to date")


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", metavar="OUT", type=types.path_text, help="folder to write the dataset into")
    for flag, default, what, kind in (
            ("--cases", 8, "number of cases, 1 to 10000", types.count(1, 10_000)),
            ("--size", 48, "edge length in voxels, 16 to 512", types.count(16, 512)),
            ("--classes", 2, "foreground classes, 1 to 254", types.count(1, 254)),
            ("--seed", 0, "random seed, 0 to 4294967295", types.count(0, 2**32 - 1))):
        p.add_argument(flag, type=kind, default=default, help=f"{what} (default {default})")
    p.add_argument("--modality", default="MRI", help="MRI or CT (default MRI)")


def register(sub: argparse._SubParsersAction) -> None:
    """Add the data stage's subcommands to the ``autotune`` parser."""
    add_command(sub, "analyze", analyze_command, _analyze_args, quiet="no progress output")
    add_command(sub, "demo-data", demo_data_command, _demo_args)


def analyze_command(args: argparse.Namespace) -> int:
    """Check a dataset and write datastats.yaml (MONAI Auto3DSeg statistics).

    Load a dataset (input.yaml, datalist .json or Decathlon task folder), check every image and label,
    assign folds, and write datalist.json, data_src.yaml and datastats.yaml into the work dir. Does
    nothing if datastats.yaml is already up to date.
    """
    from autotune.data.analyze import analyze

    result = analyze(args.input, args.work_dir, num_fold=args.num_fold, force=args.force, progress=not args.quiet)
    state = "up to date" if result.skipped else "written"
    print(f"datastats: {result.datastats} ({state})")
    print(f"datalist:  {result.datalist}")
    print(f"data_src:  {result.data_src}")
    print(f"cases:     {result.n_cases}")
    print(f"hash:      {result.content_hash}")
    print(f"warnings:  {len(result.warnings)}")
    return 0


def demo_data_command(args: argparse.Namespace) -> int:
    """Write a small synthetic dataset (Decathlon folder, datalist.json and input.yaml).

    Write a synthetic 3D segmentation dataset of noisy spheres, for demos and tests.
    """
    from autotune.data.datalist import MODALITIES, normalise_modality
    from autotune.data.synthetic import make_demo_dataset

    try:
        normalise_modality(args.modality, "--modality")
    except InputError:
        raise InputError(f"--modality {args.modality!r}: unknown; use one of {', '.join(MODALITIES)}") from None

    out = make_demo_dataset(args.out, cases=args.cases, size=args.size, classes=args.classes, seed=args.seed,
                            modality=args.modality)
    print(out / "input.yaml")
    return 0
