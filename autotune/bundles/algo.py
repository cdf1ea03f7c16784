"""The inference entry of bundles generated before MONAI's shapes moved to ``autotune.facade``.

Their ``scripts/infer.py`` reads ``from autotune.bundles.algo import InferClass``; MONAI's ``BundleAlgo``
loads it for ``get_inferer`` and its ensembles. New bundles import ``autotune.facade.algo``; this alias keeps
the old ones working without a regeneration. Nothing in autotune imports it.
"""

from __future__ import annotations

from autotune.facade.algo import AutotuneAlgo, InferClass

__all__ = ["AutotuneAlgo", "InferClass"]
