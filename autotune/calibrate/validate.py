"""How well a device-model fit predicts points it was not fitted on: out of sample, by situation.

Leave-one-point-out (``autotune.probe.model_fit.leave_one_out``) shows how a template's factor carries
to another batch size of the same template. It cannot show how a fit carries to what it never saw,
and that is where an estimate is used most: a user's own network, MONAI's templates, another patch.
Each scheme here holds a whole group out of the fit and predicts it from the rest:

- ``leave_one_template_out``: each template predicted from the others' points only, with the model an
  estimate outside the fit's domain uses (``OUT_OF_DOMAIN``) and, for comparison, the alternatives
  (``OUT_OF_DOMAIN_MODELS``);
- ``leave_one_phase_out``: each phase of a template predicted from the factor fitted on its other phase;
- ``leave_one_scale_out``: each point predicted from its template's points at smaller batch sizes only (an
  extrapolation upward, as the search's N+1 is) and from those at larger ones only.

``out_of_sample`` runs them all and returns, per scheme, the rows and their ``error_summary``: points within
10%, the worst over- and under-prediction and the worst under-prediction as a share of the card. The
bound an estimate's situation is given (``autotune.probe.domain``) is read off these figures.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.probe.model_fit import ModelPoint, error_summary, predict_point

__all__ = ["OUT_OF_DOMAIN", "OUT_OF_DOMAIN_MODELS", "leave_one_template_out", "leave_one_phase_out",
           "leave_one_scale_out", "out_of_sample", "bounds_of", "inside_rows", "outside_rows"]

PHASES = ("train", "infer")
#: the model an estimate outside the fit's domain uses: the raw estimator and the allocator's rules, no fitted
#: workspace (chosen by ``leave_one_template_out`` on the first GPU run's points: BENCHMARKS.md)
OUT_OF_DOMAIN = "allocator"
#: the models compared for a template the fit never saw
OUT_OF_DOMAIN_MODELS = ("allocator", "pooled", "largest", "raw")

Factors = Mapping[str, float]


def _row(point: ModelPoint, phase: str, predicted: float, model: str, factor: float | None) -> dict[str, Any]:
    measured = float(point.reserved[phase])
    return {"algo": point.algo, "n": point.n, "m": point.m, "phase": phase, "model": model,
            "factor": None if factor is None else round(float(factor), 4), "predicted_bytes": int(round(predicted)),
            "reserved_bytes": int(measured), "error": predicted / measured - 1.0}


def _mean(factors: Sequence[Factors]) -> dict[str, float]:
    return {phase: statistics.fmean(float(f[phase]) for f in factors) for phase in PHASES}


def _template_means(points: Sequence[ModelPoint], per_point: Sequence[Factors]) -> dict[str, dict[str, float]]:
    groups: dict[str, list[Factors]] = {}
    for point, factors in zip(points, per_point, strict=True):
        groups.setdefault(point.algo, []).append(factors)
    return {algo: _mean(fs) for algo, fs in groups.items()}


def out_of_domain_factors(model: str, others: Sequence[ModelPoint], other_factors: Sequence[Factors]) -> dict[str, float] | None:
    """The workspace factors ``model`` gives a template none of ``others`` is: ``allocator`` none (0: the
    allocator's rules alone), ``pooled`` the mean over every other point, ``largest`` the largest template's
    mean per phase (what a version-2 file gave MONAI's templates), ``raw`` None (the estimator's peak itself)."""
    if model == "allocator":
        return {phase: 0.0 for phase in PHASES}
    if model == "pooled":
        return _mean(other_factors)
    if model == "largest":
        means = _template_means(others, other_factors)
        return {phase: max(m[phase] for m in means.values()) for phase in PHASES}
    if model == "raw":
        return None
    raise ValueError(f"unknown out-of-domain model {model!r}; known: {', '.join(OUT_OF_DOMAIN_MODELS)}")


def _predict(point: ModelPoint, factors: Factors | None, release: bool, expandable: bool) -> dict[str, float] | None:
    if factors is None:  # the raw estimate (a point made without it has none)
        if not all(phase in point.estimate for phase in PHASES):
            return None
        return {phase: float(point.estimate[phase]) for phase in PHASES}
    return predict_point(point, factors, release=release, expandable=expandable)


def leave_one_template_out(points: Sequence[ModelPoint], per_point: Sequence[Factors],
                           models: Sequence[str] = OUT_OF_DOMAIN_MODELS, release: bool = True,
                           expandable: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Per model, every point of each template predicted from the other templates' points only (a template
    alone in the fit is predicted from nothing but the model's rule: ``allocator`` and ``raw`` need no
    points)."""
    out: dict[str, list[dict[str, Any]]] = {model: [] for model in models}
    for algo in sorted({p.algo for p in points}):
        pairs = [(p, f) for p, f in zip(points, per_point, strict=True) if p.algo != algo]
        others, other_factors = [p for p, _ in pairs], [f for _, f in pairs]
        for model in models:
            if not others and model in ("pooled", "largest"):
                continue
            factors = out_of_domain_factors(model, others, other_factors)
            for point in (p for p in points if p.algo == algo):
                predicted = _predict(point, factors, release, expandable)
                if predicted is None:
                    continue
                out[model] += [_row(point, phase, predicted[phase], model, factors[phase] if factors else None)
                               for phase in PHASES]
    return out


def leave_one_phase_out(points: Sequence[ModelPoint], per_point: Sequence[Factors], release: bool = True,
                        expandable: bool = False) -> list[dict[str, Any]]:
    """Each phase of each point predicted with its template's factor fitted on the other phase (mean over the
    template's points): training's workspace factor for validation, and validation's for training."""
    means = _template_means(points, per_point)
    rows = []
    for point in points:
        own = means[point.algo]
        for phase in PHASES:
            other = "infer" if phase == "train" else "train"
            factors = {phase: own[other], other: own[other]}
            predicted = predict_point(point, factors, release=release, expandable=expandable)
            rows.append(_row(point, phase, predicted[phase], "other phase", own[other]))
    return rows


def leave_one_scale_out(points: Sequence[ModelPoint], per_point: Sequence[Factors], release: bool = True,
                        expandable: bool = False) -> list[dict[str, Any]]:
    """Each point predicted from its template's points at smaller batch sizes only (``up``) and, separately,
    at larger ones only (``down``), where the template has such points."""
    rows = []
    pairs = list(zip(points, per_point, strict=True))
    for point in points:
        for side, sign in (("up", 1), ("down", -1)):
            fit = [f for other, f in pairs if other.algo == point.algo and sign * (point.n - other.n) > 0]
            if not fit:
                continue
            factors = _mean(fit)
            predicted = predict_point(point, factors, release=release, expandable=expandable)
            rows += [_row(point, phase, predicted[phase], side, factors[phase]) for phase in PHASES]
    return rows


def out_of_sample(points: Sequence[ModelPoint], per_point: Sequence[Factors], card_bytes: float | None,
                  release: bool = True, expandable: bool = False,
                  loo: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Every scheme's rows and ``error_summary`` (``loo``: the leave-one-point-out rows, when made already)."""
    def summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return error_summary(rows, card_bytes)

    templates = leave_one_template_out(points, per_point, release=release, expandable=expandable)
    phases = leave_one_phase_out(points, per_point, release=release, expandable=expandable)
    scales = leave_one_scale_out(points, per_point, release=release, expandable=expandable)
    out: dict[str, Any] = {
        "leave_one_template_out": {model: {"rows": rows, "summary": summary(rows)} for model, rows in templates.items()},
        "leave_one_phase_out": {"rows": phases, "summary": summary(phases)},
        "leave_one_scale_out": {"rows": scales, "summary": summary(scales)},
    }
    if loo is not None:
        out["leave_one_out"] = {"rows": list(loo), "summary": summary(loo)}
    return out


def _worst(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The worst over- and under-prediction of ``rows`` (``error_summary``'s), overall and per phase."""
    if not rows:
        return {}
    keys = ("max_over", "max_under")
    out: dict[str, Any] = {k: error_summary(rows)[k] for k in (*keys, "points")}
    out["by_phase"] = {phase: {k: error_summary(own)[k] for k in keys}
                       for phase in PHASES if (own := [r for r in rows if r["phase"] == phase])}
    return out


def inside_rows(validation: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The rows that say how a fit predicts inside its domain: leave one point out and leave one scale out."""
    return [*((validation.get("leave_one_out") or {}).get("rows") or []),
            *((validation.get("leave_one_scale_out") or {}).get("rows") or [])]


def outside_rows(validation: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The rows of ``OUT_OF_DOMAIN`` held out by template: how an estimate outside the domain predicts."""
    return ((validation.get("leave_one_template_out") or {}).get(OUT_OF_DOMAIN) or {}).get("rows") or []


def bounds_of(validation: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The bounds the search and a plan trust, per situation, from ``out_of_sample``'s rows:

    - ``in_domain``: a bundle inside the fit's domain, at a batch size that may not be measured: the worst of
      leave one point out and leave one scale out, over every template and per template (``by_template``);
    - ``out_of_domain``: anything else, estimated by ``OUT_OF_DOMAIN``: its leave-one-template-out figures.

    Each holds ``max_over`` and ``max_under`` (fractions of the measured peak, under as a negative), the same
    ``by_phase``, the number of rows and its ``source``."""
    held_in = inside_rows(validation)
    inside = _worst(held_in)
    if inside:
        inside["source"] = "out of sample: leave one point out and leave one scale out"
        inside["by_template"] = {algo: _worst([r for r in held_in if r["algo"] == algo])
                                 for algo in sorted({r["algo"] for r in held_in})}
        for entry in inside["by_template"].values():
            entry["source"] = inside["source"] + " (this template's points)"
    outside = _worst(outside_rows(validation))
    if outside:
        outside["source"] = "out of sample: leave one template out, the allocator's rules alone"
        outside["model"] = OUT_OF_DOMAIN
    return {"in_domain": inside, "out_of_domain": outside}
