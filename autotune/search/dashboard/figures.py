"""The dashboard's memory plots: peak memory against the batch size of a study's phase.

optuna-dashboard stores plotly figures as JSON (``save_plotly_graph_object``); ``_Figure`` writes
that JSON without plotly. One plot per phase (training: peak against N; inference: peak against
the sliding-window batch): the estimate, the probes (fits and non-fits marked), the budget and the
limit, never two units on one axis.
"""

from __future__ import annotations

from typing import Any

from autotune.search.curves.key_curves import estimates_attr, stored_estimates
from autotune.search.strategies.objective import size_param
from autotune.search.strategies.record import trial_fits

__all__ = ["memory_figure"]


class _Figure:
    """A plotly figure as JSON (what optuna-dashboard stores); plotly itself is not needed."""

    def __init__(self, data: list[dict[str, Any]], layout: dict[str, Any]) -> None:
        self.data, self.layout = data, layout

    def to_json(self) -> str:
        import json

        return json.dumps({"data": self.data, "layout": self.layout})


def _mib(value: float | None) -> float | None:
    return None if value is None else round(float(value) / 2**20, 3)


def memory_figure(study: Any, phase: str, record: dict[str, Any], trials_study: Any = None) -> _Figure | None:
    """Peak memory against the batch size of ``phase``: the estimate, the probes (fits and non-fits marked),
    the budget and the limit. Estimates are read from ``study`` (the key's), trials from ``trials_study``
    (default ``study``)."""
    from optuna.trial import TrialState

    size = size_param(phase)
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
        chosen = [t for t in probes if trial_fits(t) == fits]
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
