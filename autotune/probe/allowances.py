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
from dataclasses import InitVar, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.bundles.model import BundleConfig
    from autotune.probe.calibration_file import Calibration, FittedPart

__all__ = ["CudaAllowance", "DEFAULT_CUDA_ALLOWANCE", "NO_ALLOWANCE", "DEFAULT_SOURCE", "REFERENCE_GPU",
           "allowance_for", "allowance_from_record", "apply_allowance", "allocator_budget", "default_allowance",
           "is_calibrated", "tensor_budget", "workspace_template"]

_MIB = 1024**2
DEFAULT_SOURCE = "default (not validated on a GPU)"
REFERENCE_GPU = "NVIDIA H200"  # the shipped calibration whose workspace factors a GPU without its own takes
_ZERO = {"train": 0.0, "infer": 0.0}


@dataclass(frozen=True)
class CudaAllowance:
    """Bytes a CUDA device needs beyond the estimated tensor peak (defaults NOT validated on a GPU).

    The fields are plain data, as a plan records them (``dataclasses.asdict``); the device model's part
    (``workspace_factors``, ``domain``, ``bounds``) is checked once when the allowance is made, into
    ``fitted`` (``autotune.probe.calibration_file.FittedPart``), which the methods read.

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
    #: the checked device-model part when the maker has it already (a calibration's); else checked here
    part: InitVar[Any] = None

    def __post_init__(self, part: Any) -> None:
        if part is None and (self.workspace_factors or self.domain or self.bounds):
            part = _check_part(self, "allowances")
        object.__setattr__(self, "_fitted", part)

    @property
    def fitted(self) -> FittedPart | None:
        """The device model's part, checked (None: no device model, or nothing but the version-1 figures)."""
        return self._fitted  # type: ignore[attr-defined, no-any-return]

    def affine(self) -> tuple[float, int]:
        """``(scale, offset)`` with ``raw * scale + offset`` = :func:`apply_allowance` without the context."""
        return 1.0 + float(self.allocator_slack_fraction), int(self.cudnn_workspace_bytes)

    def factors(self, template: str | None) -> dict[str, float] | None:
        """The device model's workspace factor per phase for autotune's own ``template`` by name; for a template
        the calibration did not measure, none (0: the allocator's rules alone; another template's factor
        over-predicted by up to 148% out of sample); None without a device model (version 1). Prefer
        ``factors_for``, which holds a bundle against the fit's whole domain."""
        factors = self.fitted.workspace_factors if self.fitted is not None else None
        if not factors:
            return None
        if template and template in factors:
            return {"train": factors[template].train, "infer": factors[template].infer}
        return dict(_ZERO)

    def factors_for(self, config: BundleConfig | Mapping[str, Any],
                    device: str = "cuda:0") -> tuple[dict[str, float] | None, Any]:
        """The workspace factors for a bundle (its ``config``; a probe request's view is checked into one) and
        the ``DomainCheck`` that chose them: inside the fit's domain (``autotune.probe.domain``) the fitted
        template's factors, outside it none (the raw estimator and the allocator's rules). ``(None, None)``
        without a device model."""
        fitted = self.fitted
        if fitted is None or not fitted.workspace_factors:
            return None, None
        from autotune.probe.domain import as_bundle_config, bundle_domain, domain_check

        config = as_bundle_config(config)
        check = domain_check(fitted.domain, fitted.workspace_factors, bundle_domain(config, device))
        if check.inside:
            return self.factors(config.algo), check
        return dict(_ZERO), check

    def bound_for(self, check: Any, template: str | None = None) -> dict[str, Any] | None:
        """The out-of-sample bound for an estimate in ``check``'s situation (``in_domain``: the template's, else
        every template's; ``out_of_domain``), ``{"situation", "max_over", "max_under", "by_phase", "source"}``;
        None when the calibration states no validated bound (a file from before it was validated out of
        sample)."""
        bounds = self.fitted.bounds if self.fitted is not None else None
        if bounds is None or check is None:
            return None
        situation = "in_domain" if check.inside else "out_of_domain"
        entry = getattr(bounds, situation)
        if situation == "in_domain" and template and template in entry.by_template:
            entry = entry.by_template[template]
        if not entry.stated:
            return None
        return {"situation": situation, "max_over": entry.max_over, "max_under": entry.max_under,
                "by_phase": {phase: bound.model_dump(exclude_none=True) for phase, bound in entry.by_phase.items()},
                "source": entry.source or situation.replace("_", " ")}

    def plan_scale(self, check: Any, template: str | None, phase: str) -> float:
        """What a plan (``--strategy estimate``) multiplies an estimate of ``phase`` by so that the device's peak
        stays under it by the out-of-sample bound of its situation: ``1 / (1 + max_under)`` (1 where none is
        stated)."""
        found = self.bound_for(check, template)
        if found is None:
            return 1.0
        under = float((found["by_phase"].get(phase) or {}).get("max_under", found["max_under"]))
        return 1.0 / (1.0 + under) if -1.0 < under < 0 else 1.0


def _check_part(allowance: CudaAllowance, where: str) -> FittedPart:
    """``allowance``'s plain fields checked as a ``FittedPart``.

    Raises:
        ConfigError: one line naming ``where`` and the key."""
    from dataclasses import fields

    from autotune.checks.typed import parse
    from autotune.probe.calibration_file import FittedPart

    values = {f.name: getattr(allowance, f.name) for f in fields(allowance)}
    return parse(FittedPart, _plain(values), where)


def _plain(data: Any) -> Any:
    """Mappings as dicts and tuples as lists, all the way down (what a parse of plain data expects)."""
    if isinstance(data, Mapping):
        return {k: _plain(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_plain(v) for v in data]
    return data


DEFAULT_CUDA_ALLOWANCE = CudaAllowance()


NO_ALLOWANCE = CudaAllowance(context_bytes=0, cudnn_workspace_bytes=0, allocator_slack_fraction=0.0, source="cpu")


def is_calibrated(allowance: CudaAllowance) -> bool:
    """True when the figures were fitted on a real GPU (a calibration file), not the defaults."""
    return str(allowance.source).startswith("calibration")


def _from_part(part: FittedPart, source: str) -> CudaAllowance:
    """The allowance of a checked ``FittedPart``: its plain fields (what a plan records) and the part itself."""
    has_model = bool(part.workspace_factors or part.domain or part.bounds)
    return CudaAllowance(
        context_bytes=part.context_bytes, cudnn_workspace_bytes=part.cudnn_workspace_bytes,
        allocator_slack_fraction=part.allocator_slack_fraction, source=source,
        workspace_factors={t: f.model_dump() for t, f in part.workspace_factors.items()}
        if part.workspace_factors is not None else None,
        release_after_search=part.release_after_search,
        domain={k: e.model_dump(exclude_unset=True) for k, e in part.domain.items()}
        if part.domain is not None else None,
        bounds=part.bounds.model_dump(exclude_unset=True) if part.bounds is not None else None,
        part=part if has_model else None)


def _from_calibration(found: Calibration, source: str) -> CudaAllowance:
    """The allowance a calibration gives: its version-1 figures, and its device model where it has one."""
    from autotune.probe.calibration_file import FittedPart

    model = found.model
    return _from_part(FittedPart.model_construct(
        context_bytes=found.context_bytes(), cudnn_workspace_bytes=found.allowance.cudnn_workspace_bytes,
        allocator_slack_fraction=found.allowance.allocator_slack_fraction, source=source,
        workspace_factors=dict(model.workspace) if model else None,
        release_after_search=model.release_after_search if model else True,
        domain=dict(model.domain) if model and model.domain is not None else None,
        bounds=model.bounds if model else None), source)


def _describe(found: Calibration) -> str:
    from autotune.probe.calibration import PACKAGE_DIR

    versions = ", ".join(f"{k} {v}" for k in ("driver", "torch", "cuda", "cudnn") if (v := getattr(found, k)))
    shipped = found.path.parent.resolve() == PACKAGE_DIR
    return f"{found.path.name if shipped else found.path} ({found.gpu_name}; {versions}; {found.measured_at})"


@functools.cache
def default_allowance() -> CudaAllowance:
    """The allowance of a GPU without a calibration: the device model with the workspace factors of the
    shipped reference calibration (``REFERENCE_GPU``), said to be measured on that GPU, not this one; the
    version-1 defaults where the package ships none."""
    from autotune.probe.calibration import PACKAGE_DIR, find_calibration

    found = find_calibration(REFERENCE_GPU, dirs=[PACKAGE_DIR])
    if found is None or found.model is None:
        return DEFAULT_CUDA_ALLOWANCE
    when = str(found.measured_at or "")[:10]
    return _from_calibration(found, f"default: {found.gpu_name}'s workspace factors ({found.path.name}, "
                                    f"{when}), not measured on this GPU")


def allowance_for(device: str, gpu_name: str | None = None) -> CudaAllowance:
    """The allowance for ``device``: none on the CPU; on CUDA the calibration of the GPU named
    ``gpu_name`` (default: the visible GPU of ``device``) when one exists, else ``default_allowance()``.

    Raises:
        ConfigError: the calibration that would be used is malformed (``find_calibration``)."""
    if not str(device).startswith("cuda"):
        return NO_ALLOWANCE
    from autotune.device import gpu_name as visible_gpu_name
    from autotune.probe.calibration import find_calibration

    name = gpu_name or visible_gpu_name(str(device))
    found = find_calibration(name)
    if found is None:
        return default_allowance()
    return _from_calibration(found, f"calibration: {_describe(found)}")


def workspace_template(config: BundleConfig | Mapping[str, Any]) -> str | None:
    """The template a calibration's stated edge bound is looked up by for a bundle config (its family's
    ``calibrated_as``: autotune's own templates by name; MONAI's none). The workspace factors themselves are
    chosen by the fit's domain (``CudaAllowance.factors_for``)."""
    from autotune.families import family_for

    return family_for(config).calibrated_as(config)


def allowance_from_record(record: Mapping[str, Any] | None, device: str,
                          where: str = "the plan's allowances (tuning.allowances)") -> CudaAllowance:
    """The allowance a plan or tuning record names (``record["allowances"]``, e.g. a target GPU's
    calibration) on CUDA, else :func:`allowance_for` ``device``. None applies on the CPU.

    Raises:
        ConfigError: the record's allowances are malformed (one line naming ``where`` and the key).
    """
    if not str(device).startswith("cuda"):
        return NO_ALLOWANCE
    if record and record.get("allowances"):
        from autotune.checks.typed import parse
        from autotune.probe.calibration_file import FittedPart

        part = parse(FittedPart, _plain(record["allowances"]), where)
        return _from_part(part, part.source or DEFAULT_SOURCE)
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
