"""Estimate a bundle's peak memory with no compute and no real memory, and fit peak(N) as a line.

``estimate`` runs the same training steps and sliding-window pass as the probe
(``autotune.probe.workload``, ``autotune.step``), with the model, loss and optimizer built by
``autotune.build``, under PyTorch's ``FakeTensorMode`` and the probe's own ``MemoryTracker``:
tensors carry shapes, dtypes and devices but no data, and the tracker counts their storages
exactly as it counts the real ones in a CPU probe. On CPU the estimate equals the probe's
tracked peak; for CUDA the tensors are fake CUDA tensors (this works on a CPU-only build) and
the raw figure leaves out what the allocator and libraries add (see ``autotune.probe.allowances``).

Differences from a real step, each small and pinned by tests:

- What fake tensors cannot do as real ones do (data-dependent Python values, the sliding
  window's importance map, GroupNorm's fake kernels, CUDA autocast with no GPU visible) is
  corrected by the fake session (``autotune.probe.fake``); truth values answered without
  data are counted in ``guessed_values``.
- fp16 on CUDA: no GradScaler (its few scalar tensors are left out).
- The training state a first step leaves (a gradient for every parameter, the optimizer's
  state) is created untraced, then one loader batch is traced: the probe's later steps,
  whose peak is the probe's (the first step, without that state, peaks lower). With
  ``record=True`` the tracker's events are returned as well, from which
  ``autotune.probe.replay`` gives the peak at any other batch size.
- CUDA target with no GPU visible: the pass runs on fake CPU tensors under CUDA's autocast
  rules (``semantics`` is ``"cpu-emulating-cuda"``); a validation volume held on the CPU goes on
  the meta device so it is not counted. cuDNN/cuBLAS-specific saved buffers are not modelled.

Not thread-safe: the fake session patches ``monai.inferers.utils`` while an estimate runs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import ProbeError
from autotune.probe.memory_model import MemoryModel
from autotune.tunables import VALIDATION_DEVICE, Point, ValidationDevice

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from autotune.bundles.model import BundleConfig

__all__ = ["estimate", "fit_memory_model"]


def _resolve(bundle: str | Path | Mapping[str, Any] | BundleConfig, point: Point, device: str, phases: Any,
             precision: str | None) -> dict[str, Any]:
    """Check the arguments the way ``run_probe`` does; returns a request dict."""
    from autotune.probe.runner import resolve_request

    return resolve_request(bundle, point, device=device, memory_limit=None, phases=phases, warmup_steps=1,
                           measure_steps=1, check_device=False, precision=precision)


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Python's cyclic collector off: frees happen where references drop, the same in every trace."""
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _build(config: BundleConfig, target: _Target) -> tuple[torch.nn.Module, Any, torch.optim.Optimizer, Any]:
    """The bundle's network with fake parameters on the target's compute device, its loss, its optimizer
    and the workload they run (``autotune.probe.workload``, or the template's own), as the bundle's template
    family builds them for the probe (``autotune.families``). Must be called inside ``fake_session``."""
    from autotune.families import family_for

    return family_for(config).fake_parts(config, target.compute, target.emulate)


@dataclass(frozen=True)
class _Target:
    """Where the fake pass runs for a requested device and validation device.

    Fake CUDA tensors need CUDA's device guard for autograd, so a CUDA target with no GPU
    visible is emulated on CPU tensors (``emulate``); a validation volume held on the CPU then
    goes on the meta device, so it is not counted.
    """

    emulate: bool
    compute: str
    volume_device: str
    semantics: str

    @classmethod
    def of(cls, device: str, validation_device: ValidationDevice) -> _Target:
        import torch

        emulate = device.startswith("cuda") and not torch.cuda.is_available()
        compute = "cpu" if emulate else device
        volume_device = validation_device.volume_device(compute)
        if emulate and validation_device is ValidationDevice.CPU:  # the host's storages of an emulated GPU are not counted
            volume_device = "meta"
        return cls(emulate, compute, volume_device, "cpu-emulating-cuda" if emulate else device.split(":")[0])


def _trace_training(req: Mapping[str, Any], parts: tuple[Any, Any, Any, Any], compute: str, dtype: Any,
                    record: bool) -> dict[str, Any]:
    """``train_peak_bytes`` of one loader batch stepped through after the state a first step leaves
    (gradients, optimizer state): the peak of the probe's later steps, at half the cost of tracing two.
    With ``record`` also ``train_events``, the tracker's events (``autotune.probe.replay``)."""
    from autotune.probe.tracker import MemoryTracker, tensors_of

    model, loss_fn, optimizer, workload = parts
    n = req["num_patches_per_iter"]
    tracker = MemoryTracker(compute.split(":")[0])
    model.train()
    batches = workload.make_loader_batches(req["config"], n, compute)
    workload.ensure_training_state(model, optimizer)
    if record:
        tracker.record()
    tracker.track(tensors_of(model, optimizer), "state")
    tracker.track(tensors_of(batches), "loader")
    with tracker, _no_gc():
        workload.train_loader_batch(model, loss_fn, optimizer, batches[0], n, dtype, None)
    traced: dict[str, Any] = {"train_events": tracker.events} if record else {}
    del batches  # freed while the tracker still counts, as the probe frees them
    traced["train_peak_bytes"] = tracker.peak_bytes
    tracker.stop()
    return traced


def _trace_validation(req: Mapping[str, Any], parts: tuple[Any, Any, Any, Any], target: _Target, dtype: Any,
                      record: bool = False) -> dict[str, Any]:
    """``infer_peak_bytes``: the tracked peak of validating one volume with the training state alive, as
    training validates; with ``record`` also ``infer_events`` (the training state labelled ``state``)."""
    from autotune.probe.tracker import MemoryTracker, tensors_of
    from autotune.step import make_dice_metric

    config: BundleConfig = req["config"]
    model, _loss_fn, optimizer, workload = parts
    tracker = MemoryTracker(target.compute.split(":")[0])
    workload.ensure_training_state(model, optimizer)
    model.eval()
    volume = workload.make_volume(config, target.volume_device)
    label = workload.make_volume_label(config, target.volume_device)
    if record:
        tracker.record()
    tracker.track(tensors_of(model, optimizer), "state")
    tracker.track(tensors_of(volume, label), "volume")
    with tracker:
        metric = None if target.volume_device == "meta" else make_dice_metric(config)
        out = workload.validate_volume(model, volume, label, config, req["num_sw_batch_size"], target.compute,
                                       dtype, metric)
        del out
    del volume, label
    traced: dict[str, Any] = {"infer_peak_bytes": int(tracker.peak_bytes)}
    if record:
        traced["infer_events"] = tracker.events
    tracker.stop()
    return traced


def estimate(bundle: str | Path | Mapping[str, Any] | BundleConfig, point: Point | Mapping[str, Any] | None = None,
             *, device: str = "cpu", phases: Any = ("train", "infer"), precision: str | None = None,
             record: bool = False, **tuned: Any) -> dict[str, Any]:
    """Estimate the peak tensor memory of a probe of ``bundle`` at ``point``, in this process, with fake tensors.

    ``point`` (``autotune.tunables.Point``) and any tunable given as a keyword as in ``run_probe``, except that
    the validation device left out is ``device`` (the compute device), not the bundle's.

    Returns the probe's result keys where they apply (timings are None), with
    ``measured: False``, ``seconds`` (how long the estimate took), the raw peaks
    ``train_peak_bytes``, ``infer_peak_bytes``, ``peak_bytes`` (no allowance added),
    ``semantics`` (``cpu``, ``cuda``, or ``cpu-emulating-cuda`` for a CUDA target with no GPU
    visible) and ``guessed_values`` (truth values answered without data; see the module
    docstring; ``guessed_values_by_phase``: how many building the parts and each phase's trace answered).
    Only the compute device's storages are counted: for a CUDA target with ``validation_device="cpu"`` the
    volume and stitched output are left out, as on a GPU.

    Raises:
        ConfigError: the bundle is missing or invalid.
        ProbeError: bad arguments, or the fake pass failed (the message names the phase).
    """
    from autotune.build import amp_dtype
    from autotune.probe.fake import fake_session
    from autotune.probe.trial import base_result

    start = time.perf_counter()
    point = Point.of(point, **tuned)
    point = point.with_values(**{VALIDATION_DEVICE.name: ValidationDevice.of(point.validation_device)})
    req = _resolve(bundle, point, device, phases, precision)
    config: BundleConfig = req["config"]
    result = base_result(req)
    result.update(measured=False, status="ok", device_name=None, device_total_memory=None)
    guesses: list[str] = []
    by_phase: dict[str, int] = {}
    phase = "build"
    try:
        import monai
        import torch

        result.update(torch_version=torch.__version__, monai_version=monai.__version__)
        target = _Target.of(req["device"], ValidationDevice(req["validation_device"]))
        result["semantics"] = target.semantics
        dtype = amp_dtype(config, req["device"], req["precision"])
        with fake_session(emulate_cuda=target.emulate, guesses=guesses):
            parts = _build(config, target)
            by_phase["build"] = len(guesses)
            for phase in req["phases"]:
                before = len(guesses)
                result.update(_trace_training(req, parts, target.compute, dtype, record) if phase == "train"
                              else _trace_validation(req, parts, target, dtype, record))
                by_phase[phase] = len(guesses) - before
    except Exception as exc:  # the fake pass is ours: any failure is reported as a ProbeError
        raise ProbeError(f"estimate of {config.algo} failed in phase {phase!r}: {type(exc).__name__}: {exc}") from exc
    peaks = [result[f"{p}_peak_bytes"] for p in ("train", "infer") if result.get(f"{p}_peak_bytes") is not None]
    result["peak_bytes"] = max(peaks) if peaks else None
    result.update(guessed_values=len(guesses), guessed_values_by_phase=by_phase, seconds=time.perf_counter() - start)
    return result


def fit_memory_model(bundle: str | Path | Mapping[str, Any] | BundleConfig,
                     point: Point | Mapping[str, Any] | None = None, *, phase: str = "train",
                     n_values: tuple[int, int] = (1, 2), device: str = "cpu", **tuned: Any) -> MemoryModel:
    """Fit ``MemoryModel`` for ``phase`` from two estimates at ``n_values`` of the tunable that sizes it, the others
    at ``point`` (and any tunable given as a keyword, as in ``estimate``).

    Raises:
        ProbeError: an unknown phase, n_values not two different positive integers, or a failed estimate.
        ConfigError: the bundle is missing or invalid.
    """
    if phase not in ("train", "infer"):
        raise ProbeError(f"unknown phase {phase!r}; valid: train, infer")
    n1, n2 = (int(v) for v in n_values)
    if n1 < 1 or n2 < 1 or n1 == n2:
        raise ProbeError(f"n_values must be two different positive integers, got {n_values!r}")
    point = Point.of(point, **tuned)
    peaks = []
    for n in (n1, n2):
        res = estimate(bundle, point.at(phase, n), device=device, phases=(phase,))
        peaks.append(int(res[f"{phase}_peak_bytes"]))
    slope = (peaks[1] - peaks[0]) / (n2 - n1)
    cap = None
    if phase == "infer":
        from autotune.probe.runner import resolve_request
        from autotune.step import num_windows

        cap = num_windows(resolve_request(bundle, check_device=False)["config"])
    return MemoryModel(intercept=peaks[0] - slope * n1, slope=slope, cap=cap, phase=phase,
                       points=[(n1, peaks[0]), (n2, peaks[1])])
