"""Tune bundles: group them by tuning key, search each key once, write the values back.

    tune_bundles(["work/dints_0", "work/dints_1"], device="cuda:0", memory_limit="8GiB")

Folds of one algorithm share a key, so one search serves them all. Each key's study
keeps every evaluated point; a rerun after an interruption resumes from it, and a
finished key answers from storage with no new trial. One key's search is
``autotune.search.keysearch``; the write-back is ``autotune.search.writeback``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.bundles.config import bundle_config_path, load_bundle_config
from autotune.errors import SpecError
from autotune.files import atomic_write_json
from autotune.search.keysearch import tune_key
from autotune.search.liveness import TakenOver
from autotune.search.session import Budget, Session, Store
from autotune.search.space import parse_specs
from autotune.search.writeback import check_writable, loader_settings, write_bundle
from autotune.utils import format_bytes, look_up_option, parse_bytes

__all__ = ["STRATEGIES", "tune_bundles", "loader_settings", "DEFAULT_MARGIN"]

STRATEGIES = ("fast", "tpe", "estimate")
DEFAULT_MARGIN = 0.10


def _print(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


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
    handoff: str = "goodput",
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
        handoff: ``goodput`` (default: hand over the largest fit only when it is predicted faster to a
            target accuracy than the template's batch, ``autotune.search.goodput``) or ``largest``
            (the search's batch, as before the rule).

    Returns:
        One result per bundle (dicts; ``status`` is ``tuned``, ``infeasible`` or ``unsupported``).

    Raises:
        SpecError: bad specs, strategy, objective, hand-off, margin or memory limit.
        StorageError: the storage cannot be opened.
    """
    say = progress or (lambda _line: None)
    strategy = look_up_option(strategy, STRATEGIES, "strategy", SpecError)
    from autotune.search.objective import OBJECTIVES

    objective = look_up_option(objective, OBJECTIVES, "objective", SpecError)
    from autotune.search.goodput import HANDOFFS

    handoff = look_up_option(handoff, HANDOFFS, "handoff", SpecError)
    if strategy == "estimate":  # the fast search, answered by the estimator alone
        strategy, estimate_only = "fast", True
    if not bundles:
        raise SpecError("no bundle to tune; run 'autotune generate' first")
    configs = {str(Path(b)): load_bundle_config(b) for b in bundles}
    if write_back:
        check_writable([bundle_config_path(p).parent for p in configs])
    if summary_path:
        check_writable([Path(summary_path).parent])
    explicit = parse_specs(specs, sorted({cfg["algo"] for cfg in configs.values()}))
    budget = _budget(device, memory_limit, margin, target)
    session = Session(budget, _open_store(storage, workers_share, timeout), strategy, objective, estimate_only,
                      timeout, explicit, probe_env, say, handoff)
    from autotune.search.study import make_key

    groups: dict[str, list[str]] = {}
    keys: dict[str, Any] = {}
    records: dict[str, dict[str, Any]] = {}
    try:
        from autotune.precision import resolve_precision

        said: set[str] = set()
        for path, cfg in configs.items():
            key = make_key(cfg, budget.info, budget.limit, strategy + ("-estimate" if estimate_only else ""), objective)
            groups.setdefault(key.study_name, []).append(path)
            keys[key.study_name] = key
            line = resolve_precision(bool(cfg.get("amp", False)), budget.info["device"]).line()
            if line not in said:  # decided once per process; said once per run
                said.add(line)
                say(line + (", for the GPU planned for" if budget.target is not None else ""))
        pending: list[str] = []
        for study_name, paths in groups.items():
            try:
                record = tune_key(session, keys[study_name], configs[paths[0]], len(paths), wait=False)
            except TakenOver as exc:  # this worker hung past its promise: the taker's result is awaited
                say(f"[{configs[paths[0]]['algo']}] {exc}")
                record = None
            if record is None:
                pending.append(study_name)
            else:
                records[study_name] = record
        for study_name in pending:  # keys other workers hold: wait for their results (or take over)
            paths = groups[study_name]
            records[study_name] = tune_key(session, keys[study_name], configs[paths[0]], len(paths), wait=True)
    finally:
        session.store.liveness.close()
    results = [write_bundle(path, configs[path], records[study_name], write_back, say)
               for study_name, paths in groups.items() for path in paths]
    if summary_path:
        atomic_write_json(summary_path, {"results": results})
    return results


def _budget(device: str, memory_limit: int | str | None, margin: float, target: Mapping[str, Any] | None) -> Budget:
    """The device tuned for and its budget: the limit less the margin and the allowances."""
    from autotune.device import device_info
    from autotune.probe.allowances import allocator_budget, allowance_from_record

    if not isinstance(margin, (int, float)) or not 0.0 <= float(margin) < 1.0:
        raise SpecError(f"margin must be in [0, 1), got {margin!r}")
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
    allowance = allowance_from_record(target, device)
    budget = allocator_budget(limit, float(margin), allowance)
    if budget <= 0:
        raise SpecError(f"memory limit {format_bytes(limit)} leaves nothing after the margin and allowances")
    return Budget(device, info, limit, float(margin), budget, allowance, target)


def _open_store(storage: str | None, workers_share: bool, timeout: float) -> Store:
    """Open the storage and this run's liveness there (and claims when workers share it)."""
    from autotune.search.claims import ClaimStore
    from autotune.search.liveness import Liveness, owner_tag, stale_after_default
    from autotune.search.study import default_storage_url, open_storage, redact_url

    url = storage or default_storage_url()
    stale_after = stale_after_default()  # a bad setting is refused before the storage is touched
    opened = open_storage(url)
    liveness = Liveness(url, owner_tag(), stale_after=stale_after, promise=timeout)
    return Store(opened, redact_url(url), liveness, ClaimStore(liveness) if workers_share else None)
