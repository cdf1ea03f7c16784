"""The dashboard's notes: what each study of a key sizes and where the answer written back is.

After a search, ``tell_story`` attaches to each study of the key (training, inference; joint for
tpe) a note (optuna-dashboard's ``save_note``) and the memory plot of its phase
(``autotune.search.dashboard.figures``). The note says what the page shows: with the default
objective the study's best trial is the value written back (the largest fit; the sliding-window
batch), and where training gets a smaller batch by the hand-off rule, the rule's one-line reason
and the trial that measured it.

The bookkeeping studies the dashboard lists beside them (``autotune-workers``, ``<key study>-claims``) get
their note when they are created, in the storage family that creates them
(``autotune.search.storage.liveness.bookkeeping_note``): that family sits below this one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.search.curves.key_curves import estimates_attr, stored_estimates
from autotune.search.strategies.objective import metric_name, size_param
from autotune.tunables import BATCH, SW_BATCH, TUNABLES, VALIDATION_DEVICE

__all__ = ["story_note", "tell_story"]

_WHAT = {
    "train": "the **training batch** (patches per iteration): each trial is a training-only probe at one N",
    "infer": "the **inference point** (sliding-window batch, validation device) at the largest N that fits: each "
             "trial is an inference-only probe",
    "joint": "training batch and inference point together (tpe): each trial probes both phases",
}


#: the tunables the "Written back" sentence names in its own words; any other is listed after it by its label
_IN_PROSE = (BATCH.name, SW_BATCH.name, VALIDATION_DEVICE.name)


def _written_back(record: Mapping[str, Any]) -> str:
    """The values written back: today's three in a sentence, any other tunable (``autotune.tunables``) by its
    label and value."""
    from autotune.utils import format_bytes

    others = "".join(f"; {t.label} {record.get(t.name)}" for t in TUNABLES if t.name not in _IN_PROSE)
    return (f"Written back: **{record[BATCH.name]} patches per iteration** (largest that fits: "
            f"{record.get('max_num_patches_per_iter')}), **sw batch {record[SW_BATCH.name]}** with the "
            f"volume on the {record.get(VALIDATION_DEVICE.name)}{others}; "
            f"peak {format_bytes(record.get('peak_bytes'))}.")


def _best_line(record: Mapping[str, Any], phase: str) -> str:
    """Which trial the page shows as best, and what it is."""
    if record.get("status") != "tuned":
        return "."
    objective = record.get("objective", "max-batch")
    largest_fit_trial = (record.get("handoff") or {}).get("largest_fit_trial", record.get("train_trial"))
    trial = record.get("infer_trial") if phase == "infer" else largest_fit_trial
    if phase == "train":
        what = f"the largest fit, N = {record.get('max_num_patches_per_iter')}"
    elif phase == "infer":
        what = f"sw batch {record.get('num_sw_batch_size')} with the volume on the {record.get('validation_device')}"
    else:
        what = f"N = {record.get('max_num_patches_per_iter')} with sw batch {record.get('num_sw_batch_size')}"
    if objective == "throughput":
        return (f"; with the throughput objective the best trial is the fastest point that fits, and the value "
                f"written back is trial #{trial} ({what}): the larger batch among points within the timing "
                "tolerance of the fastest.")
    return f" and **the best trial is the value written back** (trial #{trial}: {what})."


def _handoff_line(record: Mapping[str, Any]) -> str | None:
    """Training's batch when the hand-off gave it less than the largest fit (None otherwise)."""
    handed, largest = record.get("num_patches_per_iter"), record.get("max_num_patches_per_iter")
    if record.get("status") != "tuned" or handed is None or largest is None or handed == largest:
        return None
    handoff = record.get("handoff") or {}
    measured = f" (measured in trial #{record.get('train_trial')})" if record.get("train_trial") is not None else ""
    return (f"Training gets **N = {handed}**, not the largest fit {largest}, by the hand-off rule "
            f"({handoff.get('rule', 'goodput')}): {handoff.get('line', '')}{measured}.")


def _probe_lines(own: Any) -> list[str]:
    """One line per phase listing the real probes of study ``own``."""
    from optuna.trial import TrialState

    from autotune.utils import format_bytes

    lines = []
    for shown_phase in ("train", "infer"):
        trials = [t for t in own.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))
                  if t.user_attrs.get("phases") == [shown_phase] and t.user_attrs.get("kind") == "probe"]
        if trials:
            size = size_param(shown_phase)
            shown = ", ".join(f"#{t.number} {size}={t.params.get(size)}: "
                              f"{t.user_attrs.get('verdict') or t.user_attrs.get('status')} "
                              f"{format_bytes(t.user_attrs.get('peak_bytes'))}" for t in trials)
            lines.append(f"Real {shown_phase} probes ({len(trials)}): {shown}.")
    return lines


def story_note(study: Any, record: dict[str, Any], trials_study: Any = None) -> str:
    """A study's note: what the study sizes, which trial is best and why, the objective, the limit and the
    probes. ``study`` is the key's study (estimates); ``trials_study`` the study the note is for (default
    ``study``)."""
    from autotune.utils import format_bytes

    objective = record.get("objective", "max-batch")
    own = trials_study or study
    phase = str(own.user_attrs.get("phase") or "train")
    other = record.get("study_name") if own.study_name != record.get("study_name") else record.get("infer_study_name")
    lines = [
        f"### {record.get('algo')}: {record.get('status')}",
        f"This study sizes {_WHAT.get(phase, phase)}. Trial values are the {metric_name(objective, phase)}; "
        "a point that does not fit stores 0 and keeps its measured peak in `peak_bytes` (`verdict`, and the "
        "`memory` constraint = peak - budget), so the best trial is a point that fits"
        + _best_line(record, phase),
        f"Objective **{objective}**; the other phase's study: `{other}`.",
        f"Strategy {record.get('strategy')}; limit {format_bytes(record.get('memory_limit'))}, budget "
        f"{format_bytes(record.get('budget_bytes'))} (margin {float(record.get('margin') or 0):.0%}).",
    ]
    if record.get("status") == "tuned":
        lines.append(_written_back(record))
        handoff = _handoff_line(record) if phase != "infer" else None
        if handoff:
            lines.append(handoff)
    else:
        lines.append(f"Not tuned: {record.get('reason', '')}")
    lines.extend(_probe_lines(own))
    estimates = stored_estimates(study, estimates_attr("train"))
    if estimates and phase != "infer":
        lines.append(f"Estimator asked at N = {sorted(estimates)} (bisection over its answers; no compute).")
    return "\n\n".join(lines)


def tell_story(study: Any, record: dict[str, Any], infer_study: Any = None) -> bool:
    """Attach the notes and the memory plots for optuna-dashboard: to ``study`` (training, or both phases
    for tpe) and to ``infer_study`` (inference); False when optuna-dashboard is not installed or the
    storage refuses (the tuning result never depends on this)."""
    try:
        from optuna_dashboard import save_note, save_plotly_graph_object
    except ImportError:
        return False
    from autotune.search.dashboard.figures import memory_figure

    try:
        for own in (study, infer_study):
            if own is not None:
                save_note(own, story_note(study, record, own))
        for phase in ("train", "infer"):
            own = infer_study if phase == "infer" and infer_study is not None else study
            figure = memory_figure(study, phase, record, own)
            if figure is not None:
                save_plotly_graph_object(own, figure, graph_object_id=f"autotune-{phase}-memory")
    except Exception:  # noqa: BLE001 - a dashboard annotation must never fail a tuning run
        return False
    return True
