"""What a CUDA device needs beyond the tensor bytes the estimator counts.

The estimator's raw peak is the bytes of live tensor storages, each rounded up to 512
as the CUDA caching allocator does: close to ``torch.cuda.max_memory_allocated``. A real
GPU also needs:

- the CUDA context and library handles (CUDA runtime, cuDNN, cuBLAS kernels), which live
  outside the caching allocator, so ``max_memory_reserved`` does not show them;
- cuDNN and cuBLAS workspaces, taken from the caching allocator while a convolution or
  matrix product runs, which a fake pass cannot see;
- allocator slack: the caching allocator reserves whole segments (2 MiB for small
  blocks, larger for big ones) and cannot always reuse freed blocks, so reserved memory
  exceeds allocated memory.

Two models of the last two, by the calibration's version (``autotune.probe.calibration``):

- **the device model** (version 2, ``workspace_factors``): the allocator and cuDNN's algorithm search
  are counted on the estimator's trace (``autotune.probe.device_model``); only cuDNN's workspace is
  calibrated, per template and phase. A GPU without a calibration of its own gets the device model
  with the workspace factors the shipped reference calibration measured (``REFERENCE_GPU``: the
  H200 of the first GPU run), marked as not measured on that GPU.
- **the affine allowance** (version 1, and a plan made before version 2):
  ``peak * (1 + slack) + workspace``, one for every template and phase. Its defaults below are
  round guesses NOT validated on a GPU.

``source`` says which applied, and is recorded in the tuning provenance. On CPU the allowance is
zero: the estimate is the tracked peak itself.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CudaAllowance", "DEFAULT_CUDA_ALLOWANCE", "NO_ALLOWANCE", "DEFAULT_SOURCE", "REFERENCE_GPU",
           "allowance_for", "allowance_from_record", "apply_allowance", "allocator_budget", "default_allowance",
           "is_calibrated", "tensor_budget", "workspace_template"]

_MIB = 1024**2
DEFAULT_SOURCE = "default (not validated on a GPU)"
REFERENCE_GPU = "NVIDIA H200"  # the shipped calibration whose workspace factors a GPU without its own takes


@dataclass(frozen=True)
class CudaAllowance:
    """Bytes a CUDA device needs beyond the estimated tensor peak (defaults NOT validated on a GPU).

    Attributes:
        context_bytes: CUDA context and library code/handles, outside the caching allocator.
        cudnn_workspace_bytes: largest cuDNN/cuBLAS workspace alive at the peak.
        allocator_slack_fraction: reserved minus allocated, as a fraction of the tensor peak.
        source: where the figures come from: ``DEFAULT_SOURCE``, or ``calibration: FILE (GPU, versions)``.
    """

    context_bytes: int = 512 * _MIB
    cudnn_workspace_bytes: int = 256 * _MIB
    allocator_slack_fraction: float = 0.10
    source: str = DEFAULT_SOURCE
    workspace_factors: Mapping[str, Mapping[str, float]] | None = None
    release_after_search: bool = True
    #: what the factors were fitted on (``autotune.probe.domain.fit_domain``; None: a file from before domains)
    domain: Mapping[str, Any] | None = None
    #: the out-of-sample bounds per situation (``autotune.calibrate.validate.bounds_of``; None: not validated)
    bounds: Mapping[str, Any] | None = None

    def affine(self) -> tuple[float, int]:
        """``(scale, offset)`` with ``raw * scale + offset`` = :func:`apply_allowance` without the context."""
        return 1.0 + float(self.allocator_slack_fraction), int(self.cudnn_workspace_bytes)

    def factors(self, template: str | None) -> dict[str, float] | None:
        """The device model's workspace factor per phase for autotune's own ``template`` by name; for a template
        the calibration did not measure, none (0: the allocator's rules alone; another template's factor
        over-predicted by up to 148% out of sample); None without a device model (version 1). Prefer
        ``factors_for``, which holds a bundle against the fit's whole domain."""
        if not self.workspace_factors:
            return None
        if template and template in self.workspace_factors:
            return {phase: float(w) for phase, w in self.workspace_factors[template].items()}
        return {phase: 0.0 for phase in ("train", "infer")}

    def factors_for(self, cfg: Mapping[str, Any], device: str = "cuda:0") -> tuple[dict[str, float] | None, Any]:
        """The workspace factors for a bundle (its view ``cfg``) and the ``DomainCheck`` that chose them: inside
        the fit's domain (``autotune.probe.domain``) the fitted template's factors, outside it none (the raw
        estimator and the allocator's rules). ``(None, None)`` without a device model."""
        if not self.workspace_factors:
            return None, None
        from autotune.probe.domain import bundle_domain, domain_check

        check = domain_check(self.domain, self.workspace_factors, bundle_domain(cfg, device))
        if check.inside:
            return self.factors(str(cfg.get("algo"))), check
        return {phase: 0.0 for phase in ("train", "infer")}, check

    def bound_for(self, check: Any, template: str | None = None) -> dict[str, Any] | None:
        """The out-of-sample bound for an estimate in ``check``'s situation (``in_domain``: the template's, else
        every template's; ``out_of_domain``), ``{"situation", "max_over", "max_under", "source"}``; None when the
        calibration states no validated bound (a file from before it was validated out of sample)."""
        if not self.bounds or check is None:
            return None
        situation = "in_domain" if check.inside else "out_of_domain"
        entry = self.bounds.get(situation) or {}
        if situation == "in_domain" and template:
            entry = (entry.get("by_template") or {}).get(template, entry)
        try:
            over, under = float(entry["max_over"]), float(entry["max_under"])
        except (KeyError, TypeError, ValueError):
            return None
        if not (math.isfinite(over) and math.isfinite(under)) or over < 0 or not -1.0 < under <= 0:
            return None
        return {"situation": situation, "max_over": over, "max_under": under,
                "by_phase": dict(entry.get("by_phase") or {}),
                "source": str(entry.get("source") or situation.replace("_", " "))}

    def plan_scale(self, check: Any, template: str | None, phase: str) -> float:
        """What a plan (``--strategy estimate``) multiplies an estimate of ``phase`` by so that the device's peak
        stays under it by the out-of-sample bound of its situation: ``1 / (1 + max_under)`` (1 where none is
        stated)."""
        found = self.bound_for(check, template)
        if found is None:
            return 1.0
        under = float((found["by_phase"].get(phase) or {}).get("max_under", found["max_under"]))
        return 1.0 / (1.0 + under) if -1.0 < under < 0 else 1.0


DEFAULT_CUDA_ALLOWANCE = CudaAllowance()


NO_ALLOWANCE = CudaAllowance(context_bytes=0, cudnn_workspace_bytes=0, allocator_slack_fraction=0.0, source="cpu")


def is_calibrated(allowance: CudaAllowance) -> bool:
    """True when the figures were fitted on a real GPU (a calibration file), not the defaults."""
    return str(allowance.source).startswith("calibration")


def _from_calibration(found: Mapping[str, Any], source: str) -> CudaAllowance:
    from autotune.probe.calibration import model_factors

    fitted, model = found["allowance"], found.get("model") or {}
    context = int(model.get("context_bytes", fitted["context_bytes"])) if isinstance(model, Mapping) else 0
    return CudaAllowance(
        context_bytes=context,
        cudnn_workspace_bytes=int(fitted["cudnn_workspace_bytes"]),
        allocator_slack_fraction=float(fitted["allocator_slack_fraction"]),
        source=source,
        workspace_factors=model_factors(found),
        release_after_search=bool(model.get("release_after_search", True)) if isinstance(model, Mapping) else True,
        domain=model.get("domain") if isinstance(model, Mapping) and isinstance(model.get("domain"), Mapping) else None,
        bounds=model.get("bounds") if isinstance(model, Mapping) and isinstance(model.get("bounds"), Mapping) else None,
    )


def _describe(found: Mapping[str, Any]) -> str:
    versions = ", ".join(f"{k} {found.get(k)}" for k in ("driver", "torch", "cuda", "cudnn") if found.get(k))
    return f"{Path(found['path']).name} ({found['gpu_name']}; {versions}; {found.get('measured_at')})"


@functools.cache
def default_allowance() -> CudaAllowance:
    """The allowance of a GPU without a calibration: the device model with the workspace factors of the
    shipped reference calibration (``REFERENCE_GPU``), said to be measured on that GPU, not this one; the
    version-1 defaults where the package ships none."""
    from autotune.probe.calibration import PACKAGE_DIR, find_calibration

    found = find_calibration(REFERENCE_GPU, dirs=[PACKAGE_DIR])
    if found is None or not found.get("model"):
        return DEFAULT_CUDA_ALLOWANCE
    when = str(found.get("measured_at") or "")[:10]
    return _from_calibration(found, f"default: {found['gpu_name']}'s workspace factors ({Path(found['path']).name}, "
                                    f"{when}), not measured on this GPU")


def allowance_for(device: str, gpu_name: str | None = None) -> CudaAllowance:
    """The allowance for ``device``: none on the CPU; on CUDA the calibration of the GPU named
    ``gpu_name`` (default: the visible GPU of ``device``) when one exists, else ``default_allowance()``."""
    if not str(device).startswith("cuda"):
        return NO_ALLOWANCE
    from autotune.device import gpu_name as visible_gpu_name
    from autotune.probe.calibration import find_calibration

    name = gpu_name or visible_gpu_name(str(device))
    found = find_calibration(name)
    if found is None:
        return default_allowance()
    return _from_calibration(found, f"calibration: {_describe(found)}")


def workspace_template(cfg: Mapping[str, Any]) -> str | None:
    """The template a calibration's stated edge bound is looked up by for a bundle config (its family's
    ``calibrated_as``: autotune's own templates by name; MONAI's none). The workspace factors themselves are
    chosen by the fit's domain (``CudaAllowance.factors_for``)."""
    from autotune.families import family_for

    return family_for(cfg).calibrated_as(cfg)


def allowance_from_record(record: Mapping[str, Any] | None, device: str) -> CudaAllowance:
    """The allowance a plan or tuning record names (``record["allowances"]``, e.g. a target GPU's
    calibration) on CUDA, else :func:`allowance_for` ``device``. None applies on the CPU."""
    if not str(device).startswith("cuda"):
        return NO_ALLOWANCE
    if record and record.get("allowances"):
        known = {k: v for k, v in record["allowances"].items() if k in CudaAllowance.__dataclass_fields__}
        return CudaAllowance(**known)
    return allowance_for(device)


def allocator_budget(limit_bytes: int, margin: float, allowance: CudaAllowance) -> int:
    """What the caching allocator may hold under a device memory limit: the limit less the
    safety margin (a fraction) and the CUDA context, which lives outside the allocator.
    The one formula tune, verify and estimate use; may be <= 0 (nothing fits)."""
    return int(limit_bytes * (1.0 - float(margin))) - int(allowance.context_bytes)


def tensor_budget(allocator_bytes: float, allowance: CudaAllowance) -> float:
    """The largest raw tensor peak whose :func:`apply_allowance` (without the context) stays
    within ``allocator_bytes``: the inverse of ``peak * (1 + slack) + workspace``."""
    return (float(allocator_bytes) - allowance.cudnn_workspace_bytes) / (1.0 + allowance.allocator_slack_fraction)


def apply_allowance(peak_bytes: float, allowance: CudaAllowance, *, include_context: bool = True) -> int:
    """Device memory needed for an estimated tensor peak: ``peak * (1 + slack) + workspace (+ context)``.

    Leave the context out (``include_context=False``) when comparing with a limit on the
    caching allocator, such as the probe's ``memory_limit`` on CUDA; keep it when comparing
    with the device's total memory.

    Raises:
        ValueError: a negative peak or allowance.
    """
    if peak_bytes < 0 or allowance.context_bytes < 0 or allowance.cudnn_workspace_bytes < 0 \
            or allowance.allocator_slack_fraction < 0:
        raise ValueError("peak_bytes and every allowance must be >= 0")
    total = peak_bytes * (1.0 + allowance.allocator_slack_fraction) + allowance.cudnn_workspace_bytes
    if include_context:
        total += allowance.context_bytes
    return int(math.ceil(total))
