"""``autotune analyze`` and ``autotune demo-data``: shims over ``autotune.data``."""

from __future__ import annotations

import argparse

from autotune.commands import add_command, at_least
from autotune.errors import InputError

__all__ = ["register"]


def _analyze_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", "-i", required=True, metavar="INPUT",
                   help="input.yaml, datalist .json, or a Decathlon task folder with dataset.json")
    p.add_argument("--work-dir", "-w", required=True, metavar="DIR", help="folder for the outputs")
    p.add_argument("--num-fold", type=int, default=5, metavar="N",
                   help="folds to assign when the datalist has none (default 5)")
    p.add_argument("--force", action="store_true", help="analyse again even if datastats.yaml is up to date")


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", metavar="OUT", help="folder to write the dataset into")
    for flag, default, what in (("--cases", 8, "number of cases"), ("--size", 48, "edge length in voxels, at least 16"),
                                ("--classes", 2, "foreground classes"), ("--seed", 0, "random seed")):
        p.add_argument(flag, type=int, default=default, help=f"{what} (default {default})")
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
    at_least("--num-fold", args.num_fold, 1)
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
    for flag, value, minimum in (("--cases", args.cases, 1), ("--size", args.size, 16),
                                 ("--classes", args.classes, 1), ("--seed", args.seed, 0)):
        at_least(flag, value, minimum)
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
