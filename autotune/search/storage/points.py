"""Points of a key's study: their canonical id (``point_id``), the kind of a point measured in training and the
value of a point that does not fit (``NO_FIT``, the objective's).

A training pass that ran out of memory becomes a COMPLETE trial of ``kind: training``
(``autotune.search.storage.training_oom``); the evaluator answers its point from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["NO_FIT", "TRAINING_KIND", "point_id"]

TRAINING_KIND = "training"  # the ``kind`` of a study trial measured in training
NO_FIT = 0.0  # the value of a trial whose point does not fit: below every point that fits, in both objectives


def point_id(point: Mapping[str, Any], phases: tuple[str, ...]) -> str:
    """A canonical string naming a point and the phases it ran, to find it again."""
    parts = [f"{k}={point[k]}" for k in sorted(point)]
    return "+".join(phases) + "|" + ",".join(parts)
