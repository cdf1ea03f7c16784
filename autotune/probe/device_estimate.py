"""The estimator's answer with a CUDA device's figures added: ``estimate_on_device``.

It runs the estimator (``autotune.probe.estimate``) on a bundle, picks the calibration's workspace factors where
the bundle lies inside its fit (``autotune.probe.allowances``, ``autotune.probe.domain``, which ask the bundle's
template family) and counts the recorded trace on the device (``autotune.probe.device_model``): the orchestrating
part of the probe, above the families, over the device model's counting below them.
"""

from __future__ import annotations

import math
from typing import Any

from autotune.probe.device_model import PHASES, device_figures, explain_terms

__all__ = ["estimate_on_device"]


def estimate_on_device(bundle: Any, allowance: Any, point: Any = None, *, device: str, template: str | None = None,
                       explain: bool = False, **estimate_kwargs: Any) -> dict[str, Any]:
    """``estimate`` of ``bundle`` at ``point`` (``autotune.tunables.Point``) with the device's figures added
    (``autotune.probe.estimate``'s keyword arguments pass through). With a device model
    (``allowance.workspace_factors``), the trace is recorded and simulated: ``{phase}_device_allocated_bytes``, ``{phase}_device_reserved_bytes`` and ``device_peak_bytes``,
    with cuDNN's workspace fitted where the bundle lies inside the calibration's domain and none outside it
    (``CudaAllowance.factors_for``): ``device_model_fit`` says which (``fitted``, ``allocator rules``),
    ``device_model_domain`` why, ``device_model_bound`` the out-of-sample bound of that situation (None where
    the calibration states none); with a version-1 allowance its affine formula on the raw peaks; on the CPU
    the raw peaks. ``device_model`` says which (``simulated``, ``affine``, ``none``). ``explain``: each term of
    the reserved peak per phase (``device_terms``: ``explain_terms``, or the affine formula's). ``template``:
    the name a version-2 calibration without a domain is read by (default the bundle's). The recorded events
    are dropped."""
    from autotune.cuda_alloc import alloc_conf, expandable_segments
    from autotune.probe.allowances import apply_allowance
    from autotune.probe.domain import as_bundle_config
    from autotune.probe.estimate import estimate
    from autotune.probe.runner import resolve_request

    cuda = str(device).startswith("cuda")
    factors, check = None, None
    if cuda:
        config = as_bundle_config(resolve_request(bundle, check_device=False)["config"])
        factors, check = allowance.factors_for(config, device)
        template = template or config.algo
    result = dict(estimate(bundle, point, device=device, record=factors is not None, **estimate_kwargs))
    if factors is not None:
        release, expandable = allowance.release_after_search, expandable_segments(alloc_conf())
        result.update(device_figures(result, factors, release=release, expandable=expandable))
        result["device_model"] = "simulated"
        result["device_model_fit"] = "fitted" if check.inside else "allocator rules"
        result["device_model_domain"] = check.why
        result["device_model_bound"] = allowance.bound_for(check, template)
        if explain:
            result["device_terms"] = explain_terms(result, factors, release=release, expandable=expandable)
    else:
        for phase in PHASES:
            raw = result.get(f"{phase}_peak_bytes")
            if raw is not None:
                result[f"{phase}_device_reserved_bytes"] = (apply_allowance(int(raw), allowance, include_context=False)
                                                            if cuda else int(raw))
                if explain and cuda:
                    slack = int(math.ceil(int(raw) * float(allowance.allocator_slack_fraction)))
                    workspace = int(result[f"{phase}_device_reserved_bytes"]) - int(raw) - slack
                    result.setdefault("device_terms", {})[phase] = {
                        "tensors": int(raw), "slack": slack, "workspace": workspace,
                        "reserved": int(result[f"{phase}_device_reserved_bytes"])}
        peaks = [result[f"{p}_device_reserved_bytes"] for p in PHASES if f"{p}_device_reserved_bytes" in result]
        result["device_peak_bytes"] = max(peaks) if peaks else None
        result["device_model"] = "affine" if cuda else "none"
    if cuda:
        result["context_bytes"] = int(allowance.context_bytes)
    result.pop("train_events", None)
    result.pop("infer_events", None)
    return result
