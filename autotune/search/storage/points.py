"""Points of a key's study: their canonical id (``point_id``) and the kind of a point measured in training.

A training pass that ran out of memory becomes a COMPLETE trial of ``kind: training``
(``autotune.search.driver.training_oom``); the evaluator answers its point from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["TRAINING_KIND", "point_id"]

TRAINING_KIND = "training"  # the ``kind`` of a study trial measured in training


def point_id(point: Mapping[str, Any], phases: tuple[str, ...]) -> str:
    """A canonical string naming a point and the phases it ran, to find it again."""
    parts = [f"{k}={point[k]}" for k in sorted(point)]
    return "+".join(phases) + "|" + ",".join(parts)
