"""Validate the CUDA path on a real GPU in one command; writes one JSON and prints a short table.

    bash benchmarks/gpu_prepare.sh                                   # here, once: wheels + data to carry
    bash benchmarks/gpu_run.sh                                       # on the GPU machine (device tool)
    python benchmarks/gpu_check.py --out OUT [--hippocampus PATH] [--sections ...] [--deadline 480]
    python benchmarks/gpu_check.py --out OUT --dry-run          # CPU, tiny sizes: keeps the script working in CI

Sections (in this order; ``--sections`` picks some):

- ``env``: GPU name, driver, total memory (NVML and torch), torch / CUDA / cuDNN / MONAI versions.
- ``probes``: for each template (segresnet, dints, unet) at full size, on the hippocampus set
  and on a synthetic CT-sized case (512x512x120 at 0.8x0.8x2.5 mm, made here), real probes
  (``autotune.run_probe``, isolated child) at three fixed batch sizes, recording
  ``max_memory_allocated``, ``max_memory_reserved``, NVML used memory and step time per
  phase, next to the estimator's figure for the same point: on the real GPU (fake CUDA
  tensors) and, in one child with CUDA hidden, as a machine without a GPU plans it.
- ``calibrate``: fits the allowances (context, workspace, allocator slack) to those points
  (``autotune.probe.calibration.fit_allowance``), writes the calibration file under
  ``OUT/calibration/`` and installs it in this tree (``autotune/probe/calibrations/``), so the
  sections after it tune with it.
- ``tune_train``: ``autotune run`` on the CT set at a fixed limit well below the card, then
  ``autotune train`` of each tuned bundle for a few epochs under the same limit: exit code,
  training and validation peaks against the tuned peak and the budget.
- ``fast_regular``: ``autotune train --mode fast`` against ``--mode regular`` on the
  hippocampus set, a few epochs each, per-epoch time and GPU utilisation (NVML, sampled here).
- ``precision``: the same bundle trained in fast mode under ``AUTOTUNE_PRECISION=fp16`` (the CUDA
  default, with a GradScaler) and ``bf16`` (no scaler), the same epochs: per-epoch time, training
  peak memory and the last mean Dice, to decide whether bf16 should be CUDA's default
  (docs/precision.md). A dry run trains once in fp32.
- ``ddp``: ``torchrun --nproc-per-node 1 -m autotune.train`` (NCCL, world size 1) for one epoch.

Every section is guarded: a failure is recorded (type, message, tail) and the next one runs.
Results are written after every measurement, so a run cut short still leaves its JSON.
Nothing here sets a limit or a batch size from the estimator: the batch sizes and limits
are fixed round numbers per dataset.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import LoadSampler  # noqa: E402  (benchmarks/ is the script's folder)

from autotune.files import atomic_write_json  # noqa: E402
from autotune.utils import format_bytes  # noqa: E402

SECTIONS = ("env", "probes", "calibrate", "tune_train", "fast_regular", "precision", "ddp")
ALGOS = ("segresnet", "dints", "unet")
GiB = 1024**3

# Fixed per dataset, chosen by hand (never from the estimator): batch sizes probed, and M = N.
FULL = {
    "algos": ALGOS,
    "hippocampus": {"n_values": (1, 8, 32)},
    "ct": {"n_values": (1, 2, 4), "shape": (512, 512, 120), "spacing": (0.8, 0.8, 2.5), "cases": 4},
    "tune_limit": "24GiB", "tune_algos": ("segresnet", "unet"), "tune_epochs": 3,
    "fr_algo": "unet", "fr_epochs": 4, "probe_timeout": 240.0, "precisions": ("fp16", "bf16"),
}
DRY = {
    "algos": ("unet",),
    "hippocampus": {"n_values": (1, 2)},
    "ct": {"n_values": (1,), "shape": (64, 64, 24), "spacing": (0.8, 0.8, 2.5), "cases": 4},
    "tune_limit": "64MiB", "tune_algos": ("segresnet",), "tune_epochs": 1,
    "fr_algo": "unet", "fr_epochs": 2, "probe_timeout": 240.0, "precisions": ("fp32",),
}


class Check:
    """The run's state: results, output folder, deadline, and a guarded runner for sections."""

    def __init__(self, out: Path, deadline_s: float, dry_run: bool, device: str) -> None:
        self.out, self.dry_run, self.device = out, dry_run, device
        self.t0 = time.monotonic()
        self.deadline = self.t0 + deadline_s
        self.work = Path(os.environ.get("AUTOTUNE_GPU_CHECK_WORK", "/tmp/autotune-gpu-check"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.cfg = DRY if dry_run else FULL
        self.results: dict[str, Any] = {"dry_run": dry_run, "device": device, "sections": {}}
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        self.env.setdefault("PYTHONUNBUFFERED", "1")

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        self.results["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        atomic_write_json(self.out / "gpu_check.json", self.results)

    def say(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {msg}", flush=True)

    def section(self, name: str, func: Callable[[dict[str, Any]], None]) -> None:
        record: dict[str, Any] = {"status": "running"}
        self.results["sections"][name] = record
        if self.left() <= 0:
            record["status"] = "skipped: deadline"
            self.say(f"== {name}: skipped (deadline)")
            self.save()
            return
        self.say(f"== {name}")
        start = time.monotonic()
        load = LoadSampler().start()
        try:
            func(record)
            record["status"] = "ok" if record.get("status") == "running" else record["status"]
        except Exception as exc:  # noqa: BLE001 - a broken section is a result; the next one runs
            record["status"] = "error"
            record["error"] = f"{type(exc).__name__}: {exc}"
            record["traceback"] = traceback.format_exc()[-3000:]
            self.say(f"   {name} failed: {record['error']}")
        record["seconds"] = round(time.monotonic() - start, 1)
        record["load_during_section"] = load.stop()
        self.save()

    def run(self, cmd: list[str], log_name: str, timeout: float | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """A subprocess with its output in OUT/logs (tail kept), bounded by the deadline."""
        limit = max(10.0, min(timeout or 1e9, self.left()))
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=env or self.env,
                                  cwd=str(ROOT))
        except subprocess.TimeoutExpired as exc:
            text = (exc.stdout or "") if isinstance(exc.stdout, str) else ""
            self._log(log_name, f"$ {' '.join(cmd)}\n(timeout after {limit:.0f}s)\n{text}")
            return subprocess.CompletedProcess(cmd, 124, text, "timeout")
        self._log(log_name, f"$ {' '.join(cmd)}\nrc={proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def _log(self, name: str, text: str) -> None:
        # One file: the device tool brings back at most 8 files from OUT.
        with open(self.out / "gpu_check_logs.txt", "a", encoding="utf-8") as handle:
            handle.write(f"===== {name}\n{text[-20000:]}\n")


# ---------------------------------------------------------------- data


def make_ct_dataset(out: Path, cases: int, shape: tuple[int, int, int], spacing: tuple[float, float, float],
                    seed: int = 0) -> Path:
    """A CT-like Decathlon folder: int16 HU volumes (air, a body ellipse, two organs), uint8 labels 0-2."""
    import nibabel as nib
    import numpy as np

    (out / "imagesTr").mkdir(parents=True, exist_ok=True)
    (out / "labelsTr").mkdir(parents=True, exist_ok=True)
    affine = np.diag([*spacing, 1.0])
    training = []
    grid = np.ogrid[tuple(slice(0, s) for s in shape)]
    for index in range(cases):
        rng = np.random.default_rng([seed, index])
        x, y, z = (g.astype(np.float32) for g in grid)
        cx, cy = shape[0] / 2, shape[1] / 2
        body = ((x - cx) / (0.42 * shape[0])) ** 2 + ((y - cy) / (0.32 * shape[1])) ** 2 <= 1.0
        image = np.full(shape, -1000, dtype=np.int16)
        image[np.broadcast_to(body, shape)] = 40
        label = np.zeros(shape, dtype=np.uint8)
        for value, hu in ((1, 120), (2, 250)):
            centre = [c * (0.5 + rng.uniform(-0.15, 0.15)) * 2 for c in (cx, cy, shape[2] / 2)]
            radius = [0.1 * shape[0], 0.1 * shape[1], 0.25 * shape[2]]
            organ = sum(((g - c) / r) ** 2 for g, c, r in zip((x, y, z), centre, radius, strict=True)) <= 1.0
            label[organ] = value
            image[organ] = hu
        image = (image + rng.normal(0, 15, shape)).astype(np.int16)
        name = f"ct_{index:03d}.nii.gz"
        nib.save(nib.Nifti1Image(image, affine), str(out / "imagesTr" / name))
        nib.save(nib.Nifti1Image(label, affine), str(out / "labelsTr" / name))
        training.append({"image": f"./imagesTr/{name}", "label": f"./labelsTr/{name}"})
    (out / "dataset.json").write_text(json.dumps({
        "name": "synthetic-ct", "tensorImageSize": "3D", "modality": {"0": "CT"},
        "labels": {"0": "background", "1": "organ1", "2": "organ2"},
        "numTraining": cases, "numTest": 0, "training": training, "test": [],
    }), encoding="utf-8")
    return out


def datasets(check: Check, hippocampus: Path | None) -> dict[str, Path]:
    """The two datasets: the hippocampus (a copy of a few cases on a dry run) and the synthetic CT."""
    found: dict[str, Path] = {}
    if check.dry_run:
        from autotune.data.synthetic import make_demo_dataset

        found["hippocampus"] = make_demo_dataset(check.work / "demo", cases=10, size=32, classes=2)
    elif hippocampus is not None and (hippocampus / "dataset.json").is_file():
        found["hippocampus"] = hippocampus
    ct = check.cfg["ct"]
    ct_dir = check.work / "ct"
    if not (ct_dir / "dataset.json").is_file():
        make_ct_dataset(ct_dir, ct["cases"], tuple(ct["shape"]), tuple(ct["spacing"]))
    found["ct"] = ct_dir
    return found


def generate(check: Check, name: str, source: Path, algos: tuple[str, ...]) -> dict[str, Path]:
    """Analyse and generate one fold of bundles for ``algos``; returns algo -> bundle folder."""
    from autotune.bundles.bundlegen import BundleGen
    from autotune.data import analyze

    work = check.work / f"work_{name}"
    res = analyze(str(source), str(work), num_fold=1)
    gen = BundleGen(str(work), algos=list(algos), data_stats_filename=res.datastats, data_src_cfg_name=res.data_src)
    if check.dry_run:
        from autotune.bundles.templates import load_overrides

        gen.generate(str(work), num_fold=1, overrides=load_overrides("tiny"))
    else:
        gen.generate(str(work), num_fold=1)
    return {algo: work / f"{algo}_0" for algo in algos}


# ---------------------------------------------------------------- sections


def section_env(check: Check, record: dict[str, Any]) -> None:
    import monai
    import torch

    record.update(python=sys.version.split()[0], torch=torch.__version__, cuda=torch.version.cuda,
                  cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
                  monai=monai.__version__, cpu_count=os.cpu_count(), cuda_available=torch.cuda.is_available())
    if check.device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        record.update(gpu_name=props.name, torch_total_memory=int(props.total_memory),
                      multiprocessors=props.multi_processor_count)
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            driver = pynvml.nvmlSystemGetDriverVersion()
            record.update(driver=driver.decode() if isinstance(driver, bytes) else str(driver),
                          nvml_total_memory=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                          nvml_used_memory_at_start=int(pynvml.nvmlDeviceGetMemoryInfo(handle).used))
            pynvml.nvmlShutdown()
        except Exception as exc:  # noqa: BLE001
            record["nvml_error"] = f"{type(exc).__name__}: {exc}"
    check.results["gpu"] = {"name": record.get("gpu_name", "cpu"), "total_memory": record.get("nvml_total_memory"),
                            "driver": record.get("driver"), "torch": record["torch"], "cuda": record["cuda"],
                            "cudnn": record["cudnn"]}


_EMULATED_CHILD = """
import json, sys
from autotune.probe.estimate import estimate
points = json.load(open(sys.argv[1]))
out = []
for p in points:
    try:
        r = estimate(p["bundle"], num_patches_per_iter=p["n"], num_sw_batch_size=p["n"], device="cuda:0")
        out.append({"train": r["train_peak_bytes"], "infer": r["infer_peak_bytes"], "semantics": r["semantics"],
                    "seconds": r["seconds"]})
    except Exception as exc:
        out.append({"error": f"{type(exc).__name__}: {exc}"})
json.dump(out, open(sys.argv[2], "w"))
"""


def section_probes(check: Check, record: dict[str, Any], sources: dict[str, Path]) -> None:
    from autotune.probe.estimate import estimate
    from autotune.probe.runner import run_probe

    points: list[dict[str, Any]] = []
    record["points"] = points
    bundles: dict[str, dict[str, Path]] = {}
    algos = tuple(check.cfg["algos"])
    for name, source in sources.items():
        bundles[name] = generate(check, name, source, algos)
    record["bundles"] = {d: {a: str(p) for a, p in b.items()} for d, b in bundles.items()}
    for name in sources:
        for algo in algos:
            bundle = bundles[name][algo]
            for n in check.cfg[name]["n_values"]:
                if check.left() < 30:
                    record["status"] = "partial: deadline"
                    return
                point: dict[str, Any] = {"dataset": name, "algo": algo, "n": n, "bundle": str(bundle)}
                res = run_probe(str(bundle), num_patches_per_iter=n, num_sw_batch_size=n, device=check.device,
                                timeout=min(check.cfg["probe_timeout"], max(30.0, check.left() - 20)))
                point["probe"] = {k: v for k, v in res.items() if k not in ("error_tail",)}
                point["probe"]["error_tail"] = (res.get("error_tail") or "")[-800:] or None
                try:
                    est = estimate(str(bundle), num_patches_per_iter=n, num_sw_batch_size=n, device=check.device)
                    point["estimate"] = {"train": est["train_peak_bytes"], "infer": est["infer_peak_bytes"],
                                         "semantics": est.get("semantics"), "seconds": est["seconds"]}
                except Exception as exc:  # noqa: BLE001
                    point["estimate"] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
                point["roi_size"] = res.get("roi_size")
                point["infer_volume_shape"] = res.get("infer_volume_shape")
                points.append(point)
                check.say(_point_line(point))
                check.save()
    if check.device.startswith("cuda") and check.left() > 60:  # as a machine without a GPU would plan
        request = check.work / "emulated_points.json"
        request.write_text(json.dumps([{"bundle": p["bundle"], "n": p["n"]} for p in points]), encoding="utf-8")
        answer = check.work / "emulated_answer.json"
        env = dict(check.env, CUDA_VISIBLE_DEVICES="")
        proc = check.run([sys.executable, "-c", _EMULATED_CHILD, str(request), str(answer)], "emulated_estimates",
                         timeout=check.left() - 30, env=env)
        if proc.returncode == 0 and answer.is_file():
            for point, emulated in zip(points, json.loads(answer.read_text(encoding="utf-8")), strict=False):
                point["estimate_emulated"] = emulated
        else:
            record["emulated_error"] = (proc.stderr or "")[-1000:]


def _point_line(p: dict[str, Any]) -> str:
    pr, est = p["probe"], p.get("estimate", {})
    parts = [f"{p['dataset']:<11} {p['algo']:<9} N={p['n']:<3} {pr.get('status')}"]
    for phase in ("train", "infer"):
        alloc = pr.get(f"{phase}_cuda_max_memory_allocated") or pr.get(f"{phase}_peak_bytes")
        parts.append(f"{phase} alloc {format_bytes(alloc)} est {format_bytes(est.get(phase))}")
    return " | ".join(parts)


def _calibration_points(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for p in points:
        pr, est = p["probe"], p.get("estimate") or {}
        if pr.get("status") != "ok":
            continue
        for phase in ("train", "infer"):
            reserved = pr.get(f"{phase}_cuda_max_memory_reserved")
            allocated = pr.get(f"{phase}_cuda_max_memory_allocated")
            if reserved is None and pr.get("device") == "cpu":  # dry run: the tracked peak stands in for both
                reserved = allocated = pr.get(f"{phase}_peak_bytes")
            if reserved is None or not est.get(phase):
                continue
            nvml, now, base = (pr.get(f"{phase}_nvml_used_bytes"), pr.get(f"{phase}_cuda_memory_reserved_now"),
                               pr.get("nvml_baseline_used_bytes"))
            context = nvml - now - (base or 0) if nvml is not None and now is not None else None
            rows.append({"dataset": p["dataset"], "algo": p["algo"], "n": p["n"], "phase": phase,
                         "estimate_bytes": int(est[phase]), "allocated_bytes": allocated,
                         "reserved_bytes": int(reserved), "context_bytes": context,
                         "step_seconds": pr.get("step_seconds_median") if phase == "train" else pr.get("sw_seconds_per_volume")})
    return rows


def section_calibrate(check: Check, record: dict[str, Any]) -> None:
    from autotune.probe.allowances import CudaAllowance, apply_allowance
    from autotune.probe.calibration import PACKAGE_DIR, calibration_record, fit_allowance, write_calibration

    points = check.results["sections"].get("probes", {}).get("points") or []
    rows = _calibration_points(points)
    record["rows"] = rows
    if not rows:
        raise RuntimeError("no successful probe to calibrate from")
    fit = fit_allowance(rows)
    record["fit"] = fit
    fitted = CudaAllowance(context_bytes=0, cudnn_workspace_bytes=int(fit["cudnn_workspace_bytes"]),
                           allocator_slack_fraction=float(fit["allocator_slack_fraction"]), source="fit")
    errors = []
    for row in rows:
        pred = apply_allowance(row["estimate_bytes"], fitted, include_context=False)
        row["predicted_reserved_bytes"] = pred
        row["estimate_vs_allocated"] = (row["estimate_bytes"] / row["allocated_bytes"] - 1) if row["allocated_bytes"] else None
        row["predicted_vs_reserved"] = pred / row["reserved_bytes"] - 1
        errors.append(abs(row["estimate_vs_allocated"] or 0))
    record["worst_estimate_vs_allocated"] = max(errors)
    record["within_5pct_of_allocated"] = sum(e <= 0.05 for e in errors)
    record["rows_count"] = len(rows)
    if not check.device.startswith("cuda"):
        record["status"] = "ok (CPU dry run: fitted, not installed)"
        return
    cal = calibration_record(check.results["gpu"], fit, rows, "python benchmarks/gpu_check.py")
    out_dir = check.out / "calibration"
    record["file"] = str(write_calibration(out_dir, cal))
    record["installed"] = str(write_calibration(PACKAGE_DIR, cal))


def section_tune_train(check: Check, record: dict[str, Any], sources: dict[str, Path]) -> None:
    cfg = check.cfg
    work = check.work / "work_ct"  # the probes' folder: its analysis is reused (same content hash)
    limit = cfg["tune_limit"]
    cmd = [sys.executable, "-m", "autotune", "run", "--input", str(sources["ct"]), "--work-dir", str(work),
           "--algos", ",".join(cfg["tune_algos"]), "--num-fold", "1", "--device", check.device,
           "--memory-limit", limit, "--storage", f"sqlite:///{check.work}/gpu_check_studies.db"]
    if check.dry_run:
        cmd += ["--overrides", "tiny"]
    t0 = time.monotonic()
    proc = check.run(cmd, "tune_run", timeout=check.left() - 30)
    record.update(limit=limit, run_rc=proc.returncode, run_seconds=round(time.monotonic() - t0, 1),
                  run_tail=(proc.stdout or "")[-2500:] + (proc.stderr or "")[-800:])
    summary_path = work / "autotune_summary.json"
    tuned = json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.is_file() else {}
    record["bundles"] = {}
    for entry in tuned.get("results") or []:
        if not isinstance(entry, dict) or entry.get("status") != "tuned":
            continue
        bundle = Path(entry["bundle"])
        row: dict[str, Any] = {k: entry.get(k) for k in ("num_patches_per_iter", "max_num_patches_per_iter",
                                                         "num_sw_batch_size", "validation_device", "peak_bytes",
                                                         "train_peak_bytes", "infer_peak_bytes", "budget_bytes",
                                                         "probes", "allowances")}
        row["binds"] = entry.get("num_patches_per_iter") is not None and int(entry["num_patches_per_iter"]) < 64
        if check.left() < 40:
            row["train"] = "skipped: deadline"
            record["bundles"][bundle.name] = row
            continue
        t1 = time.monotonic()
        tp = check.run([sys.executable, "-m", "autotune", "train", str(bundle), "--device", check.device,
                        "--epochs", str(cfg["tune_epochs"]), "--val-every", "1", "--memory-limit", limit, "--quiet"],
                       f"train_{bundle.name}", timeout=check.left() - 20)
        row.update(train_rc=tp.returncode, train_seconds=round(time.monotonic() - t1, 1),
                   train_tail=((tp.stdout or "") + (tp.stderr or ""))[-1500:])
        summary = bundle / "model_fold0" / "train_summary.json"
        if summary.is_file():
            s = json.loads(summary.read_text(encoding="utf-8"))
            row.update({k: s.get(k) for k in ("train_peak_bytes", "train_peak_allocated_bytes", "val_peak_bytes",
                                              "val_peak_allocated_bytes", "tuned_peak_bytes", "epochs_run",
                                              "best_metric")})
            peak = max(int(s.get("train_peak_bytes") or 0), int(s.get("val_peak_bytes") or 0))
            if peak and entry.get("budget_bytes"):
                row["training_peak_over_budget"] = peak / int(entry["budget_bytes"])
            if peak and entry.get("peak_bytes"):
                row["training_peak_over_tuned_peak"] = peak / int(entry["peak_bytes"])
        record["bundles"][bundle.name] = row
        check.say(f"   {bundle.name}: N={row['num_patches_per_iter']} rc={row['train_rc']} "
                  f"train peak {format_bytes(row.get('train_peak_bytes'))} val peak "
                  f"{format_bytes(row.get('val_peak_bytes'))} tuned {format_bytes(row.get('peak_bytes'))}")
        check.save()


class _UtilSampler:
    """NVML utilisation and memory every 0.2 s in a thread (None values on the CPU)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled, self.samples, self._stop = enabled, [], threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        while not self._stop.is_set():
            util = pynvml.nvmlDeviceGetUtilizationRates(handle)
            self.samples.append((time.monotonic(), int(util.gpu), int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)))
            time.sleep(0.2)
        pynvml.nvmlShutdown()

    def __enter__(self) -> _UtilSampler:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self.enabled:
            self._thread.join(timeout=5)

    def mean_util(self) -> float | None:
        return statistics.mean(s[1] for s in self.samples) if self.samples else None


def _train_once(check: Check, bundle: Path, mode: str, epochs: int, log: str,
                precision: str | None = None) -> dict[str, Any]:
    model_dir = bundle / "model_fold0"
    shutil.rmtree(model_dir, ignore_errors=True)
    t0 = time.monotonic()
    extra = ["--precision", precision] if precision else []
    with _UtilSampler(check.device.startswith("cuda")) as sampler, LoadSampler() as load:
        proc = check.run([sys.executable, "-m", "autotune", "train", str(bundle), "--device", check.device,
                          "--mode", mode, "--epochs", str(epochs), "--val-every", "1000", "--quiet", *extra], log,
                         timeout=check.left() - 10)
    out: dict[str, Any] = {"mode": mode, "rc": proc.returncode, "wall_s": round(time.monotonic() - t0, 1),
                           "gpu_util_mean": sampler.mean_util(), "load_during_run": load.summary(),
                           "tail": ((proc.stdout or "") + (proc.stderr or ""))[-800:]}
    metrics = model_dir / "metrics.json"
    if metrics.is_file():
        rows = json.loads(metrics.read_text(encoding="utf-8")).get("rows") or []
        out["train_s"] = [r.get("train_s") for r in rows]
        out["data_wait_share"] = [r.get("data_wait_share") for r in rows]
        steady = [r["train_s"] for r in rows[1:] if r.get("train_s")] or [r["train_s"] for r in rows if r.get("train_s")]
        out["epoch_s_median_after_first"] = statistics.median(steady) if steady else None
        out["mean_dice_last"] = rows[-1].get("mean_dice") if rows else None
        peaks = [int(r["train_peak_bytes"]) for r in rows if r.get("train_peak_bytes")]  # tracked on CUDA
        out["train_peak_bytes"] = max(peaks) if peaks else None
    summary = model_dir / "train_summary.json"
    if summary.is_file():
        out["precision"] = json.loads(summary.read_text(encoding="utf-8")).get("precision")
    return out


def section_fast_regular(check: Check, record: dict[str, Any], sources: dict[str, Path]) -> None:
    algo = check.cfg["fr_algo"]
    bundle = generate(check, "hippocampus", sources["hippocampus"], (algo,))[algo]
    epochs = check.cfg["fr_epochs"]
    runs = []
    for mode in ("fast", "regular"):
        if check.left() < 30:
            record["status"] = "partial: deadline"
            break
        runs.append(_train_once(check, bundle, mode, epochs, f"train_{mode}"))
        check.say(f"   {mode}: rc={runs[-1]['rc']} epoch s (after the first) {runs[-1].get('epoch_s_median_after_first')} "
                  f"GPU util {runs[-1].get('gpu_util_mean')}")
        record["runs"] = runs
        check.save()
    by = {r["mode"]: r for r in runs}
    if {"fast", "regular"} <= set(by) and by["fast"].get("epoch_s_median_after_first") \
            and by["regular"].get("epoch_s_median_after_first"):
        record["speedup_per_epoch"] = by["regular"]["epoch_s_median_after_first"] / by["fast"]["epoch_s_median_after_first"]
    record["bundle"] = str(bundle)


def section_precision(check: Check, record: dict[str, Any], sources: dict[str, Path]) -> None:
    bundle = Path(check.results["sections"].get("fast_regular", {}).get("bundle") or "")
    if not bundle.name:
        bundle = generate(check, "hippocampus", sources["hippocampus"], (check.cfg["fr_algo"],))[check.cfg["fr_algo"]]
    runs = []
    for precision in check.cfg["precisions"]:
        if check.left() < 30:
            record["status"] = "partial: deadline"
            break
        run = _train_once(check, bundle, "fast", check.cfg["fr_epochs"], f"train_{precision}", precision)
        runs.append(run)
        check.say(f"   {precision}: rc={run['rc']} epoch s {run.get('epoch_s_median_after_first')} "
                  f"train peak {format_bytes(run.get('train_peak_bytes'))} mean Dice {run.get('mean_dice_last')}")
        record["runs"] = runs
        check.save()


def section_ddp(check: Check, record: dict[str, Any], sources: dict[str, Path]) -> None:
    bundle = Path(check.results["sections"].get("fast_regular", {}).get("bundle") or "")
    if not bundle.name:
        bundle = generate(check, "hippocampus", sources["hippocampus"], ("unet",))["unet"]
    shutil.rmtree(bundle / "model_fold0", ignore_errors=True)
    env = dict(check.env, NCCL_DEBUG="INFO")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "-m", "autotune.train", str(bundle),
           "--device", check.device, "--epochs", "1", "--quiet"]
    proc = check.run(cmd, "ddp", timeout=min(240.0, check.left() - 10), env=env)
    text = (proc.stdout or "") + (proc.stderr or "")
    summary = bundle / "model_fold0" / "train_summary.json"
    record.update(rc=proc.returncode, nccl_seen="NCCL INFO" in text, tail=text[-1500:])
    if summary.is_file():
        s = json.loads(summary.read_text(encoding="utf-8"))
        record.update(world_size=s.get("world_size"), epochs_run=s.get("epochs_run"))


# ---------------------------------------------------------------- table


def table(results: dict[str, Any]) -> str:
    lines = []
    gpu = results.get("gpu", {})
    lines.append(f"GPU: {gpu.get('name')} | driver {gpu.get('driver')} | torch {gpu.get('torch')} | "
                 f"CUDA {gpu.get('cuda')} | cuDNN {gpu.get('cudnn')} | total {format_bytes(gpu.get('total_memory'))}")
    cal = results["sections"].get("calibrate", {})
    rows = cal.get("rows") or []
    if rows:
        lines.append(f"{'dataset':<11} {'algo':<9} {'N':>3} {'phase':<5} {'estimate':>11} {'allocated':>11} "
                     f"{'est/alloc':>9} {'reserved':>11} {'pred/res':>8} {'step s':>7}")
        for r in rows:
            lines.append(f"{r['dataset']:<11} {r['algo']:<9} {r['n']:>3} {r['phase']:<5} "
                         f"{format_bytes(r['estimate_bytes']):>11} {format_bytes(r['allocated_bytes']):>11} "
                         f"{100 * (r['estimate_vs_allocated'] or 0):+8.1f}% {format_bytes(r['reserved_bytes']):>11} "
                         f"{100 * r['predicted_vs_reserved']:+7.1f}% {r['step_seconds'] or 0:7.3f}")
        fit = cal.get("fit", {})
        lines.append(f"fit: context {format_bytes(fit.get('context_bytes'))}, workspace "
                     f"{format_bytes(fit.get('cudnn_workspace_bytes'))}, slack {fit.get('allocator_slack_fraction')}; "
                     f"worst |est/alloc - 1| {100 * cal.get('worst_estimate_vs_allocated', 0):.1f}%")
    probes = results["sections"].get("probes", {}).get("points") or []
    failed = [p for p in probes if p["probe"].get("status") != "ok"]
    for p in failed:
        lines.append(f"probe {p['dataset']} {p['algo']} N={p['n']}: {p['probe'].get('status')} "
                     f"{p['probe'].get('error_type')}")
    tt = results["sections"].get("tune_train", {})
    for name, b in (tt.get("bundles") or {}).items():
        lines.append(f"tune+train {name}: N={b.get('num_patches_per_iter')} (binds {b.get('binds')}) sw={b.get('num_sw_batch_size')} "
                     f"rc={b.get('train_rc')} train peak {format_bytes(b.get('train_peak_bytes'))} val peak "
                     f"{format_bytes(b.get('val_peak_bytes'))} / tuned {format_bytes(b.get('peak_bytes'))} / budget "
                     f"{format_bytes(b.get('budget_bytes'))}")
    fr = results["sections"].get("fast_regular", {})
    for r in fr.get("runs") or []:
        lines.append(f"{r['mode']:<8} rc={r['rc']} epoch s {r.get('epoch_s_median_after_first')} "
                     f"GPU util {r.get('gpu_util_mean')}")
    if fr.get("speedup_per_epoch"):
        lines.append(f"fast vs regular per epoch: {fr['speedup_per_epoch']:.1f}x")
    for r in results["sections"].get("precision", {}).get("runs") or []:
        lines.append(f"precision {r.get('precision')}: rc={r['rc']} epoch s {r.get('epoch_s_median_after_first')} "
                     f"train peak {format_bytes(r.get('train_peak_bytes'))} mean Dice {r.get('mean_dice_last')}")
    ddp = results["sections"].get("ddp", {})
    if ddp:
        lines.append(f"ddp: rc={ddp.get('rc')} world_size={ddp.get('world_size')} nccl_seen={ddp.get('nccl_seen')}")
    for name, sec in results["sections"].items():
        lines.append(f"section {name}: {sec.get('status')} ({sec.get('seconds')} s) {sec.get('error') or ''}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for gpu_check.json, gpu_check_logs.txt and calibration/")
    parser.add_argument("--hippocampus", default=None, help="Task04_Hippocampus folder (Decathlon layout)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated from {','.join(SECTIONS)}")
    parser.add_argument("--deadline", type=float, default=480.0, help="seconds; sections after it are skipped")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny preset, small data (CI keeps it working)")
    args = parser.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {unknown}; valid: {', '.join(SECTIONS)}")
    import torch

    device = "cuda:0" if torch.cuda.is_available() and not args.dry_run else "cpu"
    if not args.dry_run and device == "cpu":
        print("no CUDA device visible: run with --dry-run on a CPU", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    check = Check(out, args.deadline, args.dry_run, device)
    hippocampus = Path(args.hippocampus) if args.hippocampus else None
    sources: dict[str, Path] = {}
    check.section("env", lambda r: section_env(check, r))
    if set(sections) - {"env"}:
        check.section("data", lambda r: (sources.update(datasets(check, hippocampus)),
                                         r.update({k: str(v) for k, v in sources.items()})))
    if "probes" in sections:
        check.section("probes", lambda r: section_probes(check, r, sources))
    if "calibrate" in sections:
        check.section("calibrate", lambda r: section_calibrate(check, r))
    if "tune_train" in sections:
        check.section("tune_train", lambda r: section_tune_train(check, r, sources))
    if "fast_regular" in sections and "hippocampus" in sources:
        check.section("fast_regular", lambda r: section_fast_regular(check, r, sources))
    if "precision" in sections and "hippocampus" in sources:
        check.section("precision", lambda r: section_precision(check, r, sources))
    if "ddp" in sections and "hippocampus" in sources:
        check.section("ddp", lambda r: section_ddp(check, r, sources))
    check.save()
    print(table(check.results), flush=True)
    bad = [n for n, s in check.results["sections"].items() if str(s.get("status")).startswith("error")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
