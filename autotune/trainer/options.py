"""The options of ``autotune train``, shared with ``python -m autotune.trainer`` (torchrun's entry).

They live in the training package, not in ``autotune.commands``, so that each DDP rank
started by torchrun imports the trainer and nothing of the CLI.
"""

from __future__ import annotations

import argparse
import os

from autotune.checks import options as types

__all__ = ["add_train_arguments", "train_from_args"]


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``autotune train`` to ``parser``."""
    parser.add_argument("bundle", metavar="BUNDLE", type=types.path_text, help="a bundle folder made by 'autotune generate'")
    parser.add_argument("--device", default="auto", type=types.device,
                        help="cpu, cuda or cuda:N (default: the first GPU if there is one, else cpu)")
    parser.add_argument("--epochs", type=types.positive_int(), default=None, metavar="N",
                        help="train to epoch N; sets the schedule's length (default: num_epochs of the bundle, "
                             "or --max-time when only that is given)")
    parser.add_argument("--max-time", default=None, metavar="DURATION", type=types.duration,
                        help="time budget, e.g. 90s, 30m, 2h: without --epochs the schedule (warm-up, decay, "
                             "validation cadence) is fitted to it and the run ends inside it; with --epochs "
                             "the run stops at the first epoch end after it")
    parser.add_argument("--val-every", type=types.positive_int(), default=None, metavar="K",
                        help="validate every K epochs (default: num_epochs_per_validation)")
    parser.add_argument("--resume", action="store_true", help="continue from model_fold<k>/last.pt")
    parser.add_argument("--mode", choices=("fast", "regular"), default="fast",
                        help="fast: cache, thread loader, AMP, template recipe; regular: the seed's baseline")
    parser.add_argument("--nproc", type=types.positive_int(1024), default=1, metavar="N",
                        help="processes for DistributedDataParallel (gloo on CPU, NCCL on CUDA)")
    parser.add_argument("--memory-limit", default=None, metavar="SIZE", type=types.size,
                        help="cap the CUDA caching allocator at SIZE (e.g. 16GiB), as the tuner's probes were; "
                             "peaks per epoch go to metrics.csv either way")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default=None,
                        help="compute precision: auto (default: the precision the bundle was tuned in, else "
                             "what the device runs natively) or force one; same as AUTOTUNE_PRECISION")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bars or epoch lines")


def train_from_args(args: argparse.Namespace) -> int:
    """Train as the parsed options say; rank 0 prints one summary line. Returns the exit code (0).

    Raises:
        What ``autotune.train`` raises (``AutotuneError`` subclasses for bad input).
    """
    from autotune.device import resolve_device
    from autotune.trainer.runner import train

    if getattr(args, "precision", None):  # torchrun's ranks inherit it
        from autotune.precision import PRECISION_ENV

        os.environ[PRECISION_ENV] = args.precision

    summary = train(args.bundle, device=resolve_device(args.device), epochs=args.epochs, max_time=args.max_time,
                    val_every=args.val_every, resume=args.resume, mode=args.mode, nproc=args.nproc,
                    progress=not args.quiet, memory_limit=args.memory_limit)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0  # under torchrun only rank 0 reports
    best = summary.get("best_metric")
    print(f"best mean Dice {best:.4f} at epoch {summary['best_epoch']}" if best is not None else "not validated",
          f"| {summary['epochs_run']} epochs ({summary['stopped']}) | {summary['model_dir']}")
    return 0
