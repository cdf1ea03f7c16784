"""Fast training of a bundle: cached data, thread loader, AMP, DDP, profiling, checkpoints.

``train(bundle, ...)`` trains (``autotune train``), ``infer(bundle, images, out)``
predicts (``autotune infer``). Importing this package does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["train", "infer", "evaluate", "parse_duration"]

_EXPORTS = {
    "train": "autotune.trainer.runner",
    "parse_duration": "autotune.trainer.runner",
    "infer": "autotune.trainer.infer",
    "evaluate": "autotune.trainer.infer",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'autotune.trainer' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
