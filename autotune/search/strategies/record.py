"""One evaluated point as the record its trial keeps: ``Evaluation``, the probe's result written onto the
trial and told to its study, and the line the search prints for it.

- a point that fits or that ran out of memory is a COMPLETE trial whose ``memory`` constraint is
  ``peak - budget`` (positive = infeasible); a point that does not fit stores the value ``NO_FIT``
  (0), below every point that fits, and ``verdict`` says ``does not fit``;
- a crash, kill or timeout is a FAIL trial with ``fail_reason``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune.probe import cuda_result_keys
from autotune.search.storage.points import point_id
from autotune.search.strategies.objective import NO_FIT, trial_value

__all__ = ["Evaluation", "RESULT_ATTRS", "trial_fits", "record_result", "fail_reason", "progress_line"]

# user attributes copied from a probe result onto its trial
RESULT_ATTRS = (
    "status",
    "phase_failed",
    "train_peak_bytes",
    "infer_peak_bytes",
    "peak_bytes",
    "train_peak_rss_bytes",
    "infer_peak_rss_bytes",
    "step_seconds_median",
    "step_seconds_spread",
    "samples_per_s",
    "sw_seconds_per_volume",
    "wall_seconds",
    "seconds",
    "measured",
    "precision",
    "device_name",
    "error_type",
    "signal",
    "allowance_bytes",
    "answered_by",  # an estimate given from one the prober held (``autotune.search.curves.answers``)
    *cuda_result_keys(),  # one definition with the trial that writes them, so the names cannot drift
)


def trial_fits(trial: Any) -> bool:
    """True when a stored trial's point ran and fits: status ok and no memory constraint violated."""
    return trial.user_attrs.get("status") == "ok" and all(v <= 0 for v in (trial.constraints or {}).values())


@dataclass
class Evaluation:
    """The outcome of one point."""

    point: dict[str, Any]
    phases: tuple[str, ...]
    status: str
    feasible: bool
    peak_bytes: int | None
    value: float
    trial_number: int | None
    reused: bool
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status in ("error", "timeout", "killed", "nonfinite")

    @classmethod
    def from_trial(cls, trial: Any, point: dict[str, Any], phases: tuple[str, ...], reused: bool = False) -> Evaluation:
        """The evaluation a stored trial holds."""
        attrs = trial.user_attrs
        return cls(point=point, phases=phases, status=str(attrs.get("status")), feasible=trial_fits(trial),
                   peak_bytes=attrs.get("peak_bytes"), value=float(trial.value or 0.0), trial_number=trial.number,
                   reused=reused, result=dict(attrs))


def record_result(trial: Any, study: Any, result: Mapping[str, Any], phases: tuple[str, ...], point: dict[str, Any],
                  *, budget_bytes: int, objective: str, reused_from: Evaluation | None = None) -> Evaluation:
    """Write ``result`` (a probe's, or the evaluation a known point reuses) onto ``trial`` and tell ``study``:
    COMPLETE with its ``memory`` constraint when the point ran or ran out of memory, FAIL with its
    ``fail_reason`` otherwise."""
    from optuna.trial import TrialState

    status = str(result.get("status", "error"))
    for name in RESULT_ATTRS:
        if result.get(name) is not None:
            trial.set_user_attr(name, result[name])
    if reused_from is not None:
        trial.set_user_attr("reused_trial", reused_from.trial_number)
        trial.set_user_attr("point_id", point_id(reused_from.point, phases))
    reused = reused_from is not None
    if status in ("ok", "oom"):
        peak = result.get("peak_bytes")
        if status == "oom" or peak is None:
            over = max(int(peak or 0) - budget_bytes, 1)
        else:
            over = int(peak) - budget_bytes
        trial.set_constraint("memory", float(over))
        feasible = status == "ok" and over <= 0
        # a point that does not fit can never be the study's best (the dashboard ignores constraints)
        value = trial_value(objective, result, phases, point) if feasible else NO_FIT
        trial.set_user_attr("verdict", "fits" if feasible else "does not fit")
        study.tell(trial, value)
        return Evaluation(point, phases, status, feasible, peak, value, trial.number, reused, dict(result))
    trial.set_user_attr("fail_reason", fail_reason(status, result)[-500:])
    study.tell(trial, state=TrialState.FAIL)
    return Evaluation(point, phases, status, False, None, 0.0, trial.number, reused, dict(result))


def fail_reason(status: str, result: Mapping[str, Any]) -> str:
    """Why a point's probe failed, in one line: the signal that killed it, the timeout, or its error."""
    if result.get("signal"):
        name = result.get("error_type")
        return f"{status}: signal {result['signal']}" + (f" ({name})" if name else "")
    if status == "timeout":
        return (f"timeout: no result after {float(result.get('wall_seconds') or 0.0):.1f} s "
                f"(phase {result.get('phase_failed') or '?'}); the probe was killed")
    return " ".join(str(part).strip() for part in (f"{status}:", result.get("error_type"), result.get("error_tail"))
                    if part and str(part).strip())


def _throughput(result: Mapping[str, Any], phases: tuple[str, ...]) -> float:
    if "train" in phases:
        return float(result.get("samples_per_s") or 0.0)
    seconds = result.get("sw_seconds_per_volume")
    return 1.0 / float(seconds) if seconds else 0.0


def progress_line(evaluation: Evaluation, phases: tuple[str, ...], *, label: str, budget_bytes: int,
                  measured: bool, reused: bool) -> str:
    """The line the search prints for one evaluated point: where its answer came from, its peak and verdict."""
    from autotune.utils import format_bytes

    point = " ".join(f"{k}={v}" for k, v in evaluation.point.items())
    where = "from study" if reused else ("probe" if measured else "estimate")
    share = ""
    if evaluation.peak_bytes:
        share = f" ({100.0 * evaluation.peak_bytes / max(budget_bytes, 1):.0f}% of budget)"
    value = ""
    speed = _throughput(evaluation.result, phases)
    if evaluation.status == "ok" and speed and not math.isnan(speed):
        unit = "samples/s" if "train" in phases else "volumes/s"
        value = f", {speed:.3g} {unit}" if measured else ""
    trial = f"#{evaluation.trial_number}" if evaluation.trial_number is not None else "-"
    verdict = "fits" if evaluation.feasible else "does not fit" if evaluation.status in ("ok", "oom") else "failed"
    return (f"  [{label}] trial {trial} {where} {'+'.join(phases)} {point}: {evaluation.status}, "
            f"peak {format_bytes(evaluation.peak_bytes)}{share}{value} -> {verdict}")
