"""What a key's study tells: the estimator's curves, kept in the study, and the dashboard's story.

Each estimate the fast search asks for (peak bytes at one batch size) is stored as a
study attribute as soon as it is computed, so a resumed run does not recompute it and
the dashboard's plot can draw the curve the search saw. After a search, ``tell_story``
attaches to each study of the key (training, inference) (optuna-dashboard's note and plotly-figure API) a note naming the
objective, the limit and the probes, and one plot per phase (training: peak against N;
inference: peak against the sw batch; different units, so never on one axis) with the
estimate, the probes, the budget and the limit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["estimates_attr", "stored_estimates", "KeyCurves", "search_curves", "memory_figure", "story_note", "tell_story"]


def estimates_attr(phase: str, point: dict[str, Any] | None = None) -> str:
    """The study attribute holding raw estimates of ``phase`` (infer: per volume place; the training
    batch does not change validation's peak, so it is not part of the name)."""
    if phase == "train":
        return "estimates:train"
    point = point or {}
    return f"estimates:infer:vd={point.get('validation_device')}"


def stored_estimates(study: Any, name: str) -> dict[int, int]:
    """Raw estimates stored under ``name`` (n -> bytes)."""
    return {int(n): int(v) for n, v in (study.user_attrs.get(name) or {}).items()}


def _store(study: Any, name: str) -> Callable[[int, int], None]:
    def store(n: int, raw: int) -> None:
        _store_many(study, name, {n: raw})

    return store


def _store_many(study: Any, name: str, values: dict[int, int]) -> None:
    known = stored_estimates(study, name)
    known.update({int(n): int(v) for n, v in values.items()})
    study.set_user_attr(name, {str(k): v for k, v in sorted(known.items())})


@dataclass
class KeyCurves:
    """A key's estimated curves for ``run_fast``, from at most ``MAX_PASSES`` estimator passes in all.

    ``train``: the training curve (or None: bisection); ``infer_for(n, validation_device)``: the
    sliding-window curve, made when the training search is done, with the passes left.
    """

    train: Any
    infer_for: Callable[[int, str], Any]
    train_passes: int
    infer_curves: list[Any] = field(default_factory=list)

    def passes(self) -> dict[str, int]:
        """Estimator passes spent, by the phase they were spent for (stored estimates cost none)."""
        from autotune.search.sparse import passes_of

        return {"train": self.train_passes, "infer": sum(passes_of(c) for c in self.infer_curves)}


def search_curves(study: Any, prober: Any, patches_range: tuple[int, int], sw_range: tuple[int, int],
                  validation_device: str) -> KeyCurves:
    """The curves of one key, backed by ``study``: the estimator traces training once (at a marker
    batch, ``autotune.probe.replay``) and, in the same pass, validation at the top of the sliding-window
    range on ``validation_device``; the exact training curve over ``patches_range`` is stored for the
    dashboard and a resumed search. Where the trace does not replay, training is estimated point by
    point (``autotune.search.sparse``). Inference curves get the passes left of ``MAX_PASSES``."""
    from autotune.search.sparse import MAX_PASSES, passes_of
    from autotune.step import num_windows

    lo, hi = (int(v) for v in patches_range)
    name = estimates_attr("train")
    known = stored_estimates(study, name)
    sw_top = max(int(sw_range[0]), min(int(sw_range[1]), num_windows(prober.config())))
    infer_attr = estimates_attr("infer", {"validation_device": validation_device})
    if all(n in known for n in range(lo, hi + 1)):  # a resumed search: the curve is in the study
        train = prober.memory_curve("train", {}, known, _store(study, name), max_passes=0)
        train_passes = 0
    else:
        fold = sw_top not in stored_estimates(study, infer_attr)
        train, infer_raw = prober.training_replay(
            {"num_sw_batch_size": sw_top, "validation_device": validation_device} if fold else None)
        train_passes = 1
        if infer_raw is not None:
            _store_many(study, infer_attr, {sw_top: infer_raw})
        if train is not None:
            from autotune.search.edge import raw_of

            _store_many(study, name, raw_of(train).as_dict(lo, hi))
        else:
            train = prober.memory_curve("train", {}, known, _store(study, name), max_passes=MAX_PASSES - 1)
            train_passes += passes_of(train)
    curves = KeyCurves(train, lambda n, vd: None, train_passes)

    def infer_for(n: int, vd: str) -> Any:
        attr = estimates_attr("infer", {"validation_device": vd})
        left = MAX_PASSES - sum(curves.passes().values())
        curve = prober.memory_curve("infer", {"num_patches_per_iter": n, "validation_device": vd},
                                    stored_estimates(study, attr), _store(study, attr), max_passes=left)
        curves.infer_curves.append(curve)
        return curve

    curves.infer_for = infer_for
    return curves


class _Figure:
    """A plotly figure as JSON (what optuna-dashboard stores); plotly itself is not needed."""

    def __init__(self, data: list[dict[str, Any]], layout: dict[str, Any]) -> None:
        self.data, self.layout = data, layout

    def to_json(self) -> str:
        import json

        return json.dumps({"data": self.data, "layout": self.layout})


def _mib(value: float | None) -> float | None:
    return None if value is None else round(float(value) / 2**20, 3)


def _fits(trial: Any) -> bool:
    return trial.user_attrs.get("status") == "ok" and all(v <= 0 for v in (trial.constraints or {}).values())


def memory_figure(study: Any, phase: str, record: dict[str, Any], trials_study: Any = None) -> _Figure | None:
    """Peak memory against the batch size of ``phase``: the estimate, the probes (fits and non-fits marked),
    the budget and the limit. Estimates are read from ``study`` (the key's), trials from ``trials_study``
    (default ``study``)."""
    from optuna.trial import TrialState

    size = "num_patches_per_iter" if phase == "train" else "num_sw_batch_size"
    # the inference point was searched at the largest fit; the goodput hand-off may give training less
    point = {"num_patches_per_iter": record.get("max_num_patches_per_iter") or record.get("num_patches_per_iter"),
             "validation_device": record.get("validation_device")}
    if phase == "train":
        estimates = stored_estimates(study, estimates_attr("train"))
    else:
        estimates = stored_estimates(study, estimates_attr("infer", point))
    probes = [t for t in (trials_study or study).get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
              if t.user_attrs.get("phases") == [phase] and size in t.params
              and (phase == "train" or t.params.get("num_patches_per_iter") == point["num_patches_per_iter"])]
    if not estimates and not probes:
        return None
    data: list[dict[str, Any]] = []
    if estimates:
        xs = sorted(estimates)
        data.append({"type": "scatter", "mode": "lines+markers", "name": "estimate (no compute)",
                     "x": xs, "y": [_mib(estimates[n]) for n in xs]})
    for fits, name, symbol, color in ((True, "fits", "circle", "#2ca02c"), (False, "does not fit", "x", "#d62728")):
        chosen = [t for t in probes if _fits(t) == fits]
        if chosen:
            data.append({"type": "scatter", "mode": "markers", "name": f"{'probe' if record.get('method') != 'estimated' else 'estimate'}: {name}",
                         "marker": {"size": 11, "symbol": symbol, "color": color},
                         "x": [t.params[size] for t in chosen], "y": [_mib(t.user_attrs.get("peak_bytes")) for t in chosen],
                         "text": [f"trial #{t.number}" for t in chosen]})
    # zoom on the edge: the probes, and the estimate up to a little past the limit (not its whole range)
    top = 1.4 * max([float(record.get("memory_limit") or 0)] + [float(t.user_attrs.get("peak_bytes") or 0) for t in probes])
    near = [n for n in estimates if top and estimates[n] <= top] + [t.params[size] for t in probes]
    xs_all = [x for trace in data for x in trace["x"]] or [1]
    span = [min(xs_all), max(near or xs_all) + 1]
    for name, value, color in (("budget", record.get("budget_bytes"), "#ff7f0e"),
                               ("limit", record.get("memory_limit"), "#000000")):
        if value:
            data.append({"type": "scatter", "mode": "lines", "name": name, "line": {"dash": "dash", "color": color},
                         "x": span, "y": [_mib(value)] * 2})
    label = "patches per iteration (N)" if phase == "train" else f"sliding-window batch (at N = {point['num_patches_per_iter']})"
    title = "training" if phase == "train" else "inference"
    layout = {"title": {"text": f"{record.get('algo')} {title}: peak memory against {size}, budget and limit"},
              "xaxis": {"title": {"text": label}, "range": [0, span[1]]},
              "yaxis": {"title": {"text": "peak memory (MiB)"}, **({"range": [0, _mib(top)]} if top else {})}}
    return _Figure(data, layout)


_WHAT = {
    "train": "the **training batch** (patches per iteration): each trial is a training-only probe at one N",
    "infer": "the **inference point** (sliding-window batch, validation device) at the chosen N: each trial is an "
             "inference-only probe",
    "joint": "training batch and inference point together (tpe): each trial probes both phases",
}


def _answer_line(objective: str, phase: str, answer: int | None) -> str:
    """Where the tuned answer is among the study's trials."""
    if answer is None:
        return "."
    if objective == "max-batch" and phase != "joint":
        return f" and **the best trial is the tuned answer** (trial #{answer})."
    why = ("the larger batch wins among points within the timing tolerance of the fastest" if objective == "throughput"
           else "among trials with the largest N the largest sw batch wins")
    return f"; **the tuned answer is trial #{answer}** (the best trial shown can differ: {why})."


def story_note(study: Any, record: dict[str, Any], trials_study: Any = None) -> str:
    """A study's note: what the study sizes, where the answer is, the objective, the limit and the probes.
    ``study`` is the key's study (estimates); ``trials_study`` the study the note is for (default ``study``)."""
    from optuna.trial import TrialState

    from autotune.search.objective import metric_name
    from autotune.utils import format_bytes

    objective = record.get("objective", "max-batch")
    own = trials_study or study
    phase = str(own.user_attrs.get("phase") or "train")
    answer = record.get("infer_trial") if phase == "infer" else record.get("train_trial")
    lines = [
        f"### {record.get('algo')}: {record.get('status')}",
        f"This study sizes {_WHAT.get(phase, phase)}. Trial values are the {metric_name(objective, phase)}; "
        "a point that does not fit stores 0 and keeps its measured peak in `peak_bytes` (`verdict`, and the "
        "`memory` constraint = peak - budget), so the best trial is a point that fits"
        + _answer_line(objective, phase, answer if record.get("status") == "tuned" else None),
        f"Objective **{objective}**; the other phase's study: "
        f"`{record.get('study_name') if own.study_name != record.get('study_name') else record.get('infer_study_name')}`.",
        f"Strategy {record.get('strategy')}; limit {format_bytes(record.get('memory_limit'))}, budget "
        f"{format_bytes(record.get('budget_bytes'))} (margin {float(record.get('margin') or 0):.0%}).",
    ]
    if record.get("status") == "tuned":
        lines.append(
            f"Chosen: **{record['num_patches_per_iter']} patches per iteration** (largest that fits: "
            f"{record.get('max_num_patches_per_iter')}), **sw batch {record['num_sw_batch_size']}** with the "
            f"volume on the {record.get('validation_device')}; peak {format_bytes(record.get('peak_bytes'))}.")
    else:
        lines.append(f"Not tuned: {record.get('reason', '')}")
    for shown_phase in ("train", "infer"):
        trials = [t for t in own.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))
                  if t.user_attrs.get("phases") == [shown_phase] and t.user_attrs.get("kind") == "probe"]
        if trials:
            size = "num_patches_per_iter" if shown_phase == "train" else "num_sw_batch_size"
            shown = ", ".join(f"#{t.number} {size}={t.params.get(size)}: "
                              f"{t.user_attrs.get('verdict') or t.user_attrs.get('status')} "
                              f"{format_bytes(t.user_attrs.get('peak_bytes'))}" for t in trials)
            lines.append(f"Real {shown_phase} probes ({len(trials)}): {shown}.")
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
