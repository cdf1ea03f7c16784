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
    allowance_for,
    apply_allowance,
)
from autotune.probe.estimate import estimate, fit_memory_model
from autotune.probe.memory import is_oom_error
from autotune.probe.model import MemoryModel
from autotune.probe.runner import resolve_request, run_probe

__all__ = [
    "DEFAULT_CUDA_ALLOWANCE",
    "NO_ALLOWANCE",
    "CudaAllowance",
    "MemoryModel",
    "allowance_for",
    "apply_allowance",
    "estimate",
    "fit_memory_model",
    "is_oom_error",
    "resolve_request",
    "run_probe",
]
