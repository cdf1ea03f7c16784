"""autotune: generate, tune and train MONAI 3D segmentation bundles for the GPU you have.

Every stage is a function whose keyword arguments are its command's options, with the same
defaults: ``make_demo_dataset``, ``analyze``, ``generate``, ``run_probe``, ``estimate_report``,
``tune``, ``tune_worker``, ``verify``, ``train``, ``infer``; ``run`` does the whole job and
returns a ``RunResult``. ``BundleGen`` and ``AutotuneAlgo`` are shaped like MONAI Auto3DSeg's.
The errors live in ``autotune.errors`` (as Optuna's in ``optuna.exceptions``), all derived from
``autotune.errors.AutotuneError``; they are importable from ``autotune`` too (``autotune.SpecError``),
for older code, but ``__all__`` does not list them. Everything else is reachable from its module (for
example ``autotune.bundles.plan.TuningPlan``, the typed ``tuning:`` block).

Names are loaded lazily, so that importing ``autotune`` (and running ``autotune --help``) does
not import torch.
"""

from __future__ import annotations

from autotune import errors
from autotune.lazy import lazy_exports
from autotune.version import __version__

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
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

# the errors, importable from here for older code (``autotune.errors`` is where they live)
__getattr__, __dir__ = lazy_exports(__name__, {**_EXPORTS, **dict.fromkeys(errors.__all__, "autotune.errors")},
                                    __all__)
