"""autotune: generate, tune and train MONAI 3D segmentation bundles for the GPU you have.

Every stage is a function: ``analyze``, ``generate``, ``tune``, ``verify``, ``train``,
``infer``; ``run`` does the whole job (see ``autotune.pipeline``).

The public API is what ``__all__`` lists; names are loaded lazily so that importing
``autotune`` (and running ``autotune --help``) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

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
    # data
    "load_data_source": "autotune.data.datalist",
    "DataSource": "autotune.data.datalist",
    "analyze": "autotune.data",
    "make_demo_dataset": "autotune.data.synthetic",
    # the stages as functions, and the whole job (run)
    "run": "autotune.pipeline",
    "RunResult": "autotune.pipeline",
    "generate": "autotune.pipeline",
    "tune": "autotune.tuning",
    "tune_worker": "autotune.tuning",
    "verify": "autotune.tuning",
    "find_bundles": "autotune.tuning",
    "load_specs": "autotune.tuning",
    # bundles (BundleGen tunes with gpu_customization=True, so it is assembled in the pipeline)
    "BundleGen": "autotune.pipeline",
    "AutotuneAlgo": "autotune.bundles.algo",
    "load_overrides": "autotune.bundles.templates",
    "load_bundle_config": "autotune.bundles.config",
    "list_templates": "autotune.bundles.templates",
    # probe and estimate
    "run_probe": "autotune.probe.runner",
    "estimate": "autotune.probe.estimate",
    "fit_memory_model": "autotune.probe.estimate",
    "estimate_report": "autotune.probe.report",
    # search
    "tune_bundles": "autotune.search.tune",
    "verify_bundle": "autotune.search.verify",
    "parse_specs": "autotune.search.space",
    "resolve_target": "autotune.search.targets",
    # training
    "train": "autotune.train.runner",
    "infer": "autotune.train.infer",
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
