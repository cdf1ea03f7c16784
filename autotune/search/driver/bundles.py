"""Tune bundles: group them by tuning key, answer each key once, write the values back.

Folds of one algorithm share a key, so one search serves them all. Each key's study keeps
every evaluated point; a rerun after an interruption resumes from it, and a finished key
answers from storage with no new trial. One key is ``autotune.search.driver.key``; the
write-back ``autotune.search.driver.writeback``. The public entry is ``autotune.tune``
(``autotune/stages.py``), which resolves the device and the target GPU and calls
``search_bundles``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.bundles.config import Bundle, load_bundle
from autotune.bundles.result import TuningResult
from autotune.errors import ConfigError, SpecError
from autotune.search.driver.key import answer_key
from autotune.search.driver.options import TuningOptions
from autotune.search.driver.session import Session, close_store, make_budget, open_store
from autotune.search.driver.writeback import check_writable, write_bundle
from autotune.search.storage.liveness import TakenOver
from autotune.search.strategies.registry import STRATEGIES as _REGISTRY
from autotune.search.strategies.registry import Strategy, strategy_of
from autotune.search.strategies.space import parse_specs
from autotune.utils import look_up_option

__all__ = ["STRATEGIES", "SearchSettings", "check_method", "known_templates", "search_bundles"]

STRATEGIES = tuple(_REGISTRY)


@dataclass(frozen=True)
class SearchSettings:
    """How to search: the options as ``autotune.tune`` resolved them (the device; see there for each) and
    this run's place (the target GPU planned for, workers sharing the storage, whether bundles are written)."""

    options: TuningOptions
    target: Mapping[str, Any] | None = None
    workers_share: bool = False
    write_back: bool = True
    estimate_only: bool = False  # answer every point from the estimator, whatever the strategy


def _checked_method(settings: SearchSettings) -> tuple[Strategy, TuningOptions]:
    """The strategy, and the options with the objective and hand-off checked against their valid names."""
    from autotune.search.handoff import HANDOFFS
    from autotune.search.strategies.objective import OBJECTIVES

    options = settings.options
    strategy = strategy_of(options.strategy)  # a name (the CLI's) or the object given
    objective = look_up_option(options.objective, OBJECTIVES, "objective", SpecError)
    handoff = look_up_option(options.handoff, HANDOFFS, "handoff", SpecError)
    return (strategy.estimated() if settings.estimate_only else strategy,
            options.replace(objective=objective, handoff=handoff))


def _group(bundles: Mapping[str, Bundle], session: Session) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Bundles by tuning key's study name, and the keys; says the precision once per run."""
    from autotune.precision import for_config
    from autotune.search.storage.study import make_key

    budget = session.budget
    groups: dict[str, list[str]] = {}
    keys: dict[str, Any] = {}
    said: set[str] = set()
    for path, bundle in bundles.items():
        key = make_key(bundle.config, budget.info, budget.limit, session.strategy.key_name, session.objective,
                       session.strategy.joint)
        groups.setdefault(key.study_name, []).append(path)
        keys[key.study_name] = key
        line = for_config(bundle.config, budget.info["device"]).line()
        if line not in said:
            said.add(line)
            session.say(line + (", for the GPU planned for" if budget.target is not None else ""))
    return groups, keys


def _studies(session: Session) -> dict[str, dict[str, Any]]:
    """Every study of the storage, by name, with its user attributes: one call, however many keys."""
    return {s.study_name: s.user_attrs for s in session.store.storage.get_all_studies()}


def _answer_all(session: Session, bundles: Mapping[str, Bundle], groups: Mapping[str, list[str]],
                keys: Mapping[str, Any]) -> dict[str, TuningResult]:
    """Each key's result: the keys this worker can take first, then those other workers started.

    With workers sharing the storage, one read of every study says which keys are done (answered at once)
    and which another worker has started (left for later, so a worker passing by costs the storage nothing);
    this worker claims and searches the others, then waits for the started ones one at a time (taking over
    any whose worker is not live)."""
    records: dict[str, TuningResult] = {}
    shared = session.store.workers_share
    order = list(groups)
    if shared and order:  # workers that start together begin at different keys
        import zlib

        start = zlib.crc32(session.store.liveness.owner.encode()) % len(order)
        order = order[start:] + order[:start]
    seen = _studies(session) if shared else {}
    pending: list[str] = []
    for study_name in order:
        record = _answer(session, bundles, groups, keys, study_name, False, seen.get(study_name) if shared else None)
        if record is None:
            pending.append(study_name)
            if study_name not in seen:  # started since the read: others started too, read again (one call, not a
                seen = _studies(session)  # claim asked of every key: hundreds of workers start together)
        else:
            records[study_name] = record
            if shared and not record.from_storage:
                seen = _studies(session)  # a search took minutes: read again what the others did
    while pending:  # keys other workers started: answer those done, wait for the next (or take it over)
        seen = _studies(session)
        waiting = []
        for study_name in pending:
            record = _answer(session, bundles, groups, keys, study_name, False, seen.get(study_name) or {})
            if record is None:
                waiting.append(study_name)
            else:
                records[study_name] = record
        if waiting:
            record = _answer(session, bundles, groups, keys, waiting[0], True, None)
            if record is not None:  # None: this worker was taken over meanwhile; it waits for the taker's result
                records[waiting.pop(0)] = record
        pending = waiting
    return records


def _answer(session: Session, bundles: Mapping[str, Bundle], groups: Mapping[str, list[str]],
            keys: Mapping[str, Any], study_name: str, wait: bool, known: Mapping[str, Any] | None
            ) -> TuningResult | None:
    """``answer_key`` for one key; None while another worker holds it (and not ``wait``)."""
    paths = groups[study_name]
    first = bundles[paths[0]].config
    try:
        return answer_key(session, keys[study_name], first, len(paths), wait=wait, known=known)
    except TakenOver as exc:  # this worker hung past its promise: the taker's result is awaited
        session.say(f"[{first.algo}] {exc}")
        return None


def known_templates() -> list[str]:
    """Every template name a specs key may give: autotune's own templates and MONAI's (its known versions)."""
    from autotune.families import template_names

    return template_names()


def check_method(specs: Mapping[str, Any] | None, algos: Sequence[str], settings: SearchSettings
                 ) -> tuple[Strategy, TuningOptions, dict[str, dict[str, Any]], Any]:
    """The strategy, the options, the specs per algorithm of ``algos`` and the budget, checked, and the storage
    checked as far as it can be without writing to it (``check_storage``): ``run`` asks this before its
    analysis writes anything.

    Raises:
        SpecError: bad specs, strategy, objective, hand-off, margin or memory limit.
        StorageError: the storage cannot be opened.
    """
    from autotune.search.storage.study import check_storage

    strategy, options = _checked_method(settings)
    explicit = parse_specs(specs, sorted(set(algos)), known_templates())
    budget = make_budget(options.device, options.memory_limit, options.margin, settings.target)
    check_storage(options.storage)
    return strategy, options, explicit, budget


def search_bundles(bundles: Sequence[str | Path], specs: Mapping[str, Any] | None, settings: SearchSettings,
                   say: Callable[[str], None], summary_path: str | Path | None = None) -> list[dict[str, Any]]:
    """Tune ``bundles`` with ``settings``; write the tuned values (with the ``tuning:`` plan) into each.

    Everything is checked before the storage is opened (its first write): the bundles and the data each is
    given (``autotune.data.bundle_fit``), the folders written, the specs, the budget and the storage's URL.

    Returns:
        One record per bundle (``status``: ``tuned``, ``infeasible`` or ``unsupported``).

    Raises:
        SpecError: bad specs, strategy, objective, hand-off, margin or memory limit.
        ConfigError: a bundle is missing or malformed, or a folder cannot be written.
        DataError: a bundle's data does not fit it (channels, spatial dimensions, classes).
        StorageError: the storage cannot be opened.
    """
    from autotune.data.bundle_fit import check_bundle_data
    from autotune.files import atomic_write_json

    _checked_method(settings)
    if not bundles:
        raise SpecError("no bundle to tune; run 'autotune generate' first")
    loaded = {str(Path(b)): load_bundle(b) for b in bundles}
    for bundle in loaded.values():
        check_bundle_data(bundle.config, bundle.config_path)
    check_writable([b.config_path.parent for b in loaded.values()] if settings.write_back else [])
    if summary_path and Path(summary_path).is_dir():
        raise ConfigError(f"{summary_path}: is a folder; give --summary a file name, e.g. {Path(summary_path) / 'summary.json'}")
    check_writable([Path(summary_path).parent] if summary_path else [])
    strategy, options, explicit, budget = check_method(specs, [b.config.algo for b in loaded.values()], settings)
    session = Session(budget, open_store(options.storage, settings.workers_share, options.timeout), strategy,
                      options, explicit, say)
    try:
        groups, keys = _group(loaded, session)
        records = _answer_all(session, loaded, groups, keys)
    finally:
        close_store(session.store)
    results = [write_bundle(path, loaded[path], records[name], settings.write_back, say)
               for name, paths in groups.items() for path in paths]
    if summary_path:
        from autotune.files import make_folder

        make_folder(Path(summary_path).parent, "the summary's folder")
        atomic_write_json(summary_path, {"results": results})
    return results
