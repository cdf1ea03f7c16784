"""``estimate_report``: one bundle's estimated peaks, its fitted memory models per phase and
the largest batch each allows under a limit (raw, and with the CUDA allowance on a GPU).
The library side of ``autotune estimate``; the CLI only prints it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from autotune.tunables import BATCH, SW_BATCH, Point

__all__ = ["estimate_report", "default_validation_device"]


def default_validation_device(bundle: str | os.PathLike[str]) -> str:
    """``cpu`` when the bundle keeps the validation volume on the host (``sw_input_on_cpu``), else ``device``."""
    from autotune.bundles.config import load_bundle_config
    from autotune.tunables import VALIDATION_DEVICE

    return str(VALIDATION_DEVICE.bundle_value(load_bundle_config(bundle)))


def estimate_report(
    bundle: str | os.PathLike[str],
    point: Point | Mapping[str, Any] | None = None,
    *,
    device: str = "auto",
    memory_limit: int | str | None = None,
    explain: bool = False,
    **tuned: Any,
) -> dict[str, Any]:
    """Estimate ``bundle`` at one point and fit its memory model per phase (``point`` and any tunable given as a
    keyword as in ``autotune.probe.estimate.estimate``; the validation device left out is the bundle's).
    ``explain``: on CUDA, the device model's terms per phase in ``estimate["device_terms"]``
    (``autotune.probe.device_model.explain_terms``).

    Returns:
        ``{"estimate": ..., "fits": {"train"|"infer": {"intercept", "slope", "points", "n_cap",
        ["max_fitting_raw", "max_fitting_with_allowance", "check"]}}, "allowance": ...}``; the
        ``max_fitting_*`` entries only with a ``memory_limit``, the allowance ones only on CUDA.

    Raises:
        ConfigError: a bad bundle. SpecError: a bad limit or device.
    """
    from autotune.device import resolve_device
    from autotune.probe.allowances import allowance_for, apply_allowance, tensor_budget, workspace_template
    from autotune.probe.device_estimate import estimate_on_device
    from autotune.probe.estimate import fit_memory_model
    from autotune.probe.runner import resolve_request
    from autotune.utils import parse_bytes

    device = resolve_device(device)
    point = Point.of(point, **tuned)
    point = point.with_values(validation_device=point.validation_device or default_validation_device(bundle))
    limit = None if memory_limit is None else parse_bytes(memory_limit, "memory limit")
    allowance = allowance_for(device)
    cuda = device.startswith("cuda")
    template = workspace_template(resolve_request(bundle, check_device=False)["config"])
    result = estimate_on_device(bundle, allowance, point, device=device, template=template, explain=explain)
    result["memory_limit"] = limit
    report: dict[str, Any] = {"estimate": result, "fits": {}, "allowance": allowance.__dict__ if cuda else None}
    simulated = cuda and bool(allowance.workspace_factors)
    others = point.without(BATCH.name, SW_BATCH.name)  # each fit sizes its own phase from the bundle's values
    for phase in ("train", "infer"):
        model = fit_memory_model(bundle, others, phase=phase, device=device)
        entry: dict[str, Any] = {"intercept": model.intercept, "slope": model.slope, "points": model.points,
                                 "n_cap": model.cap}
        if limit is not None:
            entry["max_fitting_raw"] = model.max_fitting(limit)
            if simulated:  # the device model at the line's two points: its own line, read at the limit
                on_device = _device_line(bundle, model, phase, allowance, device, template, others)
                entry["max_fitting_with_allowance"] = on_device.max_fitting(limit)
                entry["check"] = int(on_device.predict(entry["max_fitting_with_allowance"]))
            elif cuda:  # the largest N whose peak plus allowance (without the context, as the probe's cap) fits
                entry["max_fitting_with_allowance"] = model.max_fitting(tensor_budget(limit, allowance))
                entry["check"] = apply_allowance(model.predict(entry["max_fitting_with_allowance"]), allowance,
                                                 include_context=False)
        report["fits"][phase] = entry
    return report


def _device_line(bundle: Any, model: Any, phase: str, allowance: Any, device: str, template: str | None,
                 point: Point) -> Any:
    """The device model's reserved peak of ``phase`` at ``model``'s two points, as a line (``MemoryModel``)."""
    from autotune.probe.device_estimate import estimate_on_device
    from autotune.probe.memory_model import MemoryModel

    (n1, _), (n2, _) = model.points
    peaks = [int(estimate_on_device(bundle, allowance, point.at(phase, n), device=device, template=template,
                                    phases=(phase,))[f"{phase}_device_reserved_bytes"]) for n in (n1, n2)]
    slope = (peaks[1] - peaks[0]) / (n2 - n1)
    return MemoryModel(intercept=peaks[0] - slope * n1, slope=slope, cap=model.cap, phase=phase,
                       points=[(n1, peaks[0]), (n2, peaks[1])])
