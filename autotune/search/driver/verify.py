"""``autotune verify``: check a tuned (or planned) bundle's plan on the real device.

Runs one probe at the values the bundle holds (a person may have edited them since the plan was made)
and one with a patch more per iteration than the largest fit,
compares the estimate with the measured peak, and rewrites the plan's provenance to ``measured``
when the plan holds; when it does not, retunes with the fast strategy (unless told not to). The
bundle is loaded once (``autotune.bundles.config.load_bundle``) and its config handed to the probe
and the estimator.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Mapping
from typing import Any

from autotune.bundles.config import Bundle, update_bundle_config
from autotune.bundles.plan import TuningPlan
from autotune.errors import ConfigError
from autotune.search.driver.session import Budget, make_budget
from autotune.tunables import Point, bundle_values
from autotune.utils import format_bytes

__all__ = ["verify_plan"]


def _values(bundle: Bundle) -> Point:
    """The point the bundle holds: each tunable's value in its view (patches per iteration, sliding-window batch,
    where the volume lives)."""
    return Point.of(bundle_values(bundle.config))


def _probes(bundle: Bundle, plan: TuningPlan, budget: Budget, timeout: float, probe_env: Mapping[str, str] | None,
            say: Callable[[str], None]) -> tuple[dict[str, Any], dict[str, Any] | None, bool]:
    """(the probe at the bundle's values, the probe one above the largest fit or None, whether that one fits)."""
    from autotune.probe import run_probe

    common = {"device": budget.device, "memory_limit": budget.limit, "timeout": timeout, "env": probe_env}
    values = _values(bundle)
    at = run_probe(bundle.config, values, phases=("train", "infer"), **common)
    say(f"  at the plan: {at.get('status')}, peak {format_bytes(at.get('peak_bytes'))}")
    top = plan.searched_top or bundle.config.tuning_ranges.get("num_patches_per_iter", [1, 10**6])[1]
    # the goodput hand-off may give training less than the largest fit: the edge is the largest fit's
    edge = max(int(values.num_patches_per_iter or 1), plan.largest_fit)
    if edge >= top:
        return at, None, False
    above = run_probe(bundle.config, values.at("train", edge + 1), phases=("train",), **common)
    above_fits = above.get("status") == "ok" and int(above.get("peak_bytes") or 0) <= budget.budget
    say(f"  one above the largest fit ({edge + 1}): {above.get('status')}, peak {format_bytes(above.get('peak_bytes'))}"
        f" -> {'fits: the plan left room' if above_fits else 'does not fit'}")
    return at, above, above_fits


def _predicted(bundle: Bundle, plan: TuningPlan, device: str) -> int:
    """The estimator's peak at the bundle's values in device bytes, with the allowance the plan was made with
    (``autotune.probe.device_estimate.estimate_on_device``)."""
    from autotune.probe import allowance_from_record, estimate_on_device

    allowance = allowance_from_record(plan.as_dict(), device)
    est = estimate_on_device(bundle.config, allowance, _values(bundle), device=device)
    return int(est.get("device_peak_bytes") or 0)


def _report(bundle: Bundle, plan: TuningPlan, budget: Budget, at: dict[str, Any], above: dict[str, Any] | None,
            holds: bool, predicted: int) -> dict[str, Any]:
    measured = int(at.get("peak_bytes") or 0)
    return {
        "bundle": str(bundle.path), "holds": holds, "device": budget.info["device"],
        "device_name": budget.info["device_name"], "memory_limit": budget.limit, "budget_bytes": budget.budget,
        **_values(bundle).as_dict(), "measured_peak_bytes": measured,
        "estimated_peak_bytes": predicted, "estimate_error": abs(predicted - measured) / measured if measured else None,
        "at_plan": at, "one_above": above, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def verify_plan(
    bundle: Bundle,
    *,
    device: str,
    memory_limit: int | str | None,
    storage: str | None,
    timeout: float,
    retune: bool,
    probe_env: Mapping[str, str] | None = None,
    say: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """Verify ``bundle``'s plan on ``device``; returns a report (``holds``: bool; ``retuned`` when retuned).

    Raises:
        ConfigError: the bundle was never tuned.
        SpecError: the memory limit is larger than the device.
    """
    plan = bundle.plan
    if plan is None:
        raise ConfigError(f"{bundle.path}: the bundle has no tuning block; run 'autotune tune' or 'autotune run' first")
    from autotune.search.driver.session import DEFAULT_MARGIN

    limit = memory_limit if memory_limit is not None else plan.memory_limit
    budget = make_budget(device, limit, plan.margin if plan.margin is not None else DEFAULT_MARGIN, None)
    values = _values(bundle)
    say(f"verifying {bundle.path}: {values.num_patches_per_iter} patches/iter, sw batch "
        f"{values.num_sw_batch_size} ({values.validation_device}) on {budget.info['device_name']}, "
        f"budget {format_bytes(budget.budget)}")
    at, above, above_fits = _probes(bundle, plan, budget, timeout, probe_env, say)
    fits = at.get("status") == "ok" and int(at.get("peak_bytes") or 0) <= budget.budget
    report = _report(bundle, plan, budget, at, above, bool(fits and not above_fits), _predicted(bundle, plan, device))
    if report["estimate_error"] is not None:
        say(f"  estimate {format_bytes(report['estimated_peak_bytes'])} vs measured "
            f"{format_bytes(report['measured_peak_bytes'])}: error {100 * report['estimate_error']:.2f}%")
    if report["holds"]:
        verified = {k: v for k, v in report.items() if k not in ("at_plan", "one_above", "bundle")}
        new_plan = plan.replace(method="measured", verified=verified, peak_bytes=report["measured_peak_bytes"])
        update_bundle_config(bundle.path, {"tuning": new_plan.as_dict()})
        say("  the plan holds: provenance set to measured")
        return report
    say("  the plan does not hold" + ("; retuning with the fast strategy" if retune else ""))
    if retune:
        from autotune.search.driver.bundles import SearchSettings, search_bundles
        from autotune.search.driver.options import TuningOptions

        settings = SearchSettings(TuningOptions(device=device, memory_limit=budget.limit, storage=storage,
                                                strategy="fast", objective="max-batch", handoff=plan.handoff_rule,
                                                margin=budget.margin, timeout=timeout, probe_env=probe_env))
        report["retuned"] = search_bundles([bundle.path], None, settings, say)[0]
    return report
