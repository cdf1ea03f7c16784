"""``autotune verify``: check a tuned (or planned) bundle on the real device.

Runs one probe at the tuned values and one with a patch more per iteration, compares
the estimate with the measured peak, and rewrites the provenance to ``measured`` when
the plan holds; when it does not, retunes with the fast strategy (unless told not to).
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Callable
from typing import Any

from autotune.bundles.config import load_bundle_config, update_bundle_config
from autotune.errors import ConfigError, SpecError
from autotune.utils import format_bytes, parse_bytes

__all__ = ["verify_bundle"]


def verify_bundle(
    bundle: str | os.PathLike[str],
    *,
    device: str = "cpu",
    memory_limit: int | str | None = None,
    storage: str | None = None,
    timeout: float = 300.0,
    retune: bool = True,
    probe_env: dict[str, str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Verify a bundle's tuned values on ``device``; returns a report (``holds``: bool).

    Raises:
        ConfigError: the bundle was never tuned.
        SpecError: the memory limit is larger than the device.
    """
    from autotune.device import device_info
    from autotune.probe.estimate import estimate
    from autotune.probe.runner import run_probe

    say = progress or (lambda _line: None)
    cfg = load_bundle_config(bundle)
    tuning = cfg.get("tuning")
    if not isinstance(tuning, dict) or "num_patches_per_iter" not in tuning:
        raise ConfigError(f"{bundle}: the bundle has no tuning block; run 'autotune tune' or 'autotune run' first")
    info = device_info(device)
    limit = parse_bytes(memory_limit, "memory limit") if memory_limit is not None else int(tuning["memory_limit"])
    if limit > info["device_total_memory"]:
        raise SpecError(
            f"memory limit {format_bytes(limit)} is above the {info['device_name']}'s "
            f"{format_bytes(info['device_total_memory'])}; pass a smaller --memory-limit"
        )
    margin = float(tuning.get("margin", 0.1))
    from autotune.probe.allowances import (
        allocator_budget,
        allowance_for,
        allowance_from_record,
        apply_allowance,
    )

    budget = allocator_budget(limit, margin, allowance_for(device))
    n = int(cfg["num_patches_per_iter"])
    m = int(cfg["num_sw_batch_size"])
    vd = "cpu" if cfg.get("sw_input_on_cpu") else "device"
    # The top of the range the plan was searched in (the training-set cap may stop it below the template's).
    searched_top = ((tuning.get("batch") or {}).get("searched_range") or [None, None])[1]
    n_hi = int(searched_top) if searched_top else int(
        (cfg.get("tuning_ranges") or {}).get("num_patches_per_iter", [1, 10**6])[1])
    common = {"device": device, "memory_limit": limit, "timeout": timeout, "env": probe_env}

    say(f"verifying {bundle}: {n} patches/iter, sw batch {m} ({vd}) on {info['device_name']}, "
        f"budget {format_bytes(budget)}")
    at = run_probe(bundle, num_patches_per_iter=n, num_sw_batch_size=m, validation_device=vd,
                   phases=("train", "infer"), **common)
    fits = at.get("status") == "ok" and int(at.get("peak_bytes") or 0) <= budget
    say(f"  at the plan: {at.get('status')}, peak {format_bytes(at.get('peak_bytes'))}")
    above: dict[str, Any] | None = None
    is_max = True
    # the goodput hand-off may give training less than the largest fit: the edge is the largest fit's
    edge = max(n, int(tuning.get("max_num_patches_per_iter") or n))
    if edge < n_hi:
        above = run_probe(bundle, num_patches_per_iter=edge + 1, phases=("train",), **common)
        above_fits = above.get("status") == "ok" and int(above.get("peak_bytes") or 0) <= budget
        is_max = not above_fits
        say(f"  one above the largest fit ({edge + 1}): {above.get('status')}, "
            f"peak {format_bytes(above.get('peak_bytes'))}"
            f" -> {'fits: the plan left room' if above_fits else 'does not fit'}")
    est = estimate(bundle, num_patches_per_iter=n, num_sw_batch_size=m, validation_device=vd, device=device)
    allowance = allowance_from_record(tuning, device)
    raw = int(est.get("peak_bytes") or 0)
    predicted = apply_allowance(raw, allowance, include_context=False)
    measured = int(at.get("peak_bytes") or 0)
    error = abs(predicted - measured) / measured if measured else None
    holds = bool(fits and is_max)
    report = {
        "bundle": str(bundle),
        "holds": holds,
        "device": info["device"],
        "device_name": info["device_name"],
        "memory_limit": limit,
        "budget_bytes": budget,
        "num_patches_per_iter": n,
        "num_sw_batch_size": m,
        "validation_device": vd,
        "measured_peak_bytes": measured,
        "estimated_peak_bytes": predicted,
        "estimate_error": error,
        "at_plan": at,
        "one_above": above,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if error is not None:
        say(f"  estimate {format_bytes(predicted)} vs measured {format_bytes(measured)}: error {100 * error:.2f}%")
    if holds:
        new_tuning = dict(tuning)
        new_tuning["method"] = "measured"
        new_tuning["verified"] = {k: v for k, v in report.items() if k not in ("at_plan", "one_above", "bundle")}
        new_tuning["peak_bytes"] = measured
        update_bundle_config(bundle, {"tuning": new_tuning})
        say("  the plan holds: provenance set to measured")
        return report
    say("  the plan does not hold" + ("; retuning with the fast strategy" if retune else ""))
    if retune:
        from autotune.search.tune import tune_bundles

        report["retuned"] = tune_bundles(
            [bundle], device=device, memory_limit=limit, storage=storage, strategy="fast", margin=margin,
            timeout=timeout, probe_env=probe_env, progress=say,
            handoff=str((tuning.get("handoff") or {}).get("rule") or "goodput"),
        )[0]
    return report
