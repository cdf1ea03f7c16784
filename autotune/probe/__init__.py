"""Probe stage: how much memory and time a bundle's training step and sliding window take.

``run_probe`` runs a short real trial in an isolated child process and returns its
measured peaks, step time and status (ok, oom, error, killed, timeout). ``estimate``
computes the peaks with no compute, under ``FakeTensorMode``; ``fit_memory_model`` fits
peak(N) as a line (``MemoryModel``) from two estimates. ``allowances`` holds what a CUDA device needs beyond
the estimated tensor bytes. Nothing here imports torch until a function runs.
"""

from __future__ import annotations

from autotune.probe.allowances import (
    DEFAULT_CUDA_ALLOWANCE,
    NO_ALLOWANCE,
    CudaAllowance,
    allocator_budget,
    allowance_for,
    allowance_from_record,
    apply_allowance,
    is_calibrated,
)
from autotune.probe.calibration import stated_bound
from autotune.probe.estimate import estimate, fit_memory_model
from autotune.probe.isolation import prestart
from autotune.probe.memory import is_oom_error
from autotune.probe.model import MemoryModel, num_windows
from autotune.probe.replay import marker_batch, replay_of
from autotune.probe.runner import PHASES, VALIDATION_DEVICES, resolve_request, run_probe
from autotune.probe.trial import cuda_result_keys

__all__ = [
    "DEFAULT_CUDA_ALLOWANCE",
    "NO_ALLOWANCE",
    "PHASES",
    "VALIDATION_DEVICES",
    "CudaAllowance",
    "MemoryModel",
    "allocator_budget",
    "allowance_for",
    "allowance_from_record",
    "apply_allowance",
    "cuda_result_keys",
    "estimate",
    "fit_memory_model",
    "is_calibrated",
    "is_oom_error",
    "marker_batch",
    "num_windows",
    "prestart",
    "replay_of",
    "resolve_request",
    "run_probe",
    "stated_bound",
]
