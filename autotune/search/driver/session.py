"""What one tuning run holds, built once by ``search_bundles`` and read by each key's search.

- ``Budget``: where the probes run and what memory they may use (limit, margin, allowances);
- ``Store``: where the results go and who else works on them (storage, liveness, claims);
- ``Session``: both, with the method (the strategy, and the objective, hand-off and timeout of the
  run's ``TuningOptions``) and the specs per algorithm.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autotune.errors import SpecError
from autotune.utils import format_bytes, parse_bytes

if TYPE_CHECKING:  # pragma: no cover
    import optuna

    from autotune.probe import CudaAllowance
    from autotune.search.driver.options import TuningOptions
    from autotune.search.storage.claims import ClaimStore
    from autotune.search.storage.liveness import Liveness
    from autotune.search.strategies.registry import Strategy

__all__ = ["DEFAULT_MARGIN", "Budget", "Store", "Session", "make_budget", "open_store", "close_store"]

DEFAULT_MARGIN = 0.10


@dataclass(frozen=True)
class Budget:
    """The device and its memory budget.

    Attributes:
        device: where probes run (``cpu``, ``cuda:N``).
        info: ``device``, ``device_name`` and ``device_total_memory`` of the device tuned for.
        limit: the memory limit in bytes.
        margin: share of the limit kept free.
        budget: what a point may use: the limit less the margin and the allowances.
        allowance: the device allowances (allocator slack, workspaces) the estimates are corrected by.
        target: the GPU planned for without a probe (``--target-gpu``), or None.
    """

    device: str
    info: Mapping[str, Any]
    limit: int
    margin: float
    budget: int
    allowance: CudaAllowance
    target: Mapping[str, Any] | None = None


@dataclass
class Store:
    """The storage and this run's place among the workers on it.

    Attributes:
        storage: the Optuna storage this run opened.
        shown: its URL with any password hidden (for messages and the provenance).
        liveness: this run's heartbeat (``autotune.search.storage.liveness``).
        claims: key and point claims (every run takes them, so runs on one storage never probe a point
            twice), or None (a store opened without them, as some tests do).
        workers_share: this run is one of many workers (``autotune worker``): it starts at a key of its own and
            leaves keys another started for later, and its TPE sampler is seeded apart from the others'.
    """

    storage: optuna.storages.BaseStorage
    shown: str
    liveness: Liveness
    claims: ClaimStore | None = None
    workers_share: bool = False
    study_ids: dict[str, int] = field(default_factory=dict)  # study name -> id, once looked up


@dataclass
class Session:
    """One tuning run: budget, storage, method and specs.

    Attributes:
        strategy: the search (``autotune.search.strategies.registry``; ``estimate`` is ``fast``'s search
            answered by the estimator alone).
        options: the run's options, checked (``autotune.search.driver.options``): ``objective``
            (``max-batch`` or ``throughput``), ``handoff`` (``goodput`` or ``largest``), ``timeout``, ``probe_env``.
        explicit: the specs given per algorithm (``autotune.search.strategies.space.parse_specs``).
    """

    budget: Budget
    store: Store
    strategy: Strategy
    options: TuningOptions
    explicit: dict[str, dict[str, Any]]
    say: Callable[[str], None] = lambda _line: None

    @property
    def objective(self) -> str:
        return self.options.objective

    @property
    def handoff(self) -> str:
        return self.options.handoff

    @property
    def timeout(self) -> float:
        return self.options.timeout

    @property
    def probe_env(self) -> Mapping[str, str] | None:
        return self.options.probe_env


def make_budget(device: str, memory_limit: int | str | None, margin: float,
                target: Mapping[str, Any] | None) -> Budget:
    """The device tuned for (or the ``target`` GPU planned for) and its budget: the limit less the margin
    and the allowances.

    Raises:
        SpecError: a margin outside [0, 1), a limit above the device's memory, or nothing left.
    """
    from autotune.device import device_info
    from autotune.probe import allocator_budget, allowance_from_record

    if not isinstance(margin, (int, float)) or not 0.0 <= float(margin) < 1.0:
        raise SpecError(f"margin must be in [0, 1), got {margin!r}")
    if target is not None:
        device = str(target.get("device", "cuda:0"))
        info = {"device": device, "device_name": str(target["name"]), "device_total_memory": int(target["memory"])}
    else:
        info = device_info(device)
    limit = parse_bytes(memory_limit, "memory limit") if memory_limit is not None else info["device_total_memory"]
    if limit > info["device_total_memory"]:
        raise SpecError(f"memory limit {format_bytes(limit)} is above the {info['device_name']}'s "
                        f"{format_bytes(info['device_total_memory'])}; pass a smaller --memory-limit")
    allowance = allowance_from_record(target, device)
    budget = allocator_budget(limit, float(margin), allowance)
    if budget <= 0:
        raise SpecError(f"memory limit {format_bytes(limit)} leaves nothing after the margin and allowances")
    return Budget(device, info, limit, float(margin), budget, allowance, target)


def open_store(storage: str | None, workers_share: bool, timeout: float) -> Store:
    """Open the storage and this run's liveness and claims there: a plain run claims the keys and points it
    searches as a worker does, so two runs started together on one storage probe no point twice.

    Raises:
        SpecError: a bad ``$AUTOTUNE_CLAIM_STALE_SECONDS`` (before the storage is touched).
        StorageError: the storage cannot be opened, or a worker of an earlier autotune is live on it.
    """
    from autotune.search.storage.claims import ClaimStore
    from autotune.search.storage.legacy import refuse_live_legacy_workers
    from autotune.search.storage.liveness import Liveness, owner_tag, stale_after_default
    from autotune.search.storage.study import default_storage_url, open_storage, redact_url

    url = storage or default_storage_url()
    stale_after = stale_after_default()
    opened = open_storage(url)
    refuse_live_legacy_workers(opened, redact_url(url), stale_after)
    liveness = Liveness(opened, owner_tag(), stale_after=stale_after, promise=timeout)
    return Store(opened, redact_url(url), liveness, ClaimStore(liveness), workers_share)


def close_store(store: Store) -> None:
    """Give back what this run holds and close its worker trial."""
    if store.claims is not None:
        store.claims.release_all()
    store.liveness.close()
