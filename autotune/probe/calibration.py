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

Each file is parsed once into a ``Calibration`` (``autotune.probe.calibration_file``) and checked: the
file that would be used, or one that names no GPU (it may be this one's), is refused in one line naming it
and the key when malformed (never skipped); a malformed file that names another GPU is passed over with a
warning on stderr. A file in a user's folder that is not used says why on stderr (for another GPU, or
shadowed by the first match), once per process; the allowance's ``source`` names the file used.

The fit (``fit_allowance``) is the smallest allowance that covers every measured point:
``estimate x (1 + slack) + workspace >= max_memory_reserved`` at each point, minimising
the total over-prediction (a two-variable linear programme solved at its vertices), and
the context is the largest NVML-used memory not held by the caching allocator.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.files import atomic_write_json

if TYPE_CHECKING:
    from autotune.probe.calibration_file import Calibration

__all__ = [
    "PACKAGE_DIR",
    "Lookup",
    "calibration_dirs",
    "find_calibration",
    "look_up",
    "fit_allowance",
    "calibration_record",
    "calibration_filename",
    "write_calibration",
    "same_gpu",
    "stated_bound",
]

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


_READ: dict[tuple[str, int, int], Any] = {}  # (path, mtime, size) -> its Calibration or the ConfigError it raised
_SAID: set[str] = set()  # the notes said in this process (each once)


def _read(path: Path) -> Calibration:
    """``read_calibration`` of ``path``, once per version of the file in this process.

    Raises:
        ConfigError: the file is malformed (``autotune.probe.calibration_file``)."""
    from autotune.errors import ConfigError
    from autotune.probe.calibration_file import read_calibration

    try:
        stat = path.stat()
        key = (str(path), stat.st_mtime_ns, stat.st_size)
    except OSError:
        return read_calibration(path)  # says why in one line
    if key not in _READ:
        if len(_READ) > 256:
            _READ.clear()
        try:
            _READ[key] = read_calibration(path)
        except ConfigError as exc:
            _READ[key] = exc
    found = _READ[key]
    if isinstance(found, ConfigError):
        raise ConfigError(str(found))
    return found


def _say(line: str) -> None:
    """Print ``line`` on stderr, once in this process."""
    if line not in _SAID:
        _SAID.add(line)
        print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Lookup:
    """What a search for a GPU's calibration found: the ``calibration`` used (None: none), and a line for each
    file a person put in a searched folder that is not used, saying why (``notes``)."""

    calibration: Calibration | None
    notes: tuple[str, ...] = ()


def _shipped(folder: Path) -> bool:
    try:
        return folder.resolve() == PACKAGE_DIR
    except OSError:
        return False


def look_up(gpu_name: str | None, dirs: Sequence[Path] | None = None) -> Lookup:
    """The calibration for ``gpu_name`` (see the module docstring) and why each other candidate is not used.

    Every ``*.json`` in a searched folder is taken for a calibration. Up to the first match each is read and
    checked: a malformed one that names this GPU, or names none (it may be this GPU's), is refused; a
    malformed one that names another GPU is passed over with a warning (a broken file for another card does
    not stop a run on this one). After the match, a file for the same GPU is shadowed (noted, not read).
    Files the package ships for other GPUs are passed over without a note.

    Raises:
        ConfigError: the file that would be used, or one that may be this GPU's, is malformed (one line naming
            it and the key).
    """
    from autotune.errors import ConfigError
    from autotune.probe.calibration_file import stated_gpu_name

    if not gpu_name:
        return Lookup(None)
    chosen: Calibration | None = None
    notes: list[str] = []
    for folder in dirs if dirs is not None else calibration_dirs():
        if not folder.is_dir():
            continue
        shipped = _shipped(folder)
        for path in sorted(folder.glob("*.json")):
            if chosen is not None:
                stated = stated_gpu_name(path)
                if stated and same_gpu(stated, gpu_name):
                    notes.append(f"note: calibration {path} is not used: {chosen.path} comes first (the first "
                                 "match in the search order is used)")
                continue
            try:
                found = _read(path)
            except ConfigError as exc:
                stated = stated_gpu_name(path)
                if shipped or stated is None or same_gpu(stated, gpu_name):
                    raise
                notes.append(f"warning: {exc} (it names {stated}, not this device's {gpu_name}: not used)")
                continue
            if same_gpu(found.gpu_name, gpu_name):
                chosen = found
            elif not shipped:
                notes.append(f"note: calibration {path} is not used: it is for {found.gpu_name}, not {gpu_name}")
    return Lookup(chosen, tuple(notes))


def find_calibration(gpu_name: str | None, dirs: Sequence[Path] | None = None) -> Calibration | None:
    """The calibration for ``gpu_name`` (``look_up``), or None; each file passed over is said on stderr, once
    in this process.

    Raises:
        ConfigError: the file that would be used, or one that may be this GPU's, is malformed.
    """
    found = look_up(gpu_name, dirs)
    for line in found.notes:
        _say(line)
    return found.calibration


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
    over = max(0.0, over)  # the fit covers every point: at most the byte of float slack below
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
    ``model`` the device model's calibrated part (version 2; 3 where it holds its domain and bounds), the
    points, when and how."""
    from autotune.probe.calibration_file import CALIBRATION_VERSION

    version = 1 if model is None else CALIBRATION_VERSION if "domain" in model and "bounds" in model else 2
    record = {
        "calibration_version": version,
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
    """Write ``record`` atomically as ``folder/<gpu-name>.json``, checked as it will be read; returns the path.

    Raises:
        ConfigError: the record is not a calibration this autotune reads (nothing is written).
    """
    import json

    from autotune.probe.calibration_file import parse_calibration
    from autotune.utils import plain_data

    path = Path(folder) / calibration_filename(str(record["gpu_name"]))
    parse_calibration(json.loads(json.dumps(plain_data(dict(record)))), str(path))
    return atomic_write_json(path, dict(record))


def stated_bound(device_name: str | None, dirs: Sequence[Path] | None = None,
                 template: str | None = None) -> dict[str, Any] | None:
    """The over-prediction bound a calibration for ``device_name`` states (``fit.max_over_prediction``:
    the device's peak is at least estimate / (1 + bound)), with its file; None when there is no
    calibration or it states no bound.

    Where the calibration also states a bound per template (``fit.by_template``, measured on that
    template's points only) and ``template`` has one, that bound is returned (``scope`` says which).

    Raises:
        ConfigError: the calibration that would be used is malformed (``find_calibration``).
    """
    found = find_calibration(device_name, dirs)
    if found is None or found.fit is None or found.fit.max_over_prediction is None:
        return None
    bound, scope = found.fit.max_over_prediction, "all templates"
    own = found.fit.by_template.get(template) if template else None
    if own is not None and own.max_over_prediction is not None:
        bound, scope = own.max_over_prediction, f"template {template}"
    return {"bound": bound, "scope": scope, "calibration": found.path.name, "gpu_name": found.gpu_name}
