"""Per-GPU calibration of the CUDA allowances: fitted from real probes, read in place of the defaults.

A calibration file is JSON written by ``autotune calibrate`` on a real GPU. It holds the
GPU's name, the driver, torch, CUDA and cuDNN versions it was measured with, what was fitted
and the points it was fitted from. Its format is versioned (``calibration_version``):

- **3**: version 2 and what the fit knows of itself: ``model.domain``, what it was fitted on (per template
  and source: the network configuration's hash, the patch and volume sizes, the precision, the phases, the
  batch sizes: ``autotune.probe.domain``), and ``model.bounds``, its error out of sample per situation
  (inside that domain, and outside it with the allocator's rules alone: ``autotune.calibrate.validate``).
  An estimate uses the fitted workspace only inside the domain.
- **2**: ``model``: the device model's calibrated part (``autotune.probe.device_model``): per
  template and phase the workspace factor ``w`` (``model.workspace``), the CUDA context, the
  allocator setting the points were measured under; ``fit`` says how well it predicts its points
  (per template: in-sample and leave-one-out). It keeps a version-1 ``allowance`` block too, for
  autotune versions that read only that. Still read: its factors apply to autotune's own templates of
  those names (never to MONAI's), its bound is its stated leave-one-out one.
- **1** (the first GPU run's): ``allowance`` only: one context, one workspace and one allocator
  slack for every template and phase (``fit_allowance``). Still read: it applies as before.

``find_calibration(gpu_name)`` looks in, first to last:

1. ``$AUTOTUNE_CALIBRATION_DIR`` (a folder of ``*.json``),
2. ``~/.config/autotune/calibration/``,
3. the files shipped with the package (``autotune/probe/calibrations/``),

and takes the first file whose GPU name matches (case and a leading "NVIDIA " ignored;
a catalogue name such as "NVIDIA H100 80GB" matches the driver's "NVIDIA H100 80GB HBM3").
Versions are recorded, not matched: a calibration from another torch or driver still
applies, and the provenance says which versions it came from.

The fit (``fit_allowance``) is the smallest allowance that covers every measured point:
``estimate x (1 + slack) + workspace >= max_memory_reserved`` at each point, minimising
the total over-prediction (a two-variable linear programme solved at its vertices), and
the context is the largest NVML-used memory not held by the caching allocator.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.files import atomic_write_json

__all__ = [
    "CALIBRATION_VERSION",
    "PACKAGE_DIR",
    "calibration_dirs",
    "find_calibration",
    "fit_allowance",
    "calibration_record",
    "calibration_filename",
    "write_calibration",
    "same_gpu",
    "stated_bound",
]

CALIBRATION_VERSION = 3
PACKAGE_DIR = Path(__file__).resolve().parent / "calibrations"
_MIB = 1024**2


def _normalise(name: str) -> str:
    text = " ".join(str(name).lower().split())
    return text[len("nvidia "):] if text.startswith("nvidia ") else text


def same_gpu(a: str, b: str) -> bool:
    """True when two GPU names denote the same card (one may extend the other: "H100 80GB" / "H100 80GB HBM3")."""
    na, nb = _normalise(a), _normalise(b)
    if not na or not nb:
        return False
    return na == nb or na.startswith(nb + " ") or nb.startswith(na + " ")


def calibration_dirs() -> list[Path]:
    """Folders searched for calibration files, first match wins."""
    dirs: list[Path] = []
    from autotune.checks.environment import setting

    env = setting("AUTOTUNE_CALIBRATION_DIR")
    if env is not None:
        dirs.append(Path(env))
    dirs.append(Path("~/.config/autotune/calibration").expanduser())
    dirs.append(PACKAGE_DIR)
    return dirs


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("allowance"), dict) or not data.get("gpu_name"):
        return None
    allowance = data["allowance"]
    try:
        values = [float(allowance[k]) for k in ("context_bytes", "cudnn_workspace_bytes", "allocator_slack_fraction")]
    except (KeyError, TypeError, ValueError):
        return None
    if any(not math.isfinite(v) or v < 0 for v in values):
        return None
    if "model" in data and model_factors(data) is None:  # a version-2 file whose model is unreadable
        return None
    data["path"] = str(path)
    return data


def model_factors(data: Mapping[str, Any]) -> dict[str, dict[str, float]] | None:
    """A version-2 calibration's workspace factors (template -> phase -> w), or None when it has none or
    they are not finite, non-negative numbers for both phases."""
    model = data.get("model")
    workspace = model.get("workspace") if isinstance(model, Mapping) else None
    if not isinstance(workspace, Mapping) or not workspace:
        return None
    out: dict[str, dict[str, float]] = {}
    for template, phases in workspace.items():
        try:
            values = {phase: float(phases[phase]) for phase in ("train", "infer")}
        except (KeyError, TypeError, ValueError):
            return None
        if any(not math.isfinite(v) or v < 0 for v in values.values()):
            return None
        out[str(template)] = values
    return out


def find_calibration(gpu_name: str | None, dirs: Sequence[Path] | None = None) -> dict[str, Any] | None:
    """The first readable calibration for ``gpu_name`` (see the module docstring), or None.

    Unreadable or malformed files are skipped (a calibration is an aid; the defaults stand in).
    """
    if not gpu_name:
        return None
    for folder in dirs if dirs is not None else calibration_dirs():
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.json")):
            data = _read(path)
            if data is not None and same_gpu(str(data["gpu_name"]), gpu_name):
                return data
    return None


def fit_allowance(points: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Fit the allowance to measured points.

    Each point needs ``estimate_bytes`` (the estimator's raw peak) and ``reserved_bytes``
    (``max_memory_reserved``); ``context_bytes`` (NVML used less the allocator's reserved
    memory) is optional. Returns ``context_bytes``, ``cudnn_workspace_bytes``,
    ``allocator_slack_fraction`` and ``max_over_prediction`` (the worst predicted/reserved - 1).

    Raises:
        ValueError: no point with a positive estimate.
    """
    pts = [(float(p["estimate_bytes"]), float(p["reserved_bytes"])) for p in points
           if p.get("estimate_bytes") and p.get("reserved_bytes") is not None]
    contexts = [float(p["context_bytes"]) for p in points if p.get("context_bytes") is not None]
    if not pts:
        raise ValueError("no measured point with a positive estimate to fit the allowance to")
    candidates: list[tuple[float, float]] = [(0.0, max(0.0, max(r - e for e, r in pts)))]
    for e, r in pts:
        candidates.append((max(0.0, r / e - 1.0), 0.0))
        candidates.append((0.0, max(0.0, r - e)))
    for i, (e1, r1) in enumerate(pts):
        for e2, r2 in pts[i + 1:]:
            if e1 != e2:
                s = (r1 - r2) / (e1 - e2) - 1.0
                candidates.append((s, r1 - e1 * (1.0 + s)))
    best: tuple[float, float, float] | None = None
    for s, w in candidates:
        if s < 0 or w < 0:
            continue
        if any(e * (1.0 + s) + w < r - 1.0 for e, r in pts):  # 1 byte of float slack
            continue
        cost = sum(e * (1.0 + s) + w - r for e, r in pts)
        if best is None or cost < best[0]:
            best = (cost, s, w)
    assert best is not None  # (0, max(r - e)) and (max(r/e - 1), 0) are always feasible
    _, slack, workspace = best
    workspace = math.ceil(workspace / _MIB) * _MIB
    slack = math.ceil(slack * 1e4 - 1e-6) / 1e4  # rounded up (never below the fit)
    over = max((e * (1.0 + slack) + workspace) / r - 1.0 for e, r in pts if r > 0) if any(r > 0 for _, r in pts) else 0.0
    return {
        "context_bytes": int(math.ceil(max(contexts) / _MIB) * _MIB) if contexts else 0,
        "cudnn_workspace_bytes": int(workspace),
        "allocator_slack_fraction": float(slack),
        "max_over_prediction": float(over),
        "points": len(pts),
    }


def calibration_record(gpu: Mapping[str, Any], fit: Mapping[str, Any], points: Sequence[Mapping[str, Any]],
                       command: str, model: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The calibration file's content: the GPU and versions, the allowance (version 1's block), with
    ``model`` the device model's calibrated part (version 2), the points, when and how."""
    record = {
        "calibration_version": CALIBRATION_VERSION if model is not None else 1,
        "gpu_name": gpu.get("name"),
        "total_memory": gpu.get("total_memory"),
        "driver": gpu.get("driver"),
        "torch": gpu.get("torch"),
        "cuda": gpu.get("cuda"),
        "cudnn": gpu.get("cudnn"),
        "measured_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
        "allowance": {k: fit[k] for k in ("context_bytes", "cudnn_workspace_bytes", "allocator_slack_fraction")},
        "fit": {k: fit[k] for k in ("max_over_prediction", "points")},
        "points": [dict(p) for p in points],
    }
    if model is not None:
        record["model"] = dict(model)
    return record


def calibration_filename(gpu_name: str) -> str:
    """A file name for a GPU: ``nvidia-h100-80gb-hbm3.json``."""
    slug = "".join(c if c.isalnum() else "-" for c in str(gpu_name).lower())
    return "-".join(filter(None, slug.split("-"))) + ".json"


def write_calibration(folder: str | os.PathLike[str], record: Mapping[str, Any]) -> Path:
    """Write ``record`` atomically as ``folder/<gpu-name>.json``; returns the path."""
    return atomic_write_json(Path(folder) / calibration_filename(str(record["gpu_name"])), dict(record))


def _bound_of(fit: Any) -> float | None:
    """A fit block's ``max_over_prediction`` when it is a finite, non-negative number."""
    try:
        bound = float(fit["max_over_prediction"])
    except (KeyError, TypeError, ValueError):
        return None
    return bound if math.isfinite(bound) and bound >= 0 else None


def stated_bound(device_name: str | None, dirs: Sequence[Path] | None = None,
                 template: str | None = None) -> dict[str, Any] | None:
    """The over-prediction bound a calibration for ``device_name`` states (``fit.max_over_prediction``:
    the device's peak is at least estimate / (1 + bound)), with its file; None when there is no
    calibration or it states no bound.

    Where the calibration also states a bound per template (``fit.by_template``, measured on that
    template's points only) and ``template`` has one, that bound is returned (``scope`` says which)."""
    found = find_calibration(device_name, dirs)
    if found is None:
        return None
    fit = found.get("fit") or {}
    bound = _bound_of(fit)
    if bound is None:
        return None
    scope = "all templates"
    by_template = fit.get("by_template") if isinstance(fit.get("by_template"), dict) else {}
    if template and isinstance(by_template.get(template), dict):
        own = _bound_of(by_template[template])
        if own is not None:
            bound, scope = own, f"template {template}"
    return {"bound": bound, "scope": scope, "calibration": Path(found["path"]).name, "gpu_name": found["gpu_name"]}
