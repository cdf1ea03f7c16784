"""The fold split of a bundle's datalist: its training and validation cases (``split_datalist``).

Training (``autotune.trainer``), the hand-off's training-set size (``autotune.search.handoff``) and the data check
before a run read the same split. It reads a ``BundleConfig`` (``autotune.bundles.model``): it sits beside
``bundle_fit.py``, above the bundles' config model.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from autotune.errors import ConfigError, DataError
from autotune.utils import read_json

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

__all__ = ["VALIDATION_SPLIT", "split_datalist"]

VALIDATION_SPLIT = 0.2  # share of cases held out when the datalist has a single fold


def split_datalist(config: BundleConfig) -> tuple[list[dict], list[dict], str]:
    """Training and validation cases of the bundle's fold.

    Validation is the cases whose ``fold`` equals ``config.fold``; training is every
    other case. When the bundle has ``num_fold: 1`` or the datalist holds a single
    fold, a deterministic 20% of the cases (shuffled with ``config.seed``) is held out.

    Returns:
        (training cases, validation cases, a one-line note of how they were split).

    Raises:
        ConfigError: no datalist in the config.
        InputError: the datalist is missing or not JSON.
        DataError: the datalist has no training cases, or the fold has none.
    """
    path = config.datalist
    if not path:
        raise ConfigError("bundle config has no 'datalist'; regenerate the bundle with 'autotune generate'")
    datalist = read_json(path, DataError)
    cases = datalist.get("training") if isinstance(datalist, dict) else None
    if not isinstance(cases, list) or not cases:
        raise DataError(f"{path}: no 'training' cases; give an Auto3DSeg datalist with training cases")
    fold = config.fold
    folds = {int(c.get("fold", 0)) for c in cases}
    if config.num_fold > 1 and len(folds) > 1:
        val = [c for c in cases if int(c.get("fold", 0)) == fold]
        train = [c for c in cases if int(c.get("fold", 0)) != fold]
        if not val:
            raise DataError(f"{path}: fold {fold} has no cases; folds present: {sorted(folds)}")
        return train, val, f"fold {fold}: {len(train)} training, {len(val)} validation cases"
    order = list(range(len(cases)))
    random.Random(config.seed).shuffle(order)
    n_val = max(1, round(VALIDATION_SPLIT * len(cases))) if len(cases) > 1 else 0
    val_idx = set(order[:n_val])
    val = [c for i, c in enumerate(cases) if i in val_idx]
    train = [c for i, c in enumerate(cases) if i not in val_idx] or list(cases)
    return train, val or list(cases), f"single fold: held out {len(val)} of {len(cases)} cases (seeded 20%)"
