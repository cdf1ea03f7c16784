"""``autotune analyze`` and ``autotune demo-data``: shims over ``autotune.data``."""

from __future__ import annotations

import argparse

from autotune.errors import InputError

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add the data stage's subcommands to the ``autotune`` parser."""
    analyze = sub.add_parser(
        "analyze",
        help="check a dataset and write datastats.yaml (MONAI Auto3DSeg statistics)",
        description=(
            "Load a dataset (input.yaml, datalist .json or Decathlon task folder), check every image and label, "
            "assign folds, and write datalist.json, data_src.yaml and datastats.yaml into the work dir. "
            "Does nothing if datastats.yaml is already up to date."
        ),
    )
    analyze.add_argument("--input", "-i", required=True, metavar="INPUT",
                         help="input.yaml, datalist .json, or a Decathlon task folder with dataset.json")
    analyze.add_argument("--work-dir", "-w", required=True, metavar="DIR", help="folder for the outputs")
    analyze.add_argument("--num-fold", type=int, default=5, metavar="N",
                         help="folds to assign when the datalist has none (default 5)")
    analyze.add_argument("--force", action="store_true", help="analyse again even if datastats.yaml is up to date")
    analyze.add_argument("--quiet", "-q", action="store_true", help="no progress output")
    analyze.set_defaults(func=_run_analyze)

    demo = sub.add_parser(
        "demo-data",
        help="write a small synthetic dataset (Decathlon folder, datalist.json and input.yaml)",
        description="Write a synthetic 3D segmentation dataset of noisy spheres, for demos and tests.",
    )
    demo.add_argument("out", metavar="OUT", help="folder to write the dataset into")
    demo.add_argument("--cases", type=int, default=8, help="number of cases (default 8)")
    demo.add_argument("--size", type=int, default=48, help="edge length in voxels, at least 16 (default 48)")
    demo.add_argument("--classes", type=int, default=2, help="foreground classes (default 2)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument("--modality", default="MRI", help="MRI or CT (default MRI)")
    demo.set_defaults(func=_run_demo_data)


def _run_analyze(args: argparse.Namespace) -> int:
    _at_least("--num-fold", args.num_fold, 1)
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


def _run_demo_data(args: argparse.Namespace) -> int:
    _at_least("--cases", args.cases, 1)
    _at_least("--size", args.size, 16)
    _at_least("--classes", args.classes, 1)
    _at_least("--seed", args.seed, 0)
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


def _at_least(flag: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise InputError(f"{flag} {value}: must be at least {minimum}")
