"""Run a session's strategy on one key's studies and turn its outcome into the key's result.

The prober answers points (real probes, or the estimator alone for ``estimate``); the evaluator
records each point as a trial; the session's strategy (a ``Strategy``: ``autotune.search.strategies.base``)
chooses; the hand-off (``autotune.search.handoff``) decides the batch
training gets. The result is one typed ``autotune.bundles.result.TuningResult``: its record goes into the study
and the summary and, through ``autotune.bundles.plan.TuningPlan``, the bundle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.bundles.result import TuningResult
from autotune.families import family_for
from autotune.search.curves.bound import edge_bound
from autotune.search.driver.session import Session
from autotune.search.handoff import apply_handoff
from autotune.search.strategies.space import AlgoSpec
from autotune.tunables import TUNABLES, Point

if TYPE_CHECKING:
    from autotune.bundles.model import BundleConfig

__all__ = ["search_key"]


def _prober(config: BundleConfig, session: Session) -> Any:
    """Real probes in isolated children, or the estimator alone (``estimate``); the fake probes of
    ``AUTOTUNE_FAKE_PROBE`` where that test hook is set."""
    from autotune.checks.environment import setting
    from autotune.search.curves.probers import EstimateProber, ProbeProber

    budget = session.budget
    fake = setting("AUTOTUNE_FAKE_PROBE")
    if fake is not None:  # the test hook (autotune.search.curves.fake): a sleep and a synthetic answer
        from autotune.search.curves.fake import FakeProber

        return FakeProber(fake, budget.limit, config)
    scale, offset = budget.allowance.affine()
    if session.strategy.estimates_only:
        return EstimateProber(config.bundle_root, budget.device, budget.budget, scale=scale, offset=offset,
                              allowance=budget.allowance)
    from autotune.probe import prestart

    prestart()  # the probes' fork server imports torch and MONAI while the estimator traces
    return ProbeProber(config.bundle_root, budget.device, budget.limit, timeout=session.timeout,
                       env=session.probe_env, scale=scale, offset=offset, allowance=budget.allowance)


def _edge(config: BundleConfig, session: Session, prober: Any) -> tuple[dict[str, Any] | None, str | None]:
    """The calibration's stated bound on N+1 (or None), and why N+1 is probed whatever a calibration says."""
    # the template a calibration's stated bound covers, if any (``autotune.families``): else N+1 is probed
    family = family_for(config)
    covered = family.calibrated_as(config)
    budget = session.budget
    stated = edge_bound(budget.info.get("device_name"), prober.measured, covered, budget.allowance, config,
                        budget.device) if covered else None
    return stated, (family.uncalibrated_reason if covered is None else None)


def _device_model(config: BundleConfig, session: Session, prober: Any) -> dict[str, Any] | None:
    """On CUDA with a device model: which fit the key's estimates use and why (the calibration's domain), the
    out-of-sample bound of that situation and, for a plan, the margin it puts on each phase; said once."""
    budget = session.budget
    if not budget.device.startswith("cuda") or not budget.allowance.workspace_factors:
        return None
    from autotune.probe import workspace_template

    _, check = budget.allowance.factors_for(config, budget.device)
    bound = budget.allowance.bound_for(check, workspace_template(config))
    model: dict[str, Any] = {"fit": "fitted" if check.inside else "allocator rules", "domain": check.why,
                             "bound": bound}
    said = (f"; out of sample {100 * bound['max_under']:+.1f}% .. {100 * bound['max_over']:+.1f}%" if bound
            else "; the calibration states no out-of-sample bound")
    if not prober.measured:
        model["plan_scale"] = {phase: prober.plan_scale(phase) for phase in ("train", "infer")}
        said += ("; planned with peaks x " + ", ".join(f"{p} {v:.2f}" for p, v in model["plan_scale"].items())
                 + " (the out-of-sample under-prediction)")
    what = "the calibration's fit" if check.inside else "the allocator's rules alone (no fitted workspace)"
    session.say(f"[{config.algo}] device model: {what}: {check.why}{said}")
    return model


def _infeasible(outcome: Any, spec: AlgoSpec) -> str | None:
    """Why nothing was tuned (None when the outcome has an answer)."""
    if outcome.num_patches_per_iter is None:
        return (f"even {spec.patches_range[0]} patch(es) per iteration does not fit in the budget; "
                "raise --memory-limit, lower the roi or use a smaller network")
    if outcome.num_sw_batch_size is None:
        return (f"training fits with {outcome.num_patches_per_iter} patches per iteration but no sliding-window "
                "batch size fits on any validation device; raise --memory-limit")
    return None


def _answer(outcome: Any, provenance: dict[str, Any]) -> TuningResult:
    """The tuned result: each tunable's answer (``autotune.tunables``), the largest fit, and the measurements of the
    chosen points; ``provenance`` what the search says of itself."""
    train_res = outcome.train.result if outcome.train else {}
    infer_res = outcome.infer.result if outcome.infer else {}
    return TuningResult(
        "tuned", Point.of({t.name: outcome.value(t.name) for t in TUNABLES}),
        max_num_patches_per_iter=outcome.max_num_patches_per_iter,
        train_peak_bytes=train_res.get("train_peak_bytes") or train_res.get("peak_bytes"),
        peak_bytes=max(int(train_res.get("peak_bytes") or 0), int(infer_res.get("peak_bytes") or 0)) or None,
        infer_peak_bytes=infer_res.get("infer_peak_bytes") or infer_res.get("peak_bytes"),
        samples_per_s=train_res.get("samples_per_s"), sw_seconds_per_volume=infer_res.get("sw_seconds_per_volume"),
        provenance={**provenance, "train_trial": outcome.train.trial_number if outcome.train else None,
                    "infer_trial": outcome.infer.trial_number if outcome.infer else None},
    )


def _allowances(session: Session) -> dict[str, Any]:
    """The CUDA allowances the estimates were corrected by (nothing on the CPU)."""
    if not session.budget.device.startswith("cuda"):
        return {}
    from dataclasses import asdict

    from autotune.probe import is_calibrated

    return {"allowances": asdict(session.budget.allowance),
            "allowances_validated_on_gpu": is_calibrated(session.budget.allowance)}


def search_key(
    study: Any, config: BundleConfig, spec: AlgoSpec, devices: tuple[str, ...], session: Session,
    infer_study: Any = None,
) -> tuple[TuningResult, Any]:
    """Run the session's strategy on ``study`` (inference-only trials on ``infer_study`` when given): the key's
    result, and the estimator's training curve (or None)."""
    from autotune.search.strategies.base import KeyRun
    from autotune.search.strategies.evaluate import Evaluator
    from autotune.search.strategies.outcome import distributions

    prober = _prober(config, session)
    model = _device_model(config, session, prober)
    store = session.store
    evaluator = Evaluator(
        study, prober, session.budget.budget, distributions(spec, devices), storage=store.storage,
        progress=session.say, label=config.algo, liveness=store.liveness, claims=store.claims,
        objective=session.objective, infer_study=infer_study,
    )
    searched = session.strategy.run(KeyRun(study, evaluator, prober, spec, devices, session.objective,
                                           config.seed, config.algo, session.say,
                                           lambda: _edge(config, session, prober)))
    outcome, train_curve = searched.outcome, searched.train_curve
    provenance: dict[str, Any] = {
        "algo": config.algo, "objective": session.objective, "method": "measured" if prober.measured else "estimated",
        "probes": evaluator.probes, "reused_points": evaluator.reused,
        "trials": evaluator.trial_numbers, "infer_trials": evaluator.infer_trial_numbers, **searched.fields,
        **({"device_model": model} if model else {}),
    }
    reason = _infeasible(outcome, spec)
    if reason is not None:
        return TuningResult("infeasible", reason=reason, provenance=provenance), train_curve
    result = _answer(outcome, provenance)

    def measure(n: int) -> Any:  # the goodput rule's one probe at the reference batch (a study point is reused)
        return evaluator.evaluate({"num_patches_per_iter": n}, ("train",))

    timed = session.strategy.times_handoff and prober.measured  # the fast search with real probes
    result = apply_handoff(result, config, outcome.train, measure if timed else None, session.handoff, session.say)
    return result.replace(probes=evaluator.probes, reused_points=evaluator.reused, **_allowances(session)), train_curve
