"""After the device: the CUDA-hidden re-estimates (on the CPU), the device model's fit, the installation.

``reestimate`` makes the memory call's CT set and bundles again (the set is deterministic) and,
for every measured point, estimates it as a machine without a GPU plans for one (CUDA hidden,
``device="cuda:0"`` emulated on the CPU): ``estimate_emulated`` beside the device's own figure.
It costs no device time, which is why the device call leaves it out. With ``record`` it keeps the
estimator's traces for the fit.

``install`` merges the two calls' JSON into ``benchmarks/results/gpu_check_<gpu>.json`` and writes
the calibration into ``autotune/probe/calibrations/<gpu>.json``: with the re-estimates, a version-2
calibration fitted here (``autotune.calibrate.fit``: the device model's workspace factors per
template and phase, from the device's measured reserved peaks and the CUDA-hidden traces); without
them, the file the device wrote, as it is.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from autotune.files import atomic_write_json
from benchmarks.gpu_data import generate, make_ct_dataset

__all__ = ["reestimate", "install", "InstallError", "fit_from_run", "points_of", "ct_of"]

ROOT = Path(__file__).resolve().parents[1]


class InstallError(ValueError):
    """A result folder that cannot be installed (the message says which file and what to do)."""


def points_of(results: dict[str, Any]) -> list[dict[str, Any]]:
    """A memory call's measured points: a run of the calibrate command's report, or the old points section."""
    sections = results["sections"]
    calibrate = (sections.get("calibrate") or {}).get("points")
    return calibrate if calibrate else (sections.get("points", {}).get("points") or [])


def ct_of(results: dict[str, Any]) -> dict[str, Any]:
    """The CT set a memory call measured on: the first run's ``ct_data`` section, or the calibrate section's."""
    sections = results["sections"]
    if sections.get("ct_data"):
        return sections["ct_data"]
    ct = sections["calibrate"]["ct"]
    return {**ct, "preset": "tiny" if results.get("dry_run") else "full"}


def reestimate(results: dict[str, Any], work: Path | None = None, record: bool = False) -> list[dict[str, Any] | None]:
    """Fill ``estimate_emulated`` of every point of a memory call's ``results``; returns each point's estimate
    (with its recorded events when ``record``).

    Call with CUDA hidden (``CUDA_VISIBLE_DEVICES=""`` before torch is imported), as ``gpu_check.py
    reestimate`` does."""
    from autotune.bundles.config import load_bundle_config
    from autotune.probe.domain import bundle_domain
    from autotune.probe.estimate import estimate

    ct = ct_of(results)
    points = points_of(results)
    estimates: list[dict[str, Any] | None] = []
    with tempfile.TemporaryDirectory(prefix="gpu_reestimate_") as tmp:
        base = Path(work or tmp)
        source = make_ct_dataset(base / "ct", int(ct["cases"]), ct["shape"], ct["spacing"])
        bundles = generate(base / "work_ct", source, sorted({p["algo"] for p in points}), tiny=ct["preset"] == "tiny")
        for p in points:
            est = estimate(str(bundles[p["algo"]]), num_patches_per_iter=p["n"], num_sw_batch_size=p["m"],
                           device="cuda:0", record=record)
            est["domain"] = (bundle_domain(load_bundle_config(bundles[p["algo"]]), "cuda:0"), p["n"], p["m"])
            device_estimate = {ph: p[ph]["estimate_bytes"] for ph in ("train", "infer")}
            p["estimate_emulated"] = {
                "train": est["train_peak_bytes"], "infer": est["infer_peak_bytes"], "semantics": est.get("semantics"),
                "seconds": est.get("seconds"), "roi_size": est.get("roi_size"),
                "same_roi": list(est.get("roi_size") or []) == list(p.get("roi_size") or []),
                "over_device_estimate": {ph: (est[f"{ph}_peak_bytes"] / device_estimate[ph] - 1)
                                         if device_estimate[ph] else None for ph in ("train", "infer")},
            }
            estimates.append(est)
    return estimates


def fit_from_run(memory: dict[str, Any], estimates: list[dict[str, Any] | None], device_calibration: dict[str, Any],
                 command: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The version-2 calibration of a memory call's GPU from its measured points and the CUDA-hidden traces,
    and the fit's report (factors, in-sample and leave-one-out rows). The context and the version-1
    allowance are the device's own."""
    from autotune.calibrate.fit import fit_model, model_points
    from autotune.calibrate.points import calibration_rows
    from autotune.probe.calibration import calibration_record
    from autotune.probe.device_model import BAND

    points = points_of(memory)
    card = memory["gpu"].get("torch_total_memory")
    fit = fit_model(model_points(points, estimates), card)
    allowance = device_calibration.get("allowance") or {}
    v1 = {**allowance, "max_over_prediction": (device_calibration.get("fit") or {}).get("max_over_prediction"),
          "points": (device_calibration.get("fit") or {}).get("points")}
    from autotune.probe.domain import fit_domain

    fitted = {(p.algo, p.n, p.m) for p in model_points(points, estimates)}
    domain = fit_domain(e["domain"] for e in estimates
                        if e and e.get("domain") and (e["domain"][0].template, *e["domain"][1:]) in fitted)
    model = {"kind": "device-model", "context_bytes": int(allowance.get("context_bytes") or 0),
             "workspace": fit["workspace"], "release_after_search": True, "alloc_conf": None, "band": list(BAND),
             "traces": "estimated on a CPU with CUDA hidden (cpu-emulating-cuda), the peaks measured on the GPU",
             "domain": domain, "bounds": fit["bounds"]}
    record = calibration_record(memory["gpu"], v1, calibration_rows(points), command, model=model)
    record["measured_at"] = device_calibration.get("measured_at", record["measured_at"])
    loo = fit["by_template"]["leave_one_out"]
    record["fit"] = {"max_over_prediction": float(fit["summary"]["leave_one_out"]["max_over"]),
                     "points": fit["summary"]["fitted"]["points"] // 2,
                     "by_template": {a: {"max_over_prediction": e["all"]["max_over"], "points": e["all"]["points"] // 2}
                                     for a, e in loo.items()},
                     "model": fit["summary"], "model_by_template": fit["by_template"],
                     "affine_version_1": device_calibration.get("fit")}
    record["fit"]["out_of_sample"] = fit["out_of_sample"]
    record["model_points"] = fit["point_factors"]
    return record, fit


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
    from autotune.probe.calibration import calibration_filename, write_calibration

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
    merged = {"gpu": memory["gpu"], "installed_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "memory": memory, "training": training}
    calibrations_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    if redo_estimates:
        estimates = reestimate(memory, record=True)
        record, fit = fit_from_run(memory, estimates, json.loads(calibration.read_text(encoding="utf-8")),
                                   "python -m benchmarks.gpu_check install (refitted on a CPU from the GPU's points)")
        merged["device_model"] = {k: fit[k] for k in ("workspace", "point_factors", "fitted", "leave_one_out",
                                                      "summary", "by_template", "out_of_sample", "bounds", "verdict")}
        written["calibration"] = write_calibration(calibrations_dir, record)
    else:
        written["calibration"] = Path(shutil.copyfile(calibration, calibrations_dir / name))
    written["results"] = atomic_write_json(results_dir / f"gpu_check_{name}", merged)
    return written
