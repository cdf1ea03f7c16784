"""After the device: the CUDA-hidden re-estimates (on the CPU) and the installation of the results.

``reestimate`` makes the memory call's CT set and bundles again (the set is deterministic) and,
for every measured point, estimates it as a machine without a GPU plans for one (CUDA hidden,
``device="cuda:0"`` emulated on the CPU): ``estimate_emulated`` beside the device's own figure.
It costs no device time, which is why the device call leaves it out.

``install`` merges the two calls' JSON into ``benchmarks/results/gpu_check_<gpu>.json`` and copies
the calibration into ``autotune/probe/calibrations/<gpu>.json``.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from gpu_data import generate, make_ct_dataset

from autotune.files import atomic_write_json

__all__ = ["reestimate", "install", "InstallError"]

ROOT = Path(__file__).resolve().parents[1]


class InstallError(ValueError):
    """A result folder that cannot be installed (the message says which file and what to do)."""


def reestimate(results: dict[str, Any], work: Path | None = None) -> int:
    """Fill ``estimate_emulated`` of every point of a memory call's ``results``; returns the points done.

    Call with CUDA hidden (``CUDA_VISIBLE_DEVICES=""`` before torch is imported), as ``gpu_check.py
    reestimate`` does."""
    from autotune.probe.estimate import estimate

    ct = results["sections"]["ct_data"]
    points = results["sections"].get("points", {}).get("points") or []
    with tempfile.TemporaryDirectory(prefix="gpu_reestimate_") as tmp:
        base = Path(work or tmp)
        source = make_ct_dataset(base / "ct", int(ct["cases"]), ct["shape"], ct["spacing"])
        bundles = generate(base / "work_ct", source, sorted({p["algo"] for p in points}), tiny=ct["preset"] == "tiny")
        for p in points:
            est = estimate(str(bundles[p["algo"]]), num_patches_per_iter=p["n"], num_sw_batch_size=p["m"],
                           device="cuda:0")
            device_estimate = {ph: p[ph]["estimate_bytes"] for ph in ("train", "infer")}
            p["estimate_emulated"] = {
                "train": est["train_peak_bytes"], "infer": est["infer_peak_bytes"], "semantics": est.get("semantics"),
                "seconds": est.get("seconds"), "roi_size": est.get("roi_size"),
                "same_roi": list(est.get("roi_size") or []) == list(p.get("roi_size") or []),
                "over_device_estimate": {ph: (est[f"{ph}_peak_bytes"] / device_estimate[ph] - 1)
                                         if device_estimate[ph] else None for ph in ("train", "infer")},
            }
    return len(points)


def _load(folder: Path, call: str) -> dict[str, Any]:
    path = folder / f"gpu_check_{call}.json"
    if not path.is_file():
        raise InstallError(f"{path}: not found; give the folder the {call} call's files came back in")
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("dry_run"):
        raise InstallError(f"{path}: a CPU dry run's results; install only what a GPU measured")
    if not (data.get("gpu") or {}).get("name"):
        raise InstallError(f"{path}: names no GPU (its env section failed); run the call again")
    return data


def install(memory_dir: Path, training_dir: Path | None, results_dir: Path, calibrations_dir: Path,
            redo_estimates: bool = True) -> dict[str, Path]:
    """Merge and install the calls' results; returns the files written.

    Raises:
        InstallError: a JSON or the calibration is missing, a dry run's, or the two calls name different GPUs.
    """
    from autotune.probe.calibration import calibration_filename

    memory = _load(memory_dir, "memory")
    training = _load(training_dir, "training") if training_dir is not None else None
    gpu_name = memory["gpu"]["name"]
    if training is not None and training["gpu"]["name"] != gpu_name:
        raise InstallError(f"{memory_dir} measured {gpu_name!r} but {training_dir} measured "
                           f"{training['gpu']['name']!r}; install each GPU's results on their own")
    name = calibration_filename(gpu_name)
    calibration = memory_dir / "calibration" / name
    if not calibration.is_file():
        raise InstallError(f"{calibration}: not found; the memory call's calibrate section did not write it")
    if redo_estimates:
        reestimate(memory)
    merged = {"gpu": memory["gpu"], "installed_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "memory": memory, "training": training}
    written = {"results": atomic_write_json(results_dir / f"gpu_check_{name}", merged)}
    calibrations_dir.mkdir(parents=True, exist_ok=True)
    written["calibration"] = Path(shutil.copyfile(calibration, calibrations_dir / name))
    return written
