"""``DataSource``: a dataset as autotune sees it (absolute paths, a fold per training case), and
the fold assignment used when the input gives none. ``autotune.data.datalist`` builds one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import InputError

__all__ = ["DataSource", "assign_folds", "check_folds"]


@dataclass
class DataSource:
    """A dataset as autotune sees it: absolute file paths, folds and a few facts.

    Attributes:
        source: What the user gave (input.yaml, datalist .json or Decathlon folder), absolute.
        dataroot: Folder that relative paths were resolved against, absolute.
        modality: ``"CT"`` or ``"MRI"``.
        training: ``{"image": str | list[str], "label": str, "fold": int}`` with absolute paths.
        testing: ``{"image": str | list[str]}`` with absolute paths.
        class_names: Names of the foreground classes, if known.
        labels: Label values, if known (Decathlon ``labels`` keys or ``labels`` in input.yaml).
        sigmoid: Whether classes overlap (region-based, sigmoid output) rather than softmax.
        folds_given: True if the input carried a ``fold`` for every training case.
        name: Dataset name.
        num_channels: Images per case: the length of the image list, the number of Decathlon
            modalities, or 1. ``validate.check_cases`` reports what the files really hold.
        listed_in: The file that holds the training list (datalist JSON or dataset.json), absolute.
    """

    source: Path
    dataroot: Path
    modality: str
    training: list[dict]
    testing: list[dict]
    class_names: list[str] | None
    labels: list[int] | None
    sigmoid: bool
    folds_given: bool
    name: str
    num_channels: int
    listed_in: Path | None = None

    @property
    def num_fold(self) -> int:
        """Number of folds the training cases are split into (highest fold + 1)."""
        return max(int(entry["fold"]) for entry in self.training) + 1

    def as_datalist(self) -> dict[str, Any]:
        """The Auto3DSeg datalist form: ``{"training": [...], "testing": [...]}``, absolute paths."""
        return {
            "training": [{"image": e["image"], "label": e["label"], "fold": int(e["fold"])} for e in self.training],
            "testing": [{"image": e["image"]} for e in self.testing],
        }


def assign_folds(num_cases: int, num_fold: int, seed: int = 0) -> list[int]:
    """Assign each case a fold: balanced (fold sizes differ by at most one), shuffled, deterministic.

    Args:
        num_cases: Number of training cases.
        num_fold: Number of folds, at least 1.
        seed: Seed of the shuffle; the same arguments always give the same folds.

    Returns:
        One fold index in ``range(num_fold)`` per case.

    Raises:
        InputError: ``num_fold`` is below 1 or ``num_cases`` is negative.
    """
    if isinstance(num_fold, bool) or not isinstance(num_fold, int) or num_fold < 1:
        raise InputError(f"num_fold {num_fold!r} must be an integer of at least 1")
    if num_cases < 0:
        raise InputError(f"num_cases {num_cases!r} must not be negative")
    folds = [index % num_fold for index in range(num_cases)]
    random.Random(seed).shuffle(folds)
    return folds


def check_folds(source: DataSource, num_fold: int, reanalyse: str | None = None) -> None:
    """Refuse ``num_fold`` bundles when a fold among 0..num_fold-1 holds no case (its bundle would have nothing
    to validate on), with advice that can work for this datalist.

    Args:
        source: The data source, its folds assigned.
        num_fold: Folds to generate bundles for (1: one bundle, validated on a held-out share: always fine).
        reanalyse: The command that assigns new folds, where the folds came from an analysis rather than from
            the user's datalist (None: the folds are the datalist's own, or were assigned for ``num_fold``).

    Raises:
        InputError: naming the datalist, the empty fold and the folds present.
    """
    if num_fold <= 1:
        return
    present = sorted({int(entry["fold"]) for entry in source.training})
    missing = [fold for fold in range(num_fold) if fold not in present]
    if not missing:
        return
    usable = 0
    while usable in present:
        usable += 1  # folds 0..usable-1 each hold a case
    cases = len(source.training)
    where = source.listed_in or source.source
    fewer = f"use --num-fold {usable} or fewer" if usable > 1 else "use --num-fold 1 (a held-out share validates)"
    if reanalyse is not None and cases >= num_fold:
        other = f", or assign {num_fold} folds first ('{reanalyse}')"
    elif source.folds_given and cases >= num_fold:
        other = f", or remove the 'fold' keys from {where.name} so that autotune assigns {num_fold} folds"
    elif source.folds_given or reanalyse is not None:
        other = f" ({cases} case(s): at most {cases} folds in any case)"
    else:
        other = ""
    raise InputError(f"{where}: fold {missing[0]} holds no training case (folds present: {present}), so "
                     f"--num-fold {num_fold} would give a bundle with nothing to validate on; {fewer}{other}")
