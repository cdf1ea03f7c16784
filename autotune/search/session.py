"""What one tuning run holds, built once by ``tune_bundles`` and read by each key's search.

- ``Budget``: where the probes run and what memory they may use (limit, margin, allowances);
- ``Store``: where the results go and who else works on them (storage, liveness, claims);
- ``Session``: both, with the method (strategy, objective, hand-off, timeout) and the specs per algorithm.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import optuna

    from autotune.probe.allowances import CudaAllowance
    from autotune.search.claims import ClaimStore
    from autotune.search.liveness import Liveness

__all__ = ["Budget", "Store", "Session"]


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
        liveness: this run's heartbeat (``autotune.search.liveness``).
        claims: key and point claims when workers share the storage, else None.
    """

    storage: optuna.storages.BaseStorage
    shown: str
    liveness: Liveness
    claims: ClaimStore | None = None


@dataclass
class Session:
    """One ``tune_bundles`` call: budget, storage, method and specs."""

    budget: Budget
    store: Store
    strategy: str
    objective: str
    estimate_only: bool
    timeout: float
    explicit: dict[str, dict[str, Any]]
    probe_env: Mapping[str, str] | None = None
    say: Callable[[str], None] = lambda _line: None
    handoff: str = "goodput"  # the batch handed to training: goodput rule or largest fit (autotune.search.goodput)
