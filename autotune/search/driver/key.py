"""One tuning key: answer from storage, or claim the key, search it and store the result.

A strategy that claims the key (fast, estimate) searches it in one worker: with workers sharing a
storage the others wait for its stored result (or take the key over when its holder is not live,
``autotune.search.storage.liveness``). One that shares points (tpe) shares its study point by point.
The search itself (prober, evaluator, strategy) is ``autotune.search.driver.strategy_run``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.bundles.result import TuningResult
from autotune.families import family_for
from autotune.search.driver.session import Session
from autotune.search.driver.strategy_run import search_key
from autotune.search.handoff import batch_report, cap_range
from autotune.search.storage.study import TuningKey, open_study
from autotune.search.strategies.objective import metric_name
from autotune.search.strategies.space import AlgoSpec, spec_for
from autotune.utils import format_bytes

if TYPE_CHECKING:
    from autotune.bundles.model import BundleConfig

__all__ = ["answer_key", "result_tag", "validation_devices", "MAX_POLL_SECONDS"]

MAX_POLL_SECONDS = 15.0  # the longest pause between two looks at a key another worker holds
SEEN = "training_oom_seen"  # in a stored result: the training failures of the key's study it was searched after


def result_tag(strategy: str, margin: float, spec: AlgoSpec, devices: tuple[str, ...], estimate_only: bool,
               handoff: str, reference: Mapping[str, Any] | None = None) -> str:
    """The study attribute holding the result of a search with these settings.

    ``strategy``: the search's name (``Strategy.name``: ``estimate`` is ``fast`` with ``estimate_only``).
    ``handoff``: ``largest`` is left out of the hash (the tags stored before the hand-off was an option).
    ``reference``: a MONAI bundle's hand-off reference (its template's stated batch and lr rule), read from
    the bundle rather than fixed by an autotune template, so part of what the stored verdict depends on."""
    settings: dict[str, Any] = {"strategy": strategy, "margin": margin, "spec": spec.as_dict(), "devices": devices,
                                "estimate": estimate_only}
    if handoff != "largest":  # "largest" is the tag's default: left out of it
        settings["handoff"] = handoff
        if reference is not None:
            settings["reference"] = [int(reference["reference_batch"]), str(reference["lr_scaling"])]
    blob = json.dumps(settings, sort_keys=True)
    return "result:" + hashlib.sha256(blob.encode()).hexdigest()[:12]


def validation_devices(spec: AlgoSpec, device: str) -> tuple[str, ...]:
    """On the CPU the volume is on the compute device either way: one search, not two."""
    if not device.startswith("cuda"):
        return ("device",)
    return spec.validation_devices


def _open(session: Session, key: TuningKey, phase: str | None = None, sampler: Any = None) -> Any:
    """Open (or create) the key's study of ``phase`` (default its own), its values named by the objective."""
    phase = phase or session.strategy.phase
    return open_study(session.store.storage, key, sampler=sampler, phase=phase,
                      metric=metric_name(session.objective, phase))


def _sampler(session: Session, config: BundleConfig, spec: AlgoSpec) -> Any:
    """The strategy's sampler of the key's study (None: Optuna's default)."""
    return session.strategy.sampler(config.seed, spec, session.store.workers_share)


def _stored_result(session: Session, key: TuningKey, tag: str) -> dict[str, Any] | None:
    """The key's stored result, read without opening its study (one call of the storage once its study's id is
    known; none is written)."""
    storage = session.store.storage
    study_id = session.store.study_ids.get(key.study_name)
    if study_id is None:
        try:
            study_id = session.store.study_ids[key.study_name] = storage.get_study_id_from_name(key.study_name)
        except KeyError:
            return None
    return storage.get_study_user_attrs(study_id).get(tag)


def _stored_or_claimed(session: Session, key: TuningKey, tag: str, wait: bool,
                       algo: str) -> tuple[bool, dict[str, Any] | None]:
    """(True, stored result) once the result is stored, or (True, None) once this worker holds the key;
    (False, None) when another worker holds it and not ``wait``. Nothing is opened or written while another
    worker holds the key. A waiter looks for the result with a growing pause (up to ``MAX_POLL_SECONDS``) and
    asks for the claim (to take over a key whose worker is not live) at most every half grace."""
    claims = session.store.claims if session.strategy.claims_key else None
    announced, pause, asked = False, 2.0, -float("inf")
    while True:
        session.store.liveness.progress()
        stored = _stored_result(session, key, tag)
        if stored is not None:
            return True, stored
        if claims is None:
            return True, None
        if time.monotonic() - asked >= session.store.liveness.stale_after / 2:
            asked = time.monotonic()
            if claims.claim(key.study_name, "key:" + tag):
                return True, None
        if not wait:
            holder = claims.holder(key.study_name, "key:" + tag) or {}
            session.say(f"[{algo}] {key.study_name} is being tuned by {holder.get('owner', 'another worker')}; "
                        "will wait")
            return False, None
        if not announced:
            session.say(f"[{algo}] waiting for another worker's result on {key.study_name}")
            announced = True
        time.sleep(pause)
        pause = min(pause * 1.5, MAX_POLL_SECONDS)  # a search takes minutes: hundreds of waiters poll gently


def _fail_stale(session: Session, studies: tuple[Any, ...], algo: str) -> None:
    """Mark RUNNING trials of ``studies`` whose worker is gone as failed, and say so."""
    for one in studies:
        stale = session.store.liveness.fail_stale_trials(session.store.storage, one) if one is not None else []
        if stale:
            session.say(f"[{algo}] marked stale RUNNING trials {stale} of {one.study_name} as failed "
                        "(their worker is gone)")


def _announce(session: Session, key: TuningKey, spec: AlgoSpec, n_bundles: int, algo: str) -> None:
    budget = session.budget
    session.say(
        f"[{algo}] tuning {key.study_name} ({n_bundles} bundle{'s' if n_bundles > 1 else ''}) on "
        f"{budget.info['device_name']}, strategy {session.strategy.label}, objective {session.objective}: "
        f"limit {format_bytes(budget.limit)}, budget {format_bytes(budget.budget)} (margin {budget.margin:.0%}), "
        f"patches/iter {list(spec.patches_range)}, sw batch {list(spec.sw_range)}"
    )


def _provenance(session: Session, key: TuningKey, infer_study: Any, started: float) -> dict[str, Any]:
    """Where and under what limit the key was searched: the record's provenance fields (``alloc_conf``: the CUDA
    allocator setting the probes ran under, ``autotune.cuda_alloc``)."""
    from autotune.cuda_alloc import alloc_conf

    budget = session.budget
    fields = {
        "study_name": key.study_name,
        "infer_study_name": infer_study.study_name if infer_study is not None else key.study_name,
        "storage": session.store.shown, "strategy": session.strategy.name, "memory_limit": budget.limit,
        "margin": budget.margin, "budget_bytes": budget.budget, "device": budget.info["device"],
        "device_name": budget.info["device_name"], "device_total_memory": budget.info["device_total_memory"],
        "precision": key.precision, "alloc_conf": alloc_conf(), "wall_seconds": round(time.perf_counter() - started, 3),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "key": key.as_dict(),
    }
    if budget.target is not None:
        fields["target"] = dict(budget.target)
    return fields


def answer_key(session: Session, key: TuningKey, config: BundleConfig, n_bundles: int,
               wait: bool, known: Mapping[str, Any] | None = None) -> TuningResult | None:
    """The key's result: from storage, or searched now; None when another worker holds it (and not ``wait``).

    ``known``: the user attributes of the key's study as just read (``get_all_studies``), when it exists: its
    stored result is then answered with no further call, and, without ``wait``, a key another worker has
    started is left for later without asking for its claim."""
    algo = config.algo
    if not config.tuning_supported:
        session.say(f"[{algo}] this template does not support tuning; bundles left as generated")
        return TuningResult("unsupported", reason="template does not support tuning", provenance={"algo": algo})
    spec, batch_cap = cap_range(spec_for(session.explicit[algo], config), config, session.say)
    devices = validation_devices(spec, session.budget.device)
    reference = family_for(config).handoff_reference(config)
    tag = result_tag(session.strategy.name, session.budget.margin, spec, devices, session.strategy.estimates_only,
                     session.handoff, reference)
    if known is not None and known.get(tag) is not None:
        ready, stored = True, known[tag]
    elif known is not None and not wait and session.store.claims is not None:
        return None  # started by another worker: waited for once this worker has tried every key not started
    else:
        ready, stored = _stored_or_claimed(session, key, tag, wait, algo)
    if not ready:
        return None
    study = None
    try:
        failures = _training_failures(session, key, known)
        if stored is not None and _refuted(session, stored, failures, algo):
            stored = None
        elif stored is None:
            study = _open(session, key, sampler=_sampler(session, config, spec))
            stored = study.user_attrs.get(tag)  # stored by a worker that let the key go just before this one took it
            stored = None if stored is not None and _refuted(session, stored, failures, algo) else stored
        if stored is not None:
            session.say(f"[{algo}] answered from storage ({key.study_name}); no new trial")
            return TuningResult.from_record({k: v for k, v in stored.items() if k != SEEN}).replace(
                from_storage=True, probes=0)
        study = study or _open(session, key, sampler=_sampler(session, config, spec))
        infer_study = None if session.strategy.joint else _open(session, key, "infer")
        _fail_stale(session, (study, infer_study), algo)
        _announce(session, key, spec, n_bundles, algo)
        started = time.perf_counter()
        result, train_curve = search_key(study, config, spec, devices, session, infer_study)
        batch = batch_report(result.as_record(), batch_cap, predicted_fit(train_curve, batch_cap, session.budget.budget))
        result = result.replace(batch=batch, **_provenance(session, key, infer_study, started))
        record = result.as_record()  # the one serialisation: the study keeps it, the dashboard's note reads it
        from autotune.search.dashboard.notes import tell_story

        tell_story(study, record, infer_study)
        if result.tuned:
            study.set_user_attr(tag, {**{k: v for k, v in record.items() if k != "from_storage"}, SEEN: len(failures)})
        return result
    finally:
        claims = session.store.claims if session.strategy.claims_key else None
        if claims is not None:
            claims.release(key.study_name, "key:" + tag)


def _training_failures(session: Session, key: TuningKey, known: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The training passes that ran out of memory under this key (``autotune.trainer.learn``), from its study."""
    attrs = known
    if attrs is None:
        study_id = session.store.study_ids.get(key.study_name)
        try:
            study_id = study_id if study_id is not None else session.store.storage.get_study_id_from_name(key.study_name)
        except KeyError:
            return []
        attrs = session.store.storage.get_study_user_attrs(study_id)
    return [dict(f) for f in attrs.get("training_oom") or []]


def _refuted(session: Session, stored: Mapping[str, Any], failures: list[dict[str, Any]], algo: str) -> bool:
    """True (said in a line) when training ran out of memory, after ``stored`` was searched, at a batch that
    ``stored`` says fits: the key is searched again, and its evaluator takes that batch as not fitting."""
    new = failures[int(stored.get(SEEN) or 0):]
    largest = int(stored.get("max_num_patches_per_iter") or stored.get("num_patches_per_iter") or 0)
    refuting = [f for f in new if int(f.get("num_patches_per_iter") or 0) <= largest]
    if not refuting:
        return False
    first = refuting[0]
    session.say(f"[{algo}] searched again: training ran out of memory at {first.get('num_patches_per_iter')} patches "
                f"per pass under {format_bytes(first.get('memory_limit'))} ({first.get('bundle')}, epoch "
                f"{first.get('epoch')}; trial #{first.get('trial')}), which the stored answer ({largest} fits) "
                "does not hold: that batch is not handed over again without a probe")
    return True


def predicted_fit(curve: Any, batch_cap: Mapping[str, Any], budget: int) -> int | None:
    """The estimator's largest fit at the budget (``EXTEND_LIMIT`` at most): over the template's whole range first
    (the cap may stop the search below it), then, when the range's top fits, past it by doubling, so that the
    report can say what memory would hold when the range stopped the search."""
    from autotune.search.curves.edge import largest_under
    from autotune.search.curves.sparse import bisect_fits
    from autotune.search.handoff import EXTEND_LIMIT

    whole = batch_cap.get("template_range") or batch_cap.get("range")
    if curve is None or not whole:
        return None
    try:
        top = int(whole[1])
        found = int(largest_under(curve, int(whole[0]), top, budget))
        if found < top:
            return found
        lo = top
        while lo < EXTEND_LIMIT and curve.predict(min(2 * lo, EXTEND_LIMIT)) <= budget:
            lo = min(2 * lo, EXTEND_LIMIT)
        if lo >= EXTEND_LIMIT:
            return EXTEND_LIMIT
        return int(bisect_fits(curve.predict, lo, min(2 * lo, EXTEND_LIMIT), budget))
    except Exception:  # noqa: BLE001 - the estimate only explains the cap; its failure costs nothing
        return None
