"""autotune: generate, tune and train MONAI 3D segmentation bundles for the GPU you have.

Every stage is a function whose keyword arguments are its command's options, with the same
defaults: ``make_demo_dataset``, ``analyze``, ``generate``, ``run_probe``, ``estimate_report``,
``tune``, ``tune_worker``, ``verify``, ``train``, ``infer``; ``run`` does the whole job and
returns a ``RunResult``. ``BundleGen`` and ``AutotuneAlgo`` are shaped like MONAI Auto3DSeg's.
Errors derive from ``AutotuneError``. Everything else is reachable from its module (for
example ``autotune.bundles.plan.TuningPlan``, the typed ``tuning:`` block).

Names are loaded lazily, so that importing ``autotune`` (and running ``autotune --help``) does
not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from autotune.version import __version__

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    # errors
    "AutotuneError": "autotune.errors",
    "InputError": "autotune.errors",
    "DataError": "autotune.errors",
    "ConfigError": "autotune.errors",
    "SpecError": "autotune.errors",
    "ProbeError": "autotune.errors",
    "StorageError": "autotune.errors",
    "HostWriteError": "autotune.errors",
    "TrainingStopped": "autotune.errors",
    "TrainingDiverged": "autotune.errors",
    # the stages, in the order a job runs them
    "make_demo_dataset": "autotune.data.synthetic",
    "analyze": "autotune.data",
    "generate": "autotune.pipeline",
    "run_probe": "autotune.probe.runner",
    "estimate_report": "autotune.probe.report",
    "tune": "autotune.stages",
    "tune_worker": "autotune.stages",
    "verify": "autotune.stages",
    "train": "autotune.trainer.runner",
    "infer": "autotune.trainer.infer",
    # the whole job, and MONAI Auto3DSeg's shapes
    "run": "autotune.pipeline",
    "RunResult": "autotune.pipeline",
    "BundleGen": "autotune.pipeline",
    "AutotuneAlgo": "autotune.facade.algo",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'autotune' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
