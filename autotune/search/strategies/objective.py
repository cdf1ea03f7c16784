"""What the search optimises, stated once: ``max-batch`` (default) or ``throughput``.

``max-batch``: the largest batch that fits. The answer is a function of the key and the
measured memory only, so a rerun, a run resumed after a kill and several workers agree.

``throughput``: the fastest point that fits. Timings on a shared machine are noisy:
points within ``TIE_TOLERANCE`` of the fastest tie and the larger batch among them
wins; that point replaces the largest feasible batch only if the largest is slower by
more than ``TIE_TOLERANCE`` again in a repeated measurement of both points (the repeats
are trials of the study too, so a resumed run reads them back).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autotune.search.storage.points import NO_FIT  # a point that does not fit: stated with the study's points
from autotune.tunables import sized_by

__all__ = ["OBJECTIVES", "DEFAULT_OBJECTIVE", "TIE_TOLERANCE", "NO_FIT", "SW_SCALE", "size_param", "metric_name",
           "trial_value", "choose"]

OBJECTIVES = ("max-batch", "throughput")
DEFAULT_OBJECTIVE = "max-batch"
TIE_TOLERANCE = 0.10  # timings closer than this are noise on a shared machine: prefer the larger batch


# a joint (tpe) trial's max-batch value is N + sw / SW_SCALE: ordered by N, then by the sw batch, as the search
# chooses, so the study's best trial is the answer written back (sliding-window ranges stay below SW_SCALE)
SW_SCALE = 10_000


def size_param(phase: str) -> str:
    """The batch parameter a phase sizes: ``num_patches_per_iter`` (train, joint) or ``num_sw_batch_size`` (infer)."""
    return sized_by(phase).name


def metric_name(objective: str, phase: str = "train") -> str:
    """The metric name (the dashboard's axis) of a study of ``phase`` (``train``, ``infer`` or ``joint``)."""
    if objective == "throughput":
        unit = "inference volumes/s" if phase == "infer" else "training samples/s"
        return f"{unit} of a point that fits (0 = does not fit)"
    if phase == "infer":
        return "sliding-window batch that fits (0 = does not fit)"
    if phase == "joint":
        return f"patches per iteration + sw batch / {SW_SCALE} of a point that fits (3.0062 = 3 patches, sw 62; 0 = does not fit)"
    return "patches per iteration that fit (0 = does not fit)"


def trial_value(objective: str, result: Mapping[str, Any], phases: tuple[str, ...], point: Mapping[str, Any]) -> float:
    """A fitting trial's value: the batch size of the phase it sizes (max-batch) or its measured throughput.
    A trial that does not fit stores ``NO_FIT`` instead (``autotune.search.strategies.evaluate``)."""
    if objective == "throughput":
        if "train" in phases:
            return float(result.get("samples_per_s") or 0.0)
        seconds = result.get("sw_seconds_per_volume")
        return 1.0 / float(seconds) if seconds else 0.0
    if tuple(phases) == ("train", "infer"):
        return float(point.get("num_patches_per_iter") or 0) + float(point.get("num_sw_batch_size") or 0) / SW_SCALE
    return float(point.get(size_param("train" if "train" in phases else "infer")) or 0)


def _speed(evaluation: Any) -> float:
    """Measured throughput of an evaluation, whatever the trial value holds."""
    return trial_value("throughput", evaluation.result or {}, evaluation.phases, evaluation.point)


def choose(
    evaluations: Sequence[Any],
    size: Callable[[Any], Any],
    objective: str,
    remeasure: Callable[[Any], Any] | None = None,
) -> Any | None:
    """The chosen feasible evaluation (None when none is feasible).

    Args:
        evaluations: what the search measured.
        size: the batch an evaluation stands for (an int, or a tuple compared in order).
        objective: ``max-batch`` or ``throughput``.
        remeasure: measures an evaluation's point once more (throughput only); without it a
            smaller batch never wins, since its advantage cannot be confirmed.
    """
    feasible = [e for e in evaluations if e.feasible]
    if not feasible:
        return None
    largest = max(feasible, key=lambda e: (size(e), _speed(e)))
    if objective != "throughput":
        return largest
    # the larger batch among the points within TIE_TOLERANCE of the fastest
    top = max(_speed(e) for e in feasible)
    winner = max((e for e in feasible if _speed(e) >= top * (1 - TIE_TOLERANCE)), key=lambda e: (size(e), _speed(e)))
    if size(winner) == size(largest) or remeasure is None:
        return largest
    again_winner, again_largest = remeasure(winner), remeasure(largest)
    if again_winner.feasible and again_largest.feasible and \
            _speed(again_largest) < _speed(again_winner) * (1 - TIE_TOLERANCE):
        return winner
    return largest
