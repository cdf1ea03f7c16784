"""Search one tuning key: answer from storage, or claim the key, search it and store the result.

The fast and estimate searches are sequential: with workers sharing a storage one worker
claims the key and the others wait for its stored result (or take the key over when its
holder is not live, ``autotune.search.liveness``). TPE studies are shared point by point.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import time
from collections.abc import Mapping
from typing import Any

from autotune.search.handoff import apply_handoff, batch_report, cap_range
from autotune.search.session import Session
from autotune.search.space import AlgoSpec, spec_for
from autotune.search.study import TuningKey, open_study
from autotune.utils import format_bytes

__all__ = ["tune_key", "search_key", "result_tag", "validation_devices", "predicted_fit"]


def result_tag(strategy: str, margin: float, spec: AlgoSpec, devices: tuple[str, ...], estimate_only: bool,
               handoff: str = "largest") -> str:
    """The study attribute holding the result of a search with these settings."""
    settings: dict[str, Any] = {"strategy": strategy, "margin": margin, "spec": spec.as_dict(), "devices": devices,
                                "estimate": estimate_only}
    if handoff != "largest":  # results stored before the goodput rule keep their tag
        settings["handoff"] = handoff
    blob = json.dumps(settings, sort_keys=True)
    return "result:" + hashlib.sha256(blob.encode()).hexdigest()[:12]


def validation_devices(spec: AlgoSpec, device: str) -> tuple[str, ...]:
    """On the CPU the volume is on the compute device either way: one search, not two."""
    if not device.startswith("cuda"):
        return ("device",)
    return spec.validation_devices


def tune_key(session: Session, key: TuningKey, cfg: Mapping[str, Any], n_bundles: int,
             wait: bool) -> dict[str, Any] | None:
    """Search one tuning key, or answer from storage; None when another worker holds it (and not ``wait``)."""
    algo = cfg["algo"]
    study_name = key.study_name
    say, budget, store = session.say, session.budget, session.store
    if not cfg.get("tuning_supported", True):
        say(f"[{algo}] this template does not support tuning; bundles left as generated")
        return {"algo": algo, "status": "unsupported", "reason": "template does not support tuning"}
    spec, batch_cap = cap_range(spec_for(session.explicit[algo], cfg), cfg, say)
    devices = validation_devices(spec, budget.device)
    tag = result_tag(session.strategy, budget.margin, spec, devices, session.estimate_only, session.handoff)
    sampler = None
    if session.strategy == "tpe":
        import optuna

        seed = int(cfg.get("seed", 0))
        if store.claims is not None:  # workers sharing a study: different opening points, not the same ones
            seed += os.getpid()
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, spec.num_trials))
    study = open_study(store.storage, key, sampler=sampler)
    # the fast search is sequential: one worker per key; TPE trials are shared point by point
    claims = store.claims if session.strategy != "tpe" else None
    announced = False
    while True:
        store.liveness.progress()
        stored = study.user_attrs.get(tag)
        if stored is not None:
            say(f"[{algo}] answered from storage ({study_name}); no new trial")
            return dict(stored, from_storage=True, probes=0)
        if claims is None or claims.claim(study_name, "key:" + tag):
            break
        if not wait:
            holder = claims.holder(study_name, "key:" + tag) or {}
            say(f"[{algo}] {study_name} is being tuned by {holder.get('owner', 'another worker')}; will wait")
            return None
        if not announced:
            say(f"[{algo}] waiting for another worker's result on {study_name}")
            announced = True
        time.sleep(2.0)
        study = open_study(store.storage, key, sampler=sampler)
    try:
        # fast and estimate: training trials in the key's study, inference trials in its -infer study
        infer_study = open_study(store.storage, key, phase="infer") if session.strategy != "tpe" else None
        for one in (study, infer_study):
            stale = store.liveness.fail_stale_trials(store.storage, one) if one is not None else []
            if stale:
                say(f"[{algo}] marked stale RUNNING trials {stale} of {one.study_name} as failed (their worker is gone)")
        say(
            f"[{algo}] tuning {study_name} ({n_bundles} bundle{'s' if n_bundles > 1 else ''}) on "
            f"{budget.info['device_name']}, strategy {session.strategy}"
            f"{' (estimates only)' if session.estimate_only else ''}, objective {session.objective}: "
            f"limit {format_bytes(budget.limit)}, budget {format_bytes(budget.budget)} (margin {budget.margin:.0%}), "
            f"patches/iter {list(spec.patches_range)}, sw batch {list(spec.sw_range)}"
        )
        started = time.perf_counter()
        record, train_curve = search_key(study, cfg, spec, devices, session, infer_study)
        record["batch"] = batch_report(record, batch_cap, predicted_fit(train_curve, batch_cap, budget.budget))
        record.update(
            study_name=study_name,
            infer_study_name=infer_study.study_name if infer_study is not None else study_name,
            storage=store.shown,
            strategy=session.strategy,
            memory_limit=budget.limit,
            margin=budget.margin,
            budget_bytes=budget.budget,
            device=budget.info["device"],
            device_name=budget.info["device_name"],
            device_total_memory=budget.info["device_total_memory"],
            precision=key.precision,
            wall_seconds=round(time.perf_counter() - started, 3),
            date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            key=key.as_dict(),
            from_storage=False,
        )
        if budget.target is not None:
            record["target"] = dict(budget.target)
        from autotune.search.story import tell_story

        tell_story(study, record, infer_study)  # the dashboard's notes and memory plots
        if record["status"] == "tuned":
            study.set_user_attr(tag, {k: v for k, v in record.items() if k != "from_storage"})
        return record
    finally:
        if claims is not None:
            claims.release(study_name, "key:" + tag, done=False)


def predicted_fit(curve: Any, batch_cap: Mapping[str, Any], budget: int) -> int | None:
    """The estimator's largest fit over the template's whole range (the cap may stop the search below it)."""
    from autotune.search.edge import largest_under

    whole = batch_cap.get("template_range") or batch_cap.get("range")
    if curve is None or not whole:
        return None
    try:
        return int(largest_under(curve, int(whole[0]), int(whole[1]), budget))
    except Exception:  # noqa: BLE001 - the estimate only explains the cap; its failure costs nothing
        return None


#: set to 1 to probe N+1 even where a calibration states a bound (trust no estimate at the edge)
PROBE_EDGE_ENV = "AUTOTUNE_PROBE_EDGE"


def probe_edge_forced() -> bool:
    """True when ``$AUTOTUNE_PROBE_EDGE`` asks for a real probe one above every measured fit."""
    return os.environ.get(PROBE_EDGE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def edge_bound(budget: Any, measured: bool, template: str | None = None) -> dict[str, Any] | None:
    """The stated over-prediction bound of a calibration for the budget's device, or None (probe N+1).

    Only for real probes on a device with a calibration file (``autotune.probe.calibration``) whose
    fit states ``max_over_prediction``: a GPU's from ``benchmarks/gpu_check.py``, the CPU's
    (``calibrations/cpu.json``) from ``benchmarks/calibrate_cpu.py``; the defaults state no bound.
    A bound stated for ``template`` alone is preferred to the calibration's overall one.
    ``$AUTOTUNE_PROBE_EDGE=1`` ignores any bound."""
    if not measured or probe_edge_forced():
        return None
    from autotune.probe.calibration import stated_bound

    return stated_bound((budget.info or {}).get("device_name"), template=template)


def search_key(
    study: Any, cfg: Mapping[str, Any], spec: AlgoSpec, devices: tuple[str, ...], session: Session,
    infer_study: Any = None,
) -> tuple[dict[str, Any], Any]:
    """Run the session's strategy on ``study`` (inference-only trials on ``infer_study`` when given): the key's
    record, and the estimator's training curve (or None)."""
    from autotune.search.evaluate import Evaluator
    from autotune.search.probers import EstimateProber, ProbeProber
    from autotune.search.strategy import distributions, run_fast, run_tpe

    bundle, budget, store = cfg["bundle_root"], session.budget, session.store
    scale, offset = budget.allowance.affine()
    if session.estimate_only:
        prober: Any = EstimateProber(bundle, budget.device, budget.budget, scale=scale, offset=offset)
    else:
        prober = ProbeProber(bundle, budget.device, budget.limit, timeout=session.timeout, env=session.probe_env,
                             scale=scale, offset=offset)
        from autotune.probe.isolation import prestart

        prestart()  # the probes' fork server imports torch and MONAI while the estimator traces
    evaluator = Evaluator(
        study, prober, budget.budget, distributions(spec, devices), storage=store.storage, progress=session.say,
        label=cfg["algo"], liveness=store.liveness, claims=store.claims, objective=session.objective,
        infer_study=infer_study,
    )
    train_model = None
    passes: dict[str, int] | None = None
    edge_check: dict[str, Any] = {}
    if session.strategy == "tpe":
        outcome = run_tpe(evaluator, spec, devices, seed=int(cfg.get("seed", 0)), objective=session.objective)
    else:
        from autotune.search.story import search_curves

        curves = search_curves(study, prober, spec.patches_range, spec.sw_range, devices[0])
        train_model = curves.train
        stated = edge_bound(budget, prober.measured, cfg["algo"])
        bounded: dict[str, list[int]] = {}
        outcome = run_fast(evaluator, spec, devices, train_model, curves.infer_for, session.objective,
                           stated["bound"] if stated else None, bounded)
        edge_check = {phase: ({"n": ns[0], "how": "bounded", **(stated or {})} if ns else {"how": "probed"})
                      for phase, ns in bounded.items()}
        if not prober.measured:
            edge_check = {"how": "estimated", "reason": "estimates only: N and N+1 are estimates, no probe"}
        elif probe_edge_forced():
            edge_check["reason"] = f"{PROBE_EDGE_ENV} set: N+1 probed"
        elif not stated:
            edge_check["reason"] = "no calibration stating an error bound for this device: N+1 probed"
        for phase, ns in bounded.items():
            if ns and stated:
                session.say(f"[{cfg['algo']}] {phase}: {ns[0]} not probed: its estimate exceeds the budget by more "
                            f"than the bound {stated['bound']:.3%} ({stated['scope']}) stated by {stated['calibration']}")
        passes = curves.passes()
    record: dict[str, Any] = {
        "algo": cfg["algo"],
        "objective": session.objective,
        "method": "measured" if prober.measured else "estimated",
        "probes": evaluator.probes,
        "reused_points": evaluator.reused,
        "trials": evaluator.trial_numbers,  # of study_name
        "infer_trials": evaluator.infer_trial_numbers,  # of infer_study_name (fast, estimate)
    }
    if passes is not None:  # estimator passes spent by this search (stored estimates cost none)
        record["estimator_passes"] = passes
        record["edge_check"] = edge_check  # N+1: probed, or settled by a calibration's stated bound
    if outcome.num_patches_per_iter is None:
        record.update(status="infeasible", reason=(
            f"even {spec.patches_range[0]} patch(es) per iteration does not fit in the budget; "
            "raise --memory-limit, lower the roi or use a smaller network"))
        return record, train_model
    if outcome.num_sw_batch_size is None:
        record.update(status="infeasible", reason=(
            f"training fits with {outcome.num_patches_per_iter} patches per iteration but no sliding-window "
            "batch size fits on any validation device; raise --memory-limit"))
        return record, train_model
    train_res = outcome.train.result if outcome.train else {}
    infer_res = outcome.infer.result if outcome.infer else {}
    record.update(
        status="tuned",
        num_patches_per_iter=outcome.num_patches_per_iter,
        max_num_patches_per_iter=outcome.max_num_patches_per_iter,
        num_sw_batch_size=outcome.num_sw_batch_size,
        validation_device=outcome.validation_device,
        sw_input_on_cpu=bool(budget.device.startswith("cuda") and outcome.validation_device == "cpu"),
        train_trial=outcome.train.trial_number if outcome.train else None,
        infer_trial=outcome.infer.trial_number if outcome.infer else None,
        train_peak_bytes=train_res.get("train_peak_bytes") or train_res.get("peak_bytes"),
        peak_bytes=max(int(train_res.get("peak_bytes") or 0), int(infer_res.get("peak_bytes") or 0)) or None,
        infer_peak_bytes=infer_res.get("infer_peak_bytes") or infer_res.get("peak_bytes"),
        samples_per_s=train_res.get("samples_per_s"),
        sw_seconds_per_volume=infer_res.get("sw_seconds_per_volume"),
    )
    def measure(n: int) -> Any:  # the goodput rule's one probe at the reference batch (a study point is reused)
        return evaluator.evaluate({"num_patches_per_iter": n}, ("train",))

    timed = session.strategy != "tpe" and prober.measured  # the fast search with real probes
    apply_handoff(record, cfg, outcome.train, measure if timed else None, session.handoff, session.say)
    record.update(probes=evaluator.probes, reused_points=evaluator.reused)
    if budget.device.startswith("cuda"):
        from dataclasses import asdict

        from autotune.probe.allowances import is_calibrated

        record["allowances"] = asdict(budget.allowance)
        record["allowances_validated_on_gpu"] = is_calibrated(budget.allowance)
    return record, train_model
