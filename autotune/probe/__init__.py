"""Probe stage: how much memory and time a bundle's training step and sliding window take.

- Measure: ``run_probe`` runs a short real trial in an isolated child process (``runner``,
  ``isolation``, ``trial``) and returns its measured peaks, step time and status (ok, oom,
  error, killed, timeout); ``resolve_request`` checks its arguments (``PHASES``,
  ``VALIDATION_DEVICES``), ``base_result`` gives the keys a probe's or an estimate's result starts
  from; ``prestart`` starts the fork server the children come from.
- Estimate: ``estimate`` computes the peaks with no compute, under ``FakeTensorMode``
  (``estimate``). ``replay_of`` turns one recorded training trace at ``marker_batch`` into the
  exact peak at every N (``TrainingReplay``, ``replay``): the fast search's curve.
  ``fit_memory_model`` fits peak(N) as a line (``MemoryModel``, ``memory_model``) for
  ``estimate_report``, what ``autotune estimate`` prints.
- Count: ``MemoryTracker`` and ``tensors_of`` (``tracker``) count tensor storage bytes the same
  way for the CPU probe, the estimator and CPU training; ``is_oom_error`` and the CUDA
  allocator's peaks and limit are in ``memory``.
- Allow: what a CUDA device needs beyond the counted tensor bytes: the device model counts the
  caching allocator and cuDNN's searches on the recorded trace (``device_model``, ``allocator``)
  with cuDNN's workspace calibrated per GPU, template and phase (``calibration``, ``model_fit``);
  ``allowances`` picks the GPU's calibration (or the reference one) and keeps version 1's affine
  allowance.

Nothing here imports torch until a function runs: ``MemoryTracker`` and ``tensors_of`` are loaded
from ``autotune.probe.tracker`` (which imports torch) on first use.
"""

from __future__ import annotations

from autotune.lazy import lazy_exports
from autotune.probe.allowances import (
    DEFAULT_CUDA_ALLOWANCE,
    NO_ALLOWANCE,
    CudaAllowance,
    allocator_budget,
    allowance_for,
    allowance_from_record,
    apply_allowance,
    default_allowance,
    is_calibrated,
    tensor_budget,
    workspace_template,
)
from autotune.probe.calibration import find_calibration, stated_bound
from autotune.probe.device_estimate import estimate_on_device
from autotune.probe.device_model import predict_reserved
from autotune.probe.estimate import estimate, fit_memory_model
from autotune.probe.isolation import prestart
from autotune.probe.memory import cuda_peaks, cuda_reset_peaks, cuda_set_memory_limit, is_oom_error
from autotune.probe.memory_model import MemoryModel
from autotune.probe.replay import ReplayError, TrainingReplay, marker_batch, replay_of
from autotune.probe.report import default_validation_device, estimate_report
from autotune.probe.runner import PHASES, VALIDATION_DEVICES, resolve_request, run_probe
from autotune.probe.trial import base_result, cuda_result_keys

# names whose module imports torch at its top: imported when first asked for
_LAZY = {"MemoryTracker": "autotune.probe.tracker", "tensors_of": "autotune.probe.tracker"}

__all__ = [
    "DEFAULT_CUDA_ALLOWANCE",
    "NO_ALLOWANCE",
    "PHASES",
    "VALIDATION_DEVICES",
    "CudaAllowance",
    "MemoryModel",
    "MemoryTracker",
    "ReplayError",
    "TrainingReplay",
    "allocator_budget",
    "allowance_for",
    "allowance_from_record",
    "apply_allowance",
    "base_result",
    "cuda_peaks",
    "cuda_reset_peaks",
    "cuda_result_keys",
    "cuda_set_memory_limit",
    "default_allowance",
    "default_validation_device",
    "estimate",
    "estimate_on_device",
    "estimate_report",
    "find_calibration",
    "fit_memory_model",
    "is_calibrated",
    "is_oom_error",
    "marker_batch",
    "predict_reserved",
    "prestart",
    "replay_of",
    "resolve_request",
    "run_probe",
    "stated_bound",
    "tensor_budget",
    "tensors_of",
    "workspace_template",
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
