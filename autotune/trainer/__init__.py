"""Fast training of a bundle: cached data, thread loader, AMP, DDP, profiling, checkpoints.

``train(bundle, ...)`` trains (``autotune train``), ``infer(bundle, images, out)``
predicts (``autotune infer``). Importing this package does not import torch.
"""

from __future__ import annotations

from autotune.lazy import lazy_exports

__all__ = ["train", "infer", "evaluate", "parse_duration"]

_EXPORTS = {
    "train": "autotune.trainer.runner",
    "parse_duration": "autotune.trainer.runner",
    "infer": "autotune.trainer.infer",
    "evaluate": "autotune.trainer.infer",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
