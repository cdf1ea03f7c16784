"""A calibration's stated bound on the estimator's over-prediction, and what it settles.

Where a calibration file (``autotune.probe.calibration``) states ``max_over_prediction`` for the
device (and template), the device's peak at n is at least ``estimate(n) / (1 + bound)``; the
fast search then settles the check one above a measured fit without a probe where the estimate
there exceeds the budget by more than the bound. ``$AUTOTUNE_PROBE_EDGE=1`` probes it anyway.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.search.curves.sparse import sparse_of

if TYPE_CHECKING:
    from autotune.bundles.model import BundleConfig

__all__ = ["PROBE_EDGE_ENV", "probe_edge_forced", "edge_bound", "over_by_bound", "bound_held"]

#: set to 1 to probe N+1 even where a calibration states a bound (trust no estimate at the edge)
PROBE_EDGE_ENV = "AUTOTUNE_PROBE_EDGE"


def probe_edge_forced() -> bool:
    """True when ``$AUTOTUNE_PROBE_EDGE`` asks for a real probe one above every measured fit."""
    from autotune.checks.environment import setting

    return bool(setting(PROBE_EDGE_ENV))


def edge_bound(device_name: str | None, measured: bool, template: str | None = None, allowance: Any = None,
               config: BundleConfig | None = None, device: str = "cuda:0") -> dict[str, Any] | None:
    """The over-prediction bound that settles N+1 for a bundle, or None (probe N+1).

    Only for real probes on a device with a calibration file that states one. On CUDA, where the
    calibration was validated out of sample (``allowance.bounds``), the bound of the bundle's situation
    (``CudaAllowance.factors_for``: inside the fit's domain, the template's; outside it, that of the raw
    estimator with the allocator's rules on templates the fit never saw); else the file's stated bound
    (``max_over_prediction``: a version-2 GPU file's, or the CPU's ``calibrations/cpu.json`` from
    ``benchmarks/calibrate_cpu.py``), ``template``'s own where stated. ``$AUTOTUNE_PROBE_EDGE=1`` ignores any
    bound."""
    if not measured or probe_edge_forced():
        return None
    if allowance is not None and config is not None and getattr(allowance, "bounds", None):
        _, check = allowance.factors_for(config, device)
        found = allowance.bound_for(check, template)
        if found is not None:
            return {"bound": found["max_over"], "scope": f"{found['source']}; {check.why}",
                    "calibration": str(allowance.source), "gpu_name": device_name}
    from autotune.probe import stated_bound

    return stated_bound(device_name, template=template)


def over_by_bound(model: Any, n: int, budget: float, bound: float) -> bool:
    """True when the estimate at ``n`` exceeds ``budget`` by more than the bound.

    The bound holds for estimates, not for a curve read between them: with a ``SparseCurve`` under
    ``model``, ``n`` must be estimated (a pass left, or known), else the answer is False (probe)."""
    sparse = sparse_of(model)
    try:
        if sparse is not None and not sparse.spend(n, reserve=True):
            return False
        return model.predict(n) / (1.0 + float(bound)) > budget
    except Exception:  # noqa: BLE001 - no estimate: probe
        return False


def bound_held(model: Any, peak: int | None, n: int, bound: float) -> bool:
    """True when the measured ``peak`` at ``n`` is no further under the estimate than the bound allows:
    the probe at the edge checks the estimate the bound is then applied to, one above it. Where ``n``
    was not estimated (a ``SparseCurve`` reads it between estimates) there is nothing to check it
    against, and the calibration's word stands."""
    if peak is None:
        return False
    sparse = sparse_of(model)
    if sparse is not None and not sparse.estimated(n):
        return True
    try:
        return float(peak) >= model.predict(n) / (1.0 + float(bound))
    except Exception:  # noqa: BLE001 - no estimate: probe
        return False
