"""A calibration file as one typed, checked object: ``Calibration`` (``read_calibration``).

A calibration is read back from a folder a person may edit (``autotune.probe.calibration``), so it is parsed
once, where it is read, into the models below; nothing after that reads it as a dict. Every key the three
format versions hold is typed: the version-1 ``allowance``, the ``fit`` with its stated bounds and the
summaries ``calibrate`` prints, the device model (``model``: ``kind``, ``context_bytes``, ``workspace``
factors per template and phase, ``domain`` per ``source:template``, ``bounds`` per situation, ``band``,
...), the measured ``points`` and the fit's ``model_points``. A wrong type, a NaN or infinity, a negative
size or factor, a size or factor beyond any device (``MAX_BYTES``, ``MAX_FACTOR``), a key the format does
not hold or a version newer than this autotune reads is refused in one line naming the file and the key
(``autotune.checks.typed``).

The version is checked against what the file holds: version 1 has no device model, version 2 has one
(``model.workspace``), version 3 adds its domain and its out-of-sample bounds. A file without
``calibration_version`` is read by what it holds (2 with a model, else 1).

``FittedPart`` is the part of a calibration an allowance carries into a plan (``CudaAllowance``): a plan
records it as plain data and it is parsed back with the same fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, model_validator
from pydantic_core import PydanticCustomError

from autotune.checks import Choice, Flag, Integer, Number, Text, Triple
from autotune.checks.typed import Checked, FileModel, OpenModel, parse, refuse_key
from autotune.checks.values import Error, refuse
from autotune.errors import ConfigError
from autotune.precision import PRECISIONS

__all__ = ["CALIBRATION_VERSION", "MAX_BYTES", "MAX_FACTOR", "Calibration", "Allowance", "Fit", "DeviceModelPart",
           "DomainEntry", "Bound", "Bounds", "PhaseFactors", "FittedPart", "read_calibration", "parse_calibration",
           "stated_gpu_name"]

CALIBRATION_VERSION = 3  # the newest format: this autotune reads versions 1 to this one and writes it
#: the largest workspace factor a fit gives (``autotune.probe.model_fit.MAX_FACTOR``, its bisection's top)
MAX_FACTOR = 64.0
MAX_BYTES = 2**44  # 16 TiB: a size beyond any device's memory is a broken file, not a measurement
MAX_FILE_BYTES = 64 * 2**20  # a calibration is a few hundred kB
_MAX_BATCH = 65_536

Bytes = Annotated[int, Checked(Integer(0, MAX_BYTES))]
SignedBytes = Annotated[int, Checked(Integer(-MAX_BYTES, MAX_BYTES))]
Count = Annotated[int, Checked(Integer(0, 10**9))]
Batch = Annotated[int, Checked(Integer(1, _MAX_BATCH))]
Factor = Annotated[float, Checked(Number(0.0, MAX_FACTOR))]
Slack = Annotated[float, Checked(Number(0.0, 1000.0))]
Over = Annotated[float, Checked(Number(0.0, 1000.0))]
Under = Annotated[float, Checked(Number(-1.0, 0.0, low_open=True))]
Signed = Annotated[float, Checked(Number(-1000.0, 1000.0))]
Name = Annotated[str, Checked(Text())]
Precision = Annotated[str, Checked(Choice(PRECISIONS, "precision"))]
Switch = Annotated[bool, Checked(Flag())]
Phase = Literal["train", "infer"]


@dataclass(frozen=True)
class _Multipliers:
    """``model.band``: the multipliers of a workspace factor the prediction is the mean over (1 to 64 finite
    numbers above 0, at most 100)."""

    def __call__(self, value: Any, where: str, error: Error = ConfigError) -> list[float]:
        if not isinstance(value, list) or not 1 <= len(value) <= 64:
            refuse(error, where, value, "must be a list of 1 to 64 multipliers of the workspace factor")
        return [Number(0.0, 100.0, low_open=True)(v, f"{where}[{i}]", error) for i, v in enumerate(value)]


class Allowance(FileModel):
    """``allowance`` (every version): one context, workspace and allocator slack for every template and phase."""

    context_bytes: Bytes
    cudnn_workspace_bytes: Bytes
    allocator_slack_fraction: Slack


class StatedBound(FileModel):
    """``fit.by_template.NAME``: a template's own stated bound (worst over- and under-prediction, fractions)."""

    max_over_prediction: Over | None = None
    max_under_prediction: Over | None = None
    points: Count | None = None


class ErrorSummary(FileModel):
    """``autotune.probe.model_fit.error_summary``: a scheme's worst errors (what ``calibrate`` prints)."""

    points: Count
    within: Count | None = None
    tolerance: Annotated[float, Checked(Number(0.0, 1000.0))] | None = None
    max_over: Signed | None = None
    max_under: Signed | None = None
    max_under_of_card: Signed | None = None


class OutOfSample(FileModel):
    """``fit.out_of_sample``: each validation scheme's summary (leave one template out: per model)."""

    leave_one_template_out: dict[Name, ErrorSummary] | None = None
    leave_one_phase_out: ErrorSummary | None = None
    leave_one_scale_out: ErrorSummary | None = None
    leave_one_out: ErrorSummary | None = None


class AffineFit(OpenModel):
    """``fit.affine_version_1``: the version-1 allowance fitted beside the device model (a report; the keys it
    names are checked, further ones a writer kept are kept)."""

    context_bytes: Bytes | None = None
    cudnn_workspace_bytes: Bytes | None = None
    allocator_slack_fraction: Slack | None = None
    max_over_prediction: Over | None = None
    points: Count | None = None
    by_template: dict[Name, StatedBound] | None = None


class Fit(FileModel):
    """``fit``: how well the calibration predicts; ``max_over_prediction`` (overall, and per template in
    ``by_template``) is the bound a version-1 or -2 file states; the rest is the report ``calibrate`` wrote."""

    max_over_prediction: Over | None = None
    max_under_prediction: Over | None = None
    points: Count | None = None
    by_template: dict[Name, StatedBound] = Field(default_factory=dict)
    model: dict[Name, ErrorSummary] | None = None
    model_by_template: dict[Name, dict[Name, dict[Name, ErrorSummary]]] | None = None
    affine_version_1: AffineFit | None = None
    out_of_sample: OutOfSample | None = None


class PointRow(FileModel):
    """One measured point and phase (``autotune.calibrate.points.calibration_rows``; the CPU's calibration:
    ``benchmarks/calibrate_cpu.py``)."""

    algo: Name | None = None
    n: Batch | None = None
    m: Batch | None = None
    phase: Phase | None = None
    preset: str | None = None
    amp: Switch | None = None
    precision: Precision | None = None
    estimate_bytes: Bytes | None = None
    measured_bytes: Bytes | None = None
    allocated_bytes: Bytes | None = None
    reserved_bytes: Bytes | None = None
    context_bytes: SignedBytes | None = None  # NVML's used memory less the allocator's: may dip below 0


class ModelPoint(FileModel):
    """``model_points``: one point's own workspace factors (``point_factors``)."""

    algo: Name
    n: Batch
    m: Batch
    train: Factor
    infer: Factor


class PhaseFactors(FileModel):
    """A template's workspace factor per phase (``model.workspace.NAME``)."""

    train: Factor
    infer: Factor


class DomainEntry(FileModel):
    """``model.domain["source:template"]``: what a template's factors were fitted on (``autotune.probe.domain``)."""

    template: Name
    source: Name
    network_hash: Name
    precision: Precision
    roi_sizes: list[Annotated[list[int], Checked(Triple(Integer(1, 4096)))]] = Field(default_factory=list)
    infer_volume_shapes: list[Annotated[list[int], Checked(Triple(Integer(1, 65_536)))]] = \
        Field(default_factory=list)
    phases: list[Phase] = Field(default_factory=lambda: ["train", "infer"])
    n: list[Batch] = Field(default_factory=list)
    m: list[Batch] = Field(default_factory=list)


class PhaseBound(FileModel):
    """A phase's worst over- and under-prediction out of sample (fractions of the measured peak)."""

    max_over: Over | None = None
    max_under: Under | None = None


class Bound(FileModel):
    """``model.bounds.in_domain`` or ``.out_of_domain`` (``autotune.calibrate.validate.bounds_of``): the worst
    over- and under-prediction out of sample, per phase, and (inside the domain) per template; empty where no
    point could be held out."""

    max_over: Over | None = None
    max_under: Under | None = None
    points: Count | None = None
    by_phase: dict[Phase, PhaseBound] = Field(default_factory=dict)
    source: str | None = None
    model: str | None = None
    by_template: dict[Name, Bound] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _both_or_neither(self) -> Bound:
        if (self.max_over is None) != (self.max_under is None):
            given, missing = ("max_over", "max_under") if self.max_under is None else ("max_under", "max_over")
            raise PydanticCustomError("autotune", "{text}", {"text": f"{given} is given without {missing}: a bound "
                                                                    "states both"})
        return self

    @property
    def stated(self) -> bool:
        """True when the bound states its figures (a situation where points were held out)."""
        return self.max_over is not None


class Bounds(FileModel):
    """``model.bounds``: the out-of-sample bound per situation."""

    in_domain: Bound = Field(default_factory=Bound)
    out_of_domain: Bound = Field(default_factory=Bound)


def _check_domain_keys(domain: dict[str, DomainEntry] | None, at: str) -> None:
    for key, entry in (domain or {}).items():
        if key != f"{entry.source}:{entry.template}":
            refuse_key(f"{at}.{key}", f"the entry is for {entry.source}:{entry.template}; a domain is stored under "
                                      "'source:template'")


class DeviceModelPart(FileModel):
    """``model`` (versions 2 and 3): the device model's calibrated part (``autotune.probe.device_model``)."""

    kind: Literal["device-model"] = "device-model"
    context_bytes: Bytes | None = None  # the version-1 allowance's where left out
    workspace: dict[Name, PhaseFactors]
    release_after_search: Switch = True
    alloc_conf: str | None = None
    band: Annotated[list[float], Checked(_Multipliers())] | None = None
    traces: str | None = None
    domain: dict[Name, DomainEntry] | None = None
    bounds: Bounds | None = None

    @model_validator(mode="after")
    def _consistent(self) -> DeviceModelPart:
        if not self.workspace:
            refuse_key("model.workspace", "names no template; a device model has a workspace factor per template "
                                          "and phase")
        _check_domain_keys(self.domain, "model.domain")
        return self


class Calibration(FileModel):
    """A calibration file (see the module docstring). ``path`` is the file it was read from."""

    calibration_version: Annotated[int, Checked(Integer(1, 1_000_000))] | None = None
    gpu_name: Name
    total_memory: Bytes | None = None
    driver: str | None = None
    torch: str | None = None
    cuda: str | None = None
    cudnn: Annotated[int, Checked(Integer(0, 10**9))] | None = None
    measured_at: str | None = None
    command: str | None = None
    # the CPU's calibration (``benchmarks/calibrate_cpu.py``) says what it measured
    device: str | None = None
    memory: str | None = None
    processor: str | None = None
    cpu_bf16_native: Switch | None = None
    allowance: Allowance
    fit: Fit | None = None
    points: list[PointRow] = Field(default_factory=list)
    model: DeviceModelPart | None = None
    model_points: list[ModelPoint] = Field(default_factory=list)
    # a dry run's file and a refused fit's say so (neither is ever installed where a lookup finds it)
    dry_run: str | None = None
    refused: str | None = None

    _path: Path | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _version_holds_what_it_says(self) -> Calibration:
        version = self.calibration_version
        if version is None:
            return self
        if version > CALIBRATION_VERSION:
            refuse_key("calibration_version", f"got {version}; this autotune reads versions 1 to "
                                              f"{CALIBRATION_VERSION} (a newer autotune wrote it: upgrade)")
        if version == 1 and self.model is not None:
            refuse_key("calibration_version", "got 1, but the file holds a device model ('model'): a version-1 "
                                              "file has none; set the version to 2 or 3, or remove 'model'")
        if version >= 2 and self.model is None:
            refuse_key("model", f"is missing: a version-{version} file holds the device model")
        if version >= 3 and self.model is not None:
            for key in ("domain", "bounds"):
                if getattr(self.model, key) is None:
                    refuse_key(f"model.{key}", f"is missing: a version-3 file records the fit's {key}")
        return self

    @property
    def version(self) -> int:
        """The format version: as stated, else 2 with a device model and 1 without."""
        return self.calibration_version or (2 if self.model is not None else 1)

    @property
    def path(self) -> Path:
        """The file this calibration was read from."""
        if self._path is None:
            raise ValueError("a calibration parsed from data has no file")
        return self._path

    def context_bytes(self) -> int:
        """The CUDA context: the device model's, else the version-1 allowance's."""
        if self.model is not None and self.model.context_bytes is not None:
            return self.model.context_bytes
        return self.allowance.context_bytes


class FittedPart(OpenModel):
    """What an allowance (``autotune.probe.allowances.CudaAllowance``) carries of a calibration, as a plan
    records it: the version-1 figures, and the device model's factors, domain and bounds where there is one.
    Further keys an older plan recorded are kept, not read."""

    context_bytes: Bytes
    cudnn_workspace_bytes: Bytes
    allocator_slack_fraction: Slack
    source: str | None = None
    workspace_factors: dict[Name, PhaseFactors] | None = None
    release_after_search: Switch = True
    domain: dict[Name, DomainEntry] | None = None
    bounds: Bounds | None = None

    @model_validator(mode="after")
    def _keys(self) -> FittedPart:
        _check_domain_keys(self.domain, "domain")
        return self


def parse_calibration(data: Any, where: str) -> Calibration:
    """``data`` (a calibration file's content) as a ``Calibration``; ``where`` names it in a refusal.

    Raises:
        ConfigError: one line naming ``where``, the key, the value and what is allowed.
    """
    import math

    from autotune.checks import leaves

    calibration = parse(Calibration, data, where)
    for key, value in leaves(data):  # in what the models keep without reading (a report's further keys)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{where}: key {key!r}: got {value!r}; must be a finite number")
    return calibration


def _load_json(path: Path) -> Any:
    """The JSON ``path`` holds.

    Raises:
        ConfigError: the file cannot be read, is too large, or is not JSON."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConfigError(f"{path}: {size} bytes, more than a calibration's {MAX_FILE_BYTES}; it is not a "
                              f"calibration: move it out of {path.parent}")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc}); fix its permissions or move it out "
                          f"of {path.parent}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; a calibration is JSON: fix it or move it out of "
                          f"{path.parent}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{path}: not JSON ({exc}); fix it or move it out of {path.parent}") from None


def read_calibration(path: Path) -> Calibration:
    """The calibration in ``path``, checked (see the module docstring).

    Raises:
        ConfigError: one line naming the file and the key at fault.
    """
    try:
        calibration = parse_calibration(_load_json(path), str(path))
    except ConfigError as exc:
        if str(exc).startswith(f"{path}: key") or str(exc).startswith(f"{path}: unknown key"):
            raise ConfigError(f"{exc}; fix it, calibrate again ('autotune calibrate') or move the file out of "
                              f"{path.parent}") from None
        raise
    calibration._path = path
    return calibration


def stated_gpu_name(path: Path) -> str | None:
    """The GPU a file names (its ``gpu_name`` as text), however malformed the rest; None when it names none or
    is not JSON."""
    try:
        data = _load_json(path)
    except ConfigError:
        return None
    name = data.get("gpu_name") if isinstance(data, dict) else None
    return name if isinstance(name, str) and name.strip() else None
