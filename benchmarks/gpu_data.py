"""The GPU check's data: the hippocampus set (carried) and its subsets; the synthetic CT set and the
bundles come from the package (``autotune.calibrate.data``, what ``autotune calibrate`` makes), named
here too for the check's sections.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.calibrate.data import copy_bundle, generate, make_ct_dataset

__all__ = ["make_ct_dataset", "dataset_problem", "hippocampus_subset", "generate", "copy_bundle"]


def dataset_problem(folder: Path) -> str | None:
    """One line saying what is wrong with a Decathlon folder (no dataset.json, a listed file missing),
    or None when every training image and label it lists is there."""
    index = folder / "dataset.json"
    if not index.is_file():
        return f"{folder}: no dataset.json (expected the Decathlon Task04_Hippocampus folder)"
    try:
        training = json.loads(index.read_text(encoding="utf-8")).get("training") or []
    except (OSError, ValueError, AttributeError) as exc:
        return f"{index}: not a readable Decathlon dataset.json ({exc})"
    if not training:
        return f"{index}: lists no training cases"
    for case in training:
        for key in ("image", "label"):
            path = folder / str(case.get(key, ""))
            if not path.is_file():
                return f"{index}: {key} {case.get(key)!r} is listed but {path} is missing"
    return None


def hippocampus_subset(source: Path, out: Path, cases: int) -> Path:
    """A Decathlon folder holding the first ``cases`` training cases of ``source`` (a dry run's set)."""
    index = json.loads((source / "dataset.json").read_text(encoding="utf-8"))
    shutil.rmtree(out, ignore_errors=True)
    training = index["training"][:cases]
    for case in training:
        for key in ("image", "label"):
            target = out / case[key]
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / case[key], target)
    subset = {**index, "training": training, "numTraining": len(training), "test": [], "numTest": 0}
    (out / "dataset.json").write_text(json.dumps(subset), encoding="utf-8")
    return out
