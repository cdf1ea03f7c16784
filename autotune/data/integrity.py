"""Dataset-wide integrity checks: data that is wrong in meaning, not only in form.

``analyze`` runs these between the per-case checks (``validate.check_cases``) and the
statistics, from what the per-case checks recorded (label values present, orientation,
spacing): no file is read twice. The anchor is nnU-Net v2's ``--verify_dataset_integrity``,
which checks each label's values against dataset.json's ``labels`` and each case's image
and label geometry before planning.

Refused (``DataError`` or ``InputError``, one line naming the file and the fix):

- the same file listed twice in the training list (``check_duplicates``; paths are
  compared as files, so ``a/../x.nii.gz``, a symlink or a hard link to ``x.nii.gz`` count);
- a label value outside the declared classes (``classes.refuse_undeclared``, which the
  per-case checks apply);
- every label empty (``check_dataset``).

Warned (one line each; the run goes on): declared classes present in no label; a class
present in fewer than ``MIN_CLASS_SHARE`` of the labels; without declared classes, a
stray value (see ``check_dataset``); images whose orientation differs from the most common
one, or whose spacing is more than ``SPACING_FACTOR`` times off the median on an axis.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from autotune.data.classes import declared_classes
from autotune.data.source import DataSource
from autotune.data.validate import CaseInfo
from autotune.errors import DataError

__all__ = ["MIN_CLASS_SHARE", "SPACING_FACTOR", "check_dataset", "check_duplicates", "geometry_warnings",
           "log_warnings"]

logger = logging.getLogger(__name__)

MIN_CLASS_SHARE = 0.2  # a class in fewer labels than this may be missing from whole validation folds (5 folds)
SPACING_FACTOR = 3.0  # per axis, against the median spacing (which training resamples to)
MIN_CASES_FOR_STRAY = 3  # "one case against all the others" needs at least two others
_AXIS = {"L": 0, "R": 0, "P": 1, "A": 1, "I": 2, "S": 2}


def check_duplicates(source: DataSource) -> None:
    """Refuse a file listed twice in the training list (as image or label, under any spelling).

    Files are compared by device and inode when they exist (symlinks, hard links, ``..``),
    else by their resolved path. A missing file is left to ``check_cases`` to report.

    Raises:
        DataError: Two training cases list the same file; the message names both entries.
    """
    listed = source.listed_in or source.source
    seen: dict[object, tuple[int, str, str]] = {}
    for index, entry in enumerate(source.training):
        images = entry["image"] if isinstance(entry["image"], list) else [entry["image"]]
        for key, path in [*(("image", image) for image in images), ("label", entry["label"])]:
            identity = _identity(path)
            if identity not in seen:
                seen[identity] = (index, key, path)
                continue
            first_index, first_key, first_path = seen[identity]
            if first_index == index:
                continue
            spelling = "" if first_path == path else f" (training[{index}] spells it {path})"
            raise DataError(f"{listed}: training[{first_index}].{first_key} and training[{index}].{key} are the same "
                            f"file {first_path}{spelling}; remove the duplicate case, or it can land in training and "
                            "validation at once and inflate validation Dice")


def check_dataset(source: DataSource, infos: list[CaseInfo]) -> list[str]:
    """Check the checked cases as one dataset; refuse all-empty labels, return the warnings.

    Without declared classes, a value is "stray" when it is in exactly one label while the
    values of the other labels (less other such single-case values) form a contiguous 0..K
    and the value is above K + 1, so it opens a gap of classes no label holds (7 in one case
    where all others hold 0-2 makes the network 8 classes wide). Needs at least
    ``MIN_CASES_FOR_STRAY`` cases. A value K + 1 in one case is a rare class, not a stray.

    Args:
        source: The data source the cases came from.
        infos: ``check_cases`` results, in datalist order (an empty list checks nothing).

    Returns:
        One line per warning, in a stable order.

    Raises:
        DataError: No label holds any foreground.
    """
    if not infos:
        return []
    holders: dict[int, list[CaseInfo]] = {}
    for info in infos:
        for value in info.label_values:
            holders.setdefault(value, []).append(info)
    if not any(value != 0 for value in holders):
        raise DataError(f"{source.listed_in or source.source}: all {len(infos)} labels are empty (only background "
                        f"0, e.g. {infos[0].label}); point each 'label' at its segmentation mask: with no foreground "
                        "there is nothing to learn")
    declared = declared_classes(source)
    if declared is not None:
        classes = [value for value in declared.values if value != 0]
        warnings = _absent_declared(classes, holders, declared.names, declared.file, len(infos))
        names = declared.names
    else:
        classes, warnings = _undeclared_value_warnings(source, holders, len(infos))
        names = {}
    return warnings + _rare_class_warnings(classes, holders, names, len(infos)) + geometry_warnings(infos)


def _absent_declared(classes: list[int], holders: dict[int, list[CaseInfo]], names: dict[int, str],
                     declaring: Path | None, count: int) -> list[str]:
    """A warning when declared classes are in no label (each still gets an output channel)."""
    absent = [value for value in classes if value not in holders]
    if not absent:
        return []
    return [f"{declaring}: declared class(es) {_named(absent, names)} are in none of the {count} labels; the network "
            "still gets an output channel for each: remove them from the declaration or check the labels"]


def _undeclared_value_warnings(source: DataSource, holders: dict[int, list[CaseInfo]],
                               count: int) -> tuple[list[int], list[str]]:
    """Without declared classes: the classes taken as meant (1..K below any stray value) and the warnings
    about stray values and gaps in 0..K."""
    foreground = sorted(value for value in holders if value != 0)
    stray, top = _stray_values(holders, count)
    kept = max((value for value in foreground if value not in stray), default=0)
    warnings = [f"{holders[value][0].label}: label value {value} is in this label only, while the other {count - 1} "
                f"labels together hold 0-{top}; it makes the network {max(foreground) + 1} classes wide: fix this "
                "label, or declare the classes (labels or class_names) so that analyze refuses such values"
                for value in stray]
    classes = list(range(1, kept + 1))
    absent = [value for value in classes if value not in holders]
    if absent:
        warnings.append(f"{source.listed_in or source.source}: label value(s) {_named(absent, {})} are in none of the "
                        f"{count} labels, yet values go up to {kept}; the network still gets an output channel for "
                        "each: renumber the labels 0, 1, 2, ... without gaps")
    return classes, warnings


def _rare_class_warnings(classes: list[int], holders: dict[int, list[CaseInfo]], names: dict[int, str],
                         count: int) -> list[str]:
    """A warning per class held by fewer than ``MIN_CLASS_SHARE`` of the labels (but by at least one)."""
    warnings = []
    for value in classes:
        cases = holders.get(value, [])
        if cases and len(cases) < MIN_CLASS_SHARE * count:
            warnings.append(f"{cases[0].label}: class {_named([value], names)} is in only {len(cases)} of {count} "
                            f"labels ({len(cases) / count:.0%}, under {MIN_CLASS_SHARE:.0%}); some validation folds "
                            "may hold none of it and its Dice will be noisy: add cases that hold it or merge it")
    return warnings


def geometry_warnings(infos: list[CaseInfo]) -> list[str]:
    """Warn about images whose orientation differs from the most common one or whose spacing is off the median.

    Spacings are compared in RAS axis order (so an LPI image's slice axis meets the other slice
    axes); an axis more than ``SPACING_FACTOR`` times larger or smaller than the median is off.
    """
    import numpy as np

    warnings: list[str] = []
    count = len(infos)
    orientations = Counter(info.orientation for info in infos)
    common, common_count = orientations.most_common(1)[0]
    odd = [info for info in infos if info.orientation != common]
    if odd:
        warnings.append(f"{odd[0].image[0]}: orientation {odd[0].orientation} differs from {common}, which {common_count} "
                        f"of {count} images have ({len(odd)} image(s) differ); training reorients to RAS, but a "
                        "different export can hide a label that does not match its image: check these in a viewer")
    spacings = np.array([_ras_spacing(info) for info in infos], dtype=float)
    median = np.median(spacings, axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.maximum(spacings / median, median / spacings)
    ratio = np.nan_to_num(ratio, nan=np.inf).max(axis=1)
    off = np.flatnonzero(ratio > SPACING_FACTOR)
    if off.size:
        worst = int(off[np.argmax(ratio[off])])
        warnings.append(f"{infos[worst].image[0]}: spacing {_mm(spacings[worst])} mm is {ratio[worst]:.3g}x off the "
                        f"median {_mm(median)} mm (over {SPACING_FACTOR:g}x; {off.size} of {count} image(s) are); "
                        "training resamples every case to the median spacing: check the voxel size in these headers")
    return warnings


def log_warnings(lines: list[str]) -> None:
    """Log each warning line at WARNING level (the CLI prints them on stderr, one line each)."""
    for line in lines:
        logger.warning("%s", line)


def _stray_values(holders: dict[int, list[CaseInfo]], count: int) -> tuple[list[int], int]:
    """The stray values (see ``check_dataset``) and the top K of the contiguous 0..K the rest hold."""
    single = {value for value, cases in holders.items() if len(cases) == 1 and value != 0}
    base = set(holders) - single
    top = max(base, default=-1)
    if count < MIN_CASES_FOR_STRAY or base != set(range(top + 1)):
        return [], top
    return sorted(value for value in single if value > top + 1), top


def _identity(path: str) -> object:
    try:
        stat = os.stat(path)
    except OSError:
        return os.path.realpath(path)
    return (stat.st_dev, stat.st_ino)


def _named(values: list[int], names: dict[int, str], limit: int = 8) -> str:
    """``1 (liver), 2 (tumour)``; past ``limit`` values, the first few and the count (a 0/255 mask misses 254)."""
    shown = ", ".join(f"{value} ({names[value]})" if value in names else str(value) for value in values[:limit])
    return shown if len(values) <= limit else f"{shown}, ... ({len(values)} in all)"


def _mm(spacing: Iterable[float]) -> str:
    return "x".join(f"{float(value):.3g}" for value in spacing)


def _ras_spacing(info: CaseInfo) -> tuple[float, ...]:
    """The spacing in R, A, S axis order; as stored when the orientation is undefined."""
    if len(info.orientation) != 3 or set(info.orientation) - set(_AXIS):
        return info.spacing
    axes = [_AXIS[code] for code in info.orientation]
    if len(set(axes)) != 3:
        return info.spacing
    ordered = [0.0, 0.0, 0.0]
    for axis, value in zip(axes, info.spacing, strict=True):
        ordered[axis] = value
    return tuple(ordered)
