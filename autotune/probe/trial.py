"""What runs in the probe's child process: build the bundle's model, run a few real steps, measure.

Run as ``python -m autotune.probe.trial REQUEST.json``. The request (written by
``autotune.probe.runner``) holds the bundle config's view (parsed back here once into a
``BundleConfig``, ``autotune.bundles.model``) and the trial's settings; the result
is written as JSON to ``request["result_path"]`` and the exit code says how it went:
0 ok, 3 out of memory, 5 non-finite (the loss or the weights after the steps), 1 any other error. While it runs, the child writes what it is
doing (device facts, current phase) to ``request["state_path"]`` so the parent can say
which phase a killed or timed-out child was in.

The network, loss and optimizer come from the bundle's template family (``autotune.families``),
the inputs, the training state and the steps from its workload (``autotune.probe.workload`` for autotune's
own templates), shared with the estimator, so a probe and an estimate allocate the same tensors; faults
injected for tests from ``autotune.probe.faults``. torch is imported inside the functions.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.cuda_alloc import alloc_conf
from autotune.device import device_name, device_total_memory, nvml_used_bytes
from autotune.probe.faults import FAULT_ENV, inject_fault, parse_fault_rules
from autotune.tunables import TUNABLES, ValidationDevice

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from autotune.bundles.model import BundleConfig

__all__ = [
    "EXIT_OK",
    "EXIT_ERROR",
    "CUDA_PHASE_FIELDS",
    "phase_key",
    "cuda_result_keys",
    "EXIT_OOM",
    "EXIT_NONFINITE",
    "NonFiniteProbe",
    "base_result",
    "run_trial",
    "main",
]

EXIT_OK, EXIT_ERROR, EXIT_OOM, EXIT_NONFINITE = 0, 1, 3, 5
# Per-phase CUDA measurements, each stored as ``f"{phase}_{field}"`` (``phase_key``): the
# allocator's peaks, NVML's used memory at the phase's end and the allocator's reserve then.
CUDA_PHASE_FIELDS = ("cuda_max_memory_reserved", "cuda_max_memory_allocated", "nvml_used_bytes",
                     "cuda_memory_reserved_now")
_TAIL_LINES = 15  # lines of a failed trial's traceback kept in its result


class NonFiniteProbe(Exception):
    """The training steps' loss or the weights after them were non-finite: the trial is ``nonfinite``, not a fit."""


def phase_key(phase: str, field: str) -> str:
    """The result key of a per-phase measurement: ``train_cuda_max_memory_reserved``."""
    return f"{phase}_{field}"


def cuda_result_keys() -> tuple[str, ...]:
    """Every CUDA key a trial's result may hold (the evaluator copies these onto trials)."""
    return ("nvml_baseline_used_bytes",
            *(phase_key(p, f) for p in ("train", "infer") for f in CUDA_PHASE_FIELDS))


def _sync(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _train_phase(req: Mapping[str, Any], parts: dict[str, Any], result: dict[str, Any]) -> None:
    config: BundleConfig = req["config"]
    device, n = parts["device"], int(req["num_patches_per_iter"])
    steps = parts["workload"]  # the template family's training step (autotune.probe.workload, or the template's own)
    batch, prefetched = steps.make_loader_batches(config, n, device)
    parts["model"].train()
    losses: list[float] = []  # each loader batch's last loss, as a number (no tensor kept alive)

    def one_batch() -> Any:
        loss = steps.train_loader_batch(parts["model"], parts["loss_fn"], parts["optimizer"], batch, n,
                                        parts["amp_dtype"], parts["scaler"])
        if loss is not None:  # a MONAI bundle's own loop returns none: its weights are checked below
            losses.append(float(loss))
        return loss

    times = _measured_loop(req, parts, result, "train", (parts["model"], parts["optimizer"], batch, prefetched),
                           one_batch)
    _check_finite(losses, parts["model"], str(parts["amp_dtype"] or "torch.float32").replace("torch.", ""))
    result["step_seconds_median"] = statistics.median(times)  # one loader batch
    if len(times) > 1:  # the timing's relative noise: the hand-off's margin (autotune.search.handoff)
        result["step_seconds_spread"] = (max(times) - min(times)) / max(result["step_seconds_median"], 1e-12)
    result["loader_batch_patches"] = int(batch[0].shape[0])
    result["samples_per_s"] = int(batch[0].shape[0]) / max(result["step_seconds_median"], 1e-12)


def _check_finite(losses: Sequence[float], model: Any, dtype: str) -> None:
    """Raise ``NonFiniteProbe`` when a loss or the weights after the steps are non-finite (the steps' memory
    and timings are in the result by then); ``dtype``: what the steps computed in."""
    import math

    from autotune.finite import nonfinite_parameters

    bad = [i for i, value in enumerate(losses) if not math.isfinite(value)]
    broken = nonfinite_parameters(model)
    if not bad and not broken:
        return
    said = (f"the loss was {losses[bad[0]]} at loader batch {bad[0] + 1} of {len(losses)}" if bad
            else f"the weights were non-finite after the steps ({', '.join(broken[:3])})")
    raise NonFiniteProbe(f"{said} ({dtype}): the training steps diverged, so "
                         "this point is not a fit; check the learning rate, or try fp32")


def _infer_phase(req: Mapping[str, Any], parts: dict[str, Any], result: dict[str, Any]) -> None:
    from autotune.step import make_dice_metric

    config: BundleConfig = req["config"]
    device, model, optimizer = parts["device"], parts["model"], parts["optimizer"]
    steps = parts["workload"]  # the template family's validation (autotune.probe.workload, or the template's own)
    steps.ensure_training_state(model, optimizer)
    model.eval()
    volume_device = ValidationDevice(req["validation_device"]).volume_device(device)
    volume, label = steps.make_volume(config, volume_device), steps.make_volume_label(config, volume_device)
    metric = make_dice_metric(config)
    times = _measured_loop(
        req, parts, result, "infer", (model, optimizer, volume, label),
        lambda: steps.validate_volume(model, volume, label, config, int(req["num_sw_batch_size"]), device,
                                parts["amp_dtype"], metric),
    )
    result["sw_seconds_per_volume"] = statistics.median(times)


def _measured_loop(req: Mapping[str, Any], parts: dict[str, Any], result: dict[str, Any], phase: str,
                   existing: Sequence[Any], step: Any) -> list[float]:
    """Run ``step`` warm-up + measured times under the phase's memory measurement; returns measured times."""
    import contextlib

    from autotune.probe import memory

    device = parts["device"]
    warmup, measure = int(req["warmup_steps"]), int(req["measure_steps"])
    times: list[float] = []
    if device.type == "cuda":
        memory.cuda_reset_peaks(str(device))
        tracker = None
    else:
        from autotune.probe.tracker import MemoryTracker, tensors_of

        memory.reset_peak_rss()
        tracker = MemoryTracker("cpu", req.get("memory_limit"))
        tracker.track(tensors_of(*existing))
    try:
        with tracker if tracker is not None else contextlib.nullcontext():
            for index in range(warmup + measure):
                start = time.perf_counter()
                out = step()
                _sync(device)
                del out
                if index >= warmup:
                    times.append(time.perf_counter() - start)
    finally:
        if tracker is not None:
            result[f"{phase}_peak_bytes"] = tracker.peak_bytes
            result[f"{phase}_peak_rss_bytes"] = memory.peak_rss_bytes()
            tracker.stop()
        else:
            try:
                peaks = memory.cuda_peaks(str(device))
            except RuntimeError:  # a broken CUDA context after a failure: keep the failure, not this one
                peaks = {}
            for field in ("cuda_max_memory_reserved", "cuda_max_memory_allocated"):
                result[phase_key(phase, field)] = peaks.get(field)
            result.setdefault("allocator_stats", {})[phase] = memory.cuda_allocator_counts(str(device))
            result[f"{phase}_peak_bytes"] = peaks.get("cuda_max_memory_reserved")
            # NVML sees what the allocator does not: context, library code and handles. The
            # allocator keeps its reserve, so used - reserved now - baseline is that overhead.
            result[phase_key(phase, "nvml_used_bytes")] = nvml_used_bytes(str(device))
            try:
                result[phase_key(phase, "cuda_memory_reserved_now")] = int(torch_cuda_reserved(device))
            except RuntimeError:
                result[phase_key(phase, "cuda_memory_reserved_now")] = None
    return times


def torch_cuda_reserved(device: Any) -> int:
    """Bytes the caching allocator holds on ``device`` now."""
    import torch

    return int(torch.cuda.memory_reserved(device))


def _prepare_device(req: Mapping[str, Any]) -> torch.device:
    """The trial's device, set up as fast training sets it up (CUDA: cuDNN benchmark, the memory limit)."""
    import torch

    from autotune.probe import memory

    device = torch.device(req["device"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # Fast training sets this (the roi is fixed): the probe must pick the same kernels and workspaces.
        torch.backends.cudnn.benchmark = True
        if req.get("memory_limit"):
            memory.cuda_set_memory_limit(str(device), int(req["memory_limit"]))
    return device


def _parts(req: Mapping[str, Any]) -> dict[str, Any]:
    """What the phases run with: device, model (seeded), loss, optimizer, autocast dtype, grad scaler and the
    ``workload`` that steps them, as the bundle's template family builds them (``autotune.families``)."""
    from autotune.build import amp_dtype
    from autotune.families import family_for

    config: BundleConfig = req["config"]
    device = _prepare_device(req)
    return family_for(config).probe_parts(config, device, amp_dtype(config, device, req.get("precision")))


def base_result(req: Mapping[str, Any]) -> dict[str, Any]:
    """The result keys known before anything runs (shared by probe and estimate); ``req["config"]``: the
    ``BundleConfig`` the trial runs."""
    config: BundleConfig = req["config"]
    return {
        "status": None, "phase_failed": None,
        **{t.name: int(req[t.name]) if t.kind == "int" else req[t.name] for t in TUNABLES},
        "device": req["device"], "device_name": None,
        "device_total_memory": None, "memory_limit": req.get("memory_limit"),
        "train_peak_bytes": None, "infer_peak_bytes": None, "peak_bytes": None,
        "step_seconds_median": None, "samples_per_s": None, "sw_seconds_per_volume": None,
        "roi_size": list(config.roi_size), "infer_volume_shape": list(config.infer_volume_shape or config.roi_size),
        "amp": config.amp, "precision": req.get("precision"), "algo": config.algo, "phases": list(req["phases"]),
        "torch_version": None, "monai_version": None, "error_type": None, "error_tail": None,
    }


def run_trial(req: Mapping[str, Any]) -> dict[str, Any]:
    """Run the trial described by ``req`` (``autotune.probe.runner.resolve_request``: its ``config`` a
    ``BundleConfig``) in this process and return its result (never raises for failures of the trial itself:
    they become ``status`` ``oom`` or ``error``)."""
    result = base_result(req)
    timings: dict[str, float] = {}
    result["timings"] = timings
    if req.get("launched_at") is not None:  # interpreter start and autotune import, before run_trial
        timings["interpreter_start"] = max(0.0, time.time() - float(req["launched_at"]))
    state_path = req.get("state_path")
    context = {k: req[k] for k in (*(t.name for t in TUNABLES), "device")}
    phase = req["phases"][0]
    _write_state(state_path, {**result, "phase": phase})
    mark = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        timings[name] = now - mark
        mark = now

    try:
        rules = parse_fault_rules(os.environ.get(FAULT_ENV))
        inject_fault(rules, context, None)
        import monai
        import torch

        lap("imports")

        # NVML before this process touches CUDA: memory other processes already hold on the device.
        result["nvml_baseline_used_bytes"] = nvml_used_bytes(req["device"])
        result["alloc_conf"] = alloc_conf()  # the allocator setting this child runs under (autotune.cuda_alloc)
        result.update(torch_version=torch.__version__, monai_version=monai.__version__,
                      device_name=device_name(req["device"]),
                      device_total_memory=device_total_memory(req["device"]))
        _write_state(state_path, {**result, "phase": phase})
        parts = _parts(req)
        lap("build")
        for phase in req["phases"]:
            _write_state(state_path, {**result, "phase": phase})
            inject_fault(rules, context, phase)
            if phase == "train":
                _train_phase(req, parts, result)
            else:  # training validates with a warm allocator cache: no empty_cache here either
                _infer_phase(req, parts, result)
            lap(phase)
        result["status"] = "ok"
    except NonFiniteProbe as exc:
        result.update(status="nonfinite", phase_failed=phase, error_type="NonFiniteLoss", error_tail=str(exc))
    except Exception as exc:  # noqa: BLE001 - every failure of the trial is reported, none is fatal here
        from autotune.probe.memory import is_oom_error

        result["status"] = "oom" if is_oom_error(exc) else "error"
        result["phase_failed"] = phase
        result["error_type"] = type(exc).__name__
        result["error_tail"] = "".join(traceback.format_exc().splitlines(keepends=True)[-_TAIL_LINES:])
    peaks = [result[f"{p}_peak_bytes"] for p in ("train", "infer") if result.get(f"{p}_peak_bytes") is not None]
    result["peak_bytes"] = max(peaks) if peaks else None
    result["measured"] = True
    return result


def _write_state(path: str | None, state: Mapping[str, Any]) -> None:
    if path:
        from autotune.files import atomic_write_json

        atomic_write_json(path, dict(state))


def main(argv: Sequence[str] | None = None) -> int:
    """Child entry point: read the request, run the trial, write the result; returns the exit code."""
    import faulthandler

    from autotune.files import atomic_write_json

    faulthandler.enable()  # a crash leaves a Python stack on stderr for the parent's error_tail
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m autotune.probe.trial REQUEST.json", file=sys.stderr)
        return EXIT_ERROR
    from autotune.bundles.model import BundleConfig

    req = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    req["config"] = BundleConfig.parse(req["config"], "probe request")  # the parent's view, checked once here
    result = run_trial(req)
    atomic_write_json(req["result_path"], result)
    return {"ok": EXIT_OK, "oom": EXIT_OOM, "nonfinite": EXIT_NONFINITE}.get(result["status"], EXIT_ERROR)


if __name__ == "__main__":  # pragma: no cover
    from autotune.stopping import watch_parent

    watch_parent()  # a fresh interpreter's trial ends with the process that started it
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The result is on disk (fsynced); skip interpreter teardown, which with torch loaded takes seconds.
    os._exit(code)
