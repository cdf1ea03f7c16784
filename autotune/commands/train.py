"""``autotune train`` and ``autotune infer``: shims over ``autotune.trainer``.

``train``'s options and handler live in ``autotune.trainer.options``, shared with
``python -m autotune.trainer`` (the entry torchrun starts on every rank). Nothing heavy is
imported here; the handlers import torch and MONAI when they run.
"""

from __future__ import annotations

import argparse

from autotune.checks import options as types
from autotune.commands import add_command
from autotune.trainer.options import add_train_arguments, train_from_args

__all__ = ["register", "infer_command"]


def _infer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="BUNDLE", type=types.path_text, help="a trained bundle folder")
    p.add_argument("--images", nargs="+", required=True, metavar="FILE", type=types.path_text,
                   help="image files, or one datalist .json (its testing cases, else its training images)")
    p.add_argument("--output", required=True, metavar="DIR", type=types.path_text, help="folder for the predictions")
    p.add_argument("--device", default="auto", type=types.device, help="cpu, cuda or cuda:N (default: GPU if any, else cpu)")
    p.add_argument("--checkpoint", default="best", help="best, last or a checkpoint path (default best)")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``train`` and ``infer`` to the ``autotune`` parser."""
    add_command(
        sub, "train", train_from_args, add_train_arguments,
        help="train a bundle fast (cache, thread loader, AMP) or as the regular baseline; DDP with --nproc",
        description=(
            "Train BUNDLE on its fold: checkpoints (best.pt, last.pt), metrics.csv/json and curves.png go to "
            "BUNDLE/model_fold<k>/. SIGTERM, SIGINT and SIGUSR1 write a checkpoint first; a kill loses at most one epoch: add --resume to continue."
        ),
    )
    add_command(sub, "infer", infer_command, _infer_args, quiet="no progress bar")


def infer_command(args: argparse.Namespace) -> int:
    """Predict label maps with a trained bundle, written in each input's own geometry.

    Sliding-window prediction with the bundle's tuned settings; writes OUTPUT/<name>_seg.nii.gz and
    prints the path of each prediction.
    """
    from autotune.device import resolve_device
    from autotune.trainer.infer import infer

    paths = infer(args.bundle, args.images, args.output, device=resolve_device(args.device),
                  checkpoint=args.checkpoint, progress=not args.quiet)
    for path in paths:
        print(path)
    return 0
