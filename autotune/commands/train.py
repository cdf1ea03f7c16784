"""``autotune train`` and ``autotune infer``: shims over ``autotune.train``.

Nothing heavy is imported here; the handlers import torch and MONAI when they run.
"""

from __future__ import annotations

import argparse
import os

from autotune.errors import SpecError

__all__ = ["register", "add_train_arguments", "run_train", "run_infer"]


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``autotune train`` (shared with ``python -m autotune.train``)."""
    parser.add_argument("bundle", metavar="BUNDLE", help="a bundle folder made by 'autotune generate'")
    parser.add_argument("--device", default="auto",
                        help="cpu, cuda or cuda:N (default: the first GPU if there is one, else cpu)")
    parser.add_argument("--epochs", type=int, default=None, metavar="N",
                        help="train to epoch N (default: num_epochs of the bundle)")
    parser.add_argument("--max-time", default=None, metavar="DURATION",
                        help="stop at the first epoch end after this long, e.g. 90s, 30m, 2h")
    parser.add_argument("--val-every", type=int, default=None, metavar="K",
                        help="validate every K epochs (default: num_epochs_per_validation)")
    parser.add_argument("--resume", action="store_true", help="continue from model_fold<k>/last.pt")
    parser.add_argument("--mode", choices=("fast", "regular"), default="fast",
                        help="fast: cache, thread loader, AMP, template recipe; regular: the seed's baseline")
    parser.add_argument("--nproc", type=int, default=1, metavar="N",
                        help="processes for DistributedDataParallel (gloo on CPU, NCCL on CUDA)")
    parser.add_argument("--memory-limit", default=None, metavar="SIZE",
                        help="cap the CUDA caching allocator at SIZE (e.g. 16GiB), as the tuner's probes were; "
                             "peaks per epoch go to metrics.csv either way")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bars or epoch lines")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``train`` and ``infer`` to the ``autotune`` parser."""
    train = sub.add_parser(
        "train",
        help="train a bundle fast (cache, thread loader, AMP) or as the regular baseline; DDP with --nproc",
        description=(
            "Train BUNDLE on its fold: checkpoints (best.pt, last.pt), metrics.csv/json and curves.png go to "
            "BUNDLE/model_fold<k>/. Ctrl-C or a kill loses at most one epoch: add --resume to continue."
        ),
    )
    add_train_arguments(train)
    train.set_defaults(func=run_train)

    infer = sub.add_parser(
        "infer",
        help="predict label maps with a trained bundle, written in each input's own geometry",
        description="Sliding-window prediction with the bundle's tuned settings; writes OUTPUT/<name>_seg.nii.gz.",
    )
    infer.add_argument("bundle", metavar="BUNDLE", help="a trained bundle folder")
    infer.add_argument("--images", nargs="+", required=True, metavar="FILE",
                       help="image files, or one datalist .json (its testing cases, else its training images)")
    infer.add_argument("--output", required=True, metavar="DIR", help="folder for the predictions")
    infer.add_argument("--device", default="auto", help="cpu, cuda or cuda:N (default: GPU if any, else cpu)")
    infer.add_argument("--checkpoint", default="best", help="best, last or a checkpoint path (default best)")
    infer.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    infer.set_defaults(func=run_infer)


def _device(name: str) -> str:
    if name != "auto":
        return name
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def run_train(args: argparse.Namespace) -> int:
    """Handler of ``autotune train``."""
    from autotune.train.runner import parse_duration, train

    max_time = parse_duration(args.max_time) if args.max_time is not None else None
    if args.epochs is not None and args.epochs < 1:
        raise SpecError(f"--epochs must be at least 1, got {args.epochs}")
    summary = train(args.bundle, device=_device(args.device), epochs=args.epochs, max_time=max_time,
                    val_every=args.val_every, resume=args.resume, mode=args.mode, nproc=args.nproc,
                    progress=not args.quiet, memory_limit=args.memory_limit)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0  # under torchrun only rank 0 reports
    best = summary.get("best_metric")
    print(f"best mean Dice {best:.4f} at epoch {summary['best_epoch']}" if best is not None else "not validated",
          f"| {summary['epochs_run']} epochs ({summary['stopped']}) | {summary['model_dir']}")
    return 0


def run_infer(args: argparse.Namespace) -> int:
    """Handler of ``autotune infer``."""
    from autotune.train.infer import infer

    paths = infer(args.bundle, args.images, args.output, device=_device(args.device),
                  checkpoint=args.checkpoint, progress=not args.quiet)
    for path in paths:
        print(path)
    return 0
