"""Tune bundles: group them by tuning key, search each key once, write the values back.

    tune_bundles(["work/dints_0", "work/dints_1"], device="cuda:0", memory_limit="8GiB")

Folds of one algorithm share a key, so one search serves them all. Each key's study
keeps every evaluated point; a rerun after an interruption resumes from it, and a
finished key answers from storage with no new trial.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.bundles.config import bundle_config_path, load_bundle_config, update_bundle_config
from autotune.errors import SpecError
from autotune.search.handoff import batch_report, cap_range, handoff_updates
from autotune.search.space import AlgoSpec, parse_specs, spec_for
from autotune.utils import atomic_write_json, format_bytes, look_up_option, parse_bytes

__all__ = ["STRATEGIES", "tune_bundles", "loader_settings", "DEFAULT_MARGIN"]

STRATEGIES = ("fast", "tpe", "estimate")
DEFAULT_MARGIN = 0.10


def loader_settings(num_patches_per_iter: int, num_crops_per_image: int) -> dict[str, int]:
    """Loader batch that splits into whole forward passes of N patches: images x crops = lcm(N, crops)."""
    from autotune.step import loader_batch_patches

    n, crops = int(num_patches_per_iter), max(1, int(num_crops_per_image))
    images = loader_batch_patches(n, crops) // crops  # the probe holds this batch too
    return {"num_patches_per_iter": n, "num_images_per_batch": images, "num_crops_per_image": crops}


def _print(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _result_tag(strategy: str, margin: float, spec: AlgoSpec, devices: tuple[str, ...], estimate_only: bool) -> str:
    blob = json.dumps(
        {"strategy": strategy, "margin": margin, "spec": spec.as_dict(), "devices": devices, "estimate": estimate_only},
        sort_keys=True,
    )
    return "result:" + hashlib.sha256(blob.encode()).hexdigest()[:12]


def _check_writable(folders: Sequence[Path]) -> None:
    """Fail before any trial when a folder the results go to cannot be written."""
    import tempfile

    from autotune.errors import ConfigError

    for folder in sorted(set(folders)):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as exc:
            raise ConfigError(
                f"{folder}: cannot write the tuned values here ({exc.strerror or exc}); "
                "make it writable, or tune a copy of the bundles"
            ) from exc


def _validation_devices(spec: AlgoSpec, device: str) -> tuple[str, ...]:
    """On the CPU the volume is on the compute device either way: one search, not two."""
    if not device.startswith("cuda"):
        return ("device",)
    return spec.validation_devices


def tune_bundles(
    bundles: Sequence[str | os.PathLike[str]],
    specs: Mapping[str, Any] | None = None,
    *,
    device: str = "cpu",
    memory_limit: int | str | None = None,
    storage: str | None = None,
    strategy: str = "fast",
    margin: float = DEFAULT_MARGIN,
    timeout: float = 300.0,
    target: Mapping[str, Any] | None = None,
    probe_env: Mapping[str, str] | None = None,
    estimate_only: bool = False,
    workers_share: bool = False,
    summary_path: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | None = _print,
    write_back: bool = True,
    objective: str = "max-batch",
) -> list[dict[str, Any]]:
    """Tune ``bundles`` and write the tuned values (with provenance) into each.

    Args:
        bundles: bundle folders made by ``BundleGen``.
        specs: Auto3DSeg-style ``gpu_customization_specs`` (see ``autotune.search.space``).
        device: ``cpu`` or ``cuda:N``; where probes run.
        memory_limit: bytes or a size such as ``"8GiB"``; default the device's total memory.
        storage: SQLAlchemy URL of the Optuna storage; default SQLite under ``studies/``.
        strategy: ``fast`` (default), ``tpe`` (Auto3DSeg baseline) or ``estimate`` (no probes).
        margin: share of the limit kept free (default 10%).
        timeout: seconds before a probe is killed.
        target: for ``estimate``: ``{"name", "memory", "allowance_bytes"}`` of the GPU planned for.
        probe_env: extra environment for probe children (tests inject faults through it).
        estimate_only: answer every point from the estimator (``strategy="estimate"`` sets it).
        workers_share: several workers use this storage: claim keys and points before working on them.
        summary_path: where to write the JSON summary.
        progress: called with one line per step; None for silence.
        write_back: write the tuned values into the bundles.
        objective: ``max-batch`` (default: the largest batch that fits) or ``throughput`` (the fastest;
            see ``autotune.search.objective``); part of the study key and of the ``tuning:`` block.

    Returns:
        One result per bundle (dicts; ``status`` is ``tuned``, ``infeasible`` or ``unsupported``).

    Raises:
        SpecError: bad specs, strategy, margin or memory limit.
        StorageError: the storage cannot be opened.
    """
    from autotune.device import device_info
    from autotune.search.study import (
        default_storage_url,
        make_key,
        open_storage,
        redact_url,
    )

    say = progress or (lambda _line: None)
    strategy = look_up_option(strategy, STRATEGIES, "strategy", SpecError)
    from autotune.search.objective import OBJECTIVES

    objective = look_up_option(objective, OBJECTIVES, "objective", SpecError)
    if strategy == "estimate":  # the fast search, answered by the estimator alone
        strategy, estimate_only = "fast", True
    if not isinstance(margin, (int, float)) or not 0.0 <= float(margin) < 1.0:
        raise SpecError(f"margin must be in [0, 1), got {margin!r}")
    if not bundles:
        raise SpecError("no bundle to tune; run 'autotune generate' first")
    configs = {str(Path(b)): load_bundle_config(b) for b in bundles}
    if write_back:
        _check_writable([bundle_config_path(p).parent for p in configs])
    if summary_path:
        _check_writable([Path(summary_path).parent])
    algos = sorted({cfg["algo"] for cfg in configs.values()})
    explicit = parse_specs(specs, algos)
    if target is not None:
        device = str(target.get("device", "cuda:0"))
        info = {"device": device, "device_name": str(target["name"]), "device_total_memory": int(target["memory"])}
    else:
        info = device_info(device)
    limit = parse_bytes(memory_limit, "memory limit") if memory_limit is not None else info["device_total_memory"]
    if limit > info["device_total_memory"]:
        raise SpecError(
            f"memory limit {format_bytes(limit)} is above the {info['device_name']}'s {format_bytes(info['device_total_memory'])}"
        )
    from autotune.probe.allowances import allocator_budget, allowance_from_record

    allowance = allowance_from_record(target, device)
    budget = allocator_budget(limit, float(margin), allowance)
    if budget <= 0:
        raise SpecError(f"memory limit {format_bytes(limit)} leaves nothing after the margin and allowances")
    storage_url = storage or default_storage_url()
    store = open_storage(storage_url)
    shown_storage = redact_url(storage_url)

    groups: dict[str, list[str]] = {}
    keys: dict[str, Any] = {}
    for path, cfg in configs.items():
        key = make_key(cfg, info, limit, strategy + ("-estimate" if estimate_only else ""), objective)
        groups.setdefault(key.study_name, []).append(path)
        keys[key.study_name] = key

    claim_store = None
    if workers_share:
        from autotune.search.claims import ClaimStore
        from autotune.search.study import owner_tag

        claim_store = ClaimStore(storage_url, owner_tag())
    context = _Context(store, info, device, limit, budget, float(margin), strategy, estimate_only, timeout,
                       allowance, probe_env, target, shown_storage, explicit, claim_store, say, objective)
    records: dict[str, dict[str, Any]] = {}
    pending: list[str] = []
    try:
        for study_name, paths in groups.items():
            record = _tune_group(context, keys[study_name], configs[paths[0]], len(paths), wait=False)
            if record is None:
                pending.append(study_name)
            else:
                records[study_name] = record
        for study_name in pending:  # keys other workers hold: wait for their results (or take over)
            paths = groups[study_name]
            records[study_name] = _tune_group(context, keys[study_name], configs[paths[0]], len(paths), wait=True)
    finally:
        if claim_store is not None:
            claim_store.close()
    results: list[dict[str, Any]] = []
    for study_name, paths in groups.items():
        for path in paths:
            results.append(_write_back(path, configs[path], records[study_name], write_back, say))
    if summary_path:
        atomic_write_json(summary_path, {"results": results})
    return results


@dataclass
class _Context:
    storage: Any
    info: dict[str, Any]
    device: str
    limit: int
    budget: int
    margin: float
    strategy: str
    estimate_only: bool
    timeout: float
    allowance: Any
    probe_env: Mapping[str, str] | None
    target: Mapping[str, Any] | None
    shown_storage: str
    explicit: dict[str, dict[str, Any]]
    claims: Any
    say: Callable[[str], None]
    objective: str = "max-batch"


def _tune_group(ctx: _Context, key: Any, cfg: Mapping[str, Any], n_bundles: int, wait: bool) -> dict[str, Any] | None:
    """Search one tuning key, or answer from storage; None when another worker holds it (and not ``wait``)."""
    from autotune.search.study import fail_stale_trials, open_study

    algo = cfg["algo"]
    study_name = key.study_name
    if not cfg.get("tuning_supported", True):
        ctx.say(f"[{algo}] this template does not support tuning; bundles left as generated")
        return {"algo": algo, "status": "unsupported", "reason": "template does not support tuning"}
    spec, batch_cap = cap_range(spec_for(ctx.explicit[algo], cfg), cfg, ctx.say)
    devices = _validation_devices(spec, ctx.device)
    tag = _result_tag(ctx.strategy, ctx.margin, spec, devices, ctx.estimate_only)
    sampler = None
    if ctx.strategy == "tpe":
        import optuna

        seed = int(cfg.get("seed", 0))
        if ctx.claims is not None:  # workers sharing a study: different opening points, not the same ones
            seed += os.getpid()
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, spec.num_trials))
    study = open_study(ctx.storage, key, sampler=sampler)
    # the fast search is sequential: one worker per key; TPE trials are shared point by point
    exclusive = ctx.claims is not None and ctx.strategy != "tpe"
    announced = False
    while True:
        stored = study.user_attrs.get(tag)
        if stored is not None:
            ctx.say(f"[{algo}] answered from storage ({study_name}); no new trial")
            return dict(stored, from_storage=True, probes=0)
        if not exclusive or ctx.claims.claim(study_name, "key:" + tag):
            break
        if not wait:
            holder = ctx.claims.holder(study_name, "key:" + tag) or {}
            ctx.say(f"[{algo}] {study_name} is being tuned by {holder.get('owner', 'another worker')}; will wait")
            return None
        if not announced:
            ctx.say(f"[{algo}] waiting for another worker's result on {study_name}")
            announced = True
        time.sleep(2.0)
        study = open_study(ctx.storage, key, sampler=sampler)
    try:
        stale = fail_stale_trials(study)
        if stale:
            ctx.say(f"[{algo}] marked stale RUNNING trials {stale} as failed (their worker is gone)")
        ctx.say(
            f"[{algo}] tuning {study_name} ({n_bundles} bundle{'s' if n_bundles > 1 else ''}) on "
            f"{ctx.info['device_name']}, strategy {ctx.strategy}{' (estimates only)' if ctx.estimate_only else ''}, objective {ctx.objective}: "
            f"limit {format_bytes(ctx.limit)}, budget {format_bytes(ctx.budget)} (margin {ctx.margin:.0%}), "
            f"patches/iter {list(spec.patches_range)}, sw batch {list(spec.sw_range)}"
        )
        started = time.perf_counter()
        record = _search(study, cfg, spec, devices, ctx)
        record["batch"] = batch_report(record, batch_cap, _predicted_fit(record.pop("_train_curve", None), batch_cap,
                                                                         ctx.budget))
        record.update(
            study_name=study_name,
            storage=ctx.shown_storage,
            strategy=ctx.strategy,
            memory_limit=ctx.limit,
            margin=ctx.margin,
            budget_bytes=ctx.budget,
            device=ctx.info["device"],
            device_name=ctx.info["device_name"],
            device_total_memory=ctx.info["device_total_memory"],
            wall_seconds=round(time.perf_counter() - started, 3),
            date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            key=key.as_dict(),
            from_storage=False,
        )
        if ctx.target is not None:
            record["target"] = dict(ctx.target)
        from autotune.search.story import tell_story

        tell_story(study, record)  # the dashboard's note and memory plots
        if record["status"] == "tuned":
            study.set_user_attr(tag, {k: v for k, v in record.items() if k != "from_storage"})
        return record
    finally:
        if exclusive:
            ctx.claims.release(study_name, "key:" + tag, done=False)


def _predicted_fit(curve: Any, batch_cap: Mapping[str, Any], budget: int) -> int | None:
    """The estimator's largest fit over the template's whole range (the cap may stop the search below it)."""
    from autotune.search.edge import largest_under

    whole = batch_cap.get("template_range") or batch_cap.get("range")
    if curve is None or not whole:
        return None
    try:
        return int(largest_under(curve, int(whole[0]), int(whole[1]), budget))
    except Exception:  # noqa: BLE001 - the estimate only explains the cap; its failure costs nothing
        return None


def _search(
    study: Any, cfg: Mapping[str, Any], spec: AlgoSpec, devices: tuple[str, ...], ctx: _Context
) -> dict[str, Any]:
    from autotune.search.evaluate import Evaluator
    from autotune.search.probers import EstimateProber, ProbeProber
    from autotune.search.strategy import distributions, run_fast, run_tpe

    bundle = cfg["bundle_root"]
    scale, offset = ctx.allowance.affine()
    if ctx.estimate_only:
        prober: Any = EstimateProber(bundle, ctx.device, ctx.budget, scale=scale, offset=offset)
    else:
        prober = ProbeProber(
            bundle, ctx.device, ctx.limit, timeout=ctx.timeout, env=ctx.probe_env, scale=scale, offset=offset
        )
    evaluator = Evaluator(
        study, prober, ctx.budget, distributions(spec, devices), progress=ctx.say, label=cfg["algo"], claims=ctx.claims,
        objective=ctx.objective,
    )
    train_model = None
    if ctx.strategy == "tpe":
        outcome = run_tpe(evaluator, spec, devices, seed=int(cfg.get("seed", 0)), objective=ctx.objective)
    else:
        from autotune.search.story import search_curves

        train_model, infer_model_for = search_curves(study, prober)
        outcome = run_fast(evaluator, spec, devices, train_model, infer_model_for, ctx.objective)
    record: dict[str, Any] = {
        "algo": cfg["algo"],
        "objective": ctx.objective,
        "method": "measured" if prober.measured else "estimated",
        "probes": evaluator.probes,
        "reused_points": evaluator.reused,
        "trials": evaluator.trial_numbers,
    }
    record["_train_curve"] = train_model  # read (and dropped) by _predicted_fit
    if outcome.num_patches_per_iter is None:
        record.update(status="infeasible", reason=(
            f"even {spec.patches_range[0]} patch(es) per iteration does not fit in the budget; "
            "raise --memory-limit, lower the roi or use a smaller network"))
        return record
    if outcome.num_sw_batch_size is None:
        record.update(status="infeasible", reason=(
            f"training fits with {outcome.num_patches_per_iter} patches per iteration but no sliding-window "
            "batch size fits on any validation device; raise --memory-limit"))
        return record
    train_res = outcome.train.result if outcome.train else {}
    infer_res = outcome.infer.result if outcome.infer else {}
    record.update(
        status="tuned",
        num_patches_per_iter=outcome.num_patches_per_iter,
        max_num_patches_per_iter=outcome.max_num_patches_per_iter,
        num_sw_batch_size=outcome.num_sw_batch_size,
        validation_device=outcome.validation_device,
        sw_input_on_cpu=bool(ctx.device.startswith("cuda") and outcome.validation_device == "cpu"),
        train_trial=outcome.train.trial_number if outcome.train else None,
        infer_trial=outcome.infer.trial_number if outcome.infer else None,
        train_peak_bytes=train_res.get("train_peak_bytes") or train_res.get("peak_bytes"),
        peak_bytes=max(int(train_res.get("peak_bytes") or 0), int(infer_res.get("peak_bytes") or 0)) or None,
        infer_peak_bytes=infer_res.get("infer_peak_bytes") or infer_res.get("peak_bytes"),
        samples_per_s=train_res.get("samples_per_s"),
        sw_seconds_per_volume=infer_res.get("sw_seconds_per_volume"),
    )
    if ctx.device.startswith("cuda"):
        from dataclasses import asdict

        from autotune.probe.allowances import is_calibrated

        record["allowances"] = asdict(ctx.allowance)
        record["allowances_validated_on_gpu"] = is_calibrated(ctx.allowance)
    return record


def _write_back(
    path: str, cfg: Mapping[str, Any], record: Mapping[str, Any], write_back: bool, say: Callable[[str], None]
) -> dict[str, Any]:
    result = {"bundle": path, **record}
    if record.get("status") != "tuned":
        say(f"[{record.get('algo')}] {Path(path).name}: not tuned: {record.get('reason', record.get('status'))}")
        return result
    updates: dict[str, Any] = loader_settings(record["num_patches_per_iter"], cfg.get("num_crops_per_image", 1))
    updates["num_sw_batch_size"] = int(record["num_sw_batch_size"])
    updates["sw_input_on_cpu"] = bool(record["sw_input_on_cpu"])
    handed = handoff_updates(cfg, int(record["num_patches_per_iter"]))  # lr and schedule follow the batch
    provenance = {k: v for k, v in record.items() if k not in ("from_storage",)}
    provenance["recipe"] = handed.pop("record")
    updates.update(handed)
    updates["tuning"] = provenance
    result.update(updates)
    if write_back:
        update_bundle_config(path, updates)
    return result
