"""Which precision a bundle computes in: the one place that turns ``amp: true`` into a dtype.

A template's ``amp: true`` means "mixed precision where the device runs it natively":

- CUDA: fp16 autocast with a GradScaler (the default of MONAI's guides, Auto3DSeg and
  nnU-Net; the memory contract and the GPU check were designed for it). bf16 on a GPU
  with native bf16 is available by forcing it (below), without a GradScaler.
- CPU: bf16 autocast only where the processor runs it natively and the template's bf16 training is
  shown to match its fp32 training (``cpu_bf16``, default true; the UNet template says false: see
  docs/precision.md); otherwise fp32. Under bf16 the CPU also keeps CUDA's float32 op list
  (``autotune.autocast``). Without
  native bf16 (no AVX512-BF16/AMX, e.g. many AMD EPYC and older Xeons), oneDNN emulates it
  and a Conv3d runs about 100x slower than in fp32 (measured: BENCHMARKS.md). PyTorch's
  oneDNN check (``torch.ops.mkldnn._is_mkldnn_bf16_supported``) says yes on any AVX512-BW
  CPU, native or not, so a yes is confirmed by a tiny timing: bf16 must not be more than
  ``EMULATED_RATIO`` times slower than fp32.

The answer is decided once per process and per device type. ``AUTOTUNE_PRECISION``
(``auto``, ``fp32``, ``bf16``, ``fp16``; the ``--precision`` flag of run, tune, probe,
estimate, verify, worker and train sets it) forces it either way, for ``amp: true``
and ``amp: false`` bundles alike. ``AUTOTUNE_CPU_BF16`` (``native`` or ``emulated``)
replaces the CPU check, for tests and for machines where the check is wrong.

The precision a study measured is part of its tuning key and of the bundle's ``tuning:``
block; training uses that precision (``for_bundle``), so the memory contract holds.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

__all__ = [
    "PRECISIONS",
    "PRECISION_ENV",
    "CPU_BF16_ENV",
    "EMULATED_RATIO",
    "Precision",
    "resolve_precision",
    "for_config",
    "for_bundle",
    "forced_precision",
    "cpu_bf16_native",
    "dtype_of",
    "precision_scope",
]

PRECISIONS = ("fp32", "bf16", "fp16")
PRECISION_ENV = "AUTOTUNE_PRECISION"
CPU_BF16_ENV = "AUTOTUNE_CPU_BF16"
EMULATED_RATIO = 8.0  # bf16 slower than this many times fp32 on the timing: emulated (native: 0.14-0.3x;
# emulated: 125-130x for a Conv3d on an AVX2 CPU; a busy machine can push a native CPU's ratio to 4x, so the
# reps alternate and the threshold leaves room for load)


@dataclass(frozen=True)
class Precision:
    """The precision a process computes a bundle in, and why.

    Attributes:
        name: ``fp32``, ``bf16`` or ``fp16``.
        reason: one phrase a person can check (``"amp: true; this CPU has no native bfloat16"``).
        forced: set by ``AUTOTUNE_PRECISION`` (or ``--precision``), not decided.
    """

    name: str
    reason: str
    forced: bool = False

    @property
    def autocast(self) -> bool:
        """Whether this precision autocasts (everything but fp32)."""
        return self.name != "fp32"

    def line(self) -> str:
        """The one line run/tune/train print about it."""
        return f"precision {self.name}: {self.reason}"


def dtype_of(name: str | None) -> Any:
    """The autocast dtype of a precision name; None for fp32 or None (no autocast)."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(str(name)) if name else None


def forced_precision() -> str | None:
    """The precision ``AUTOTUNE_PRECISION`` forces, or None for ``auto``/unset.

    Raises:
        SpecError: the variable holds something else.
    """
    from autotune.checks.environment import setting

    value = setting(PRECISION_ENV)
    return None if value in (None, "auto") else str(value)


@contextlib.contextmanager
def precision_scope(precision: str | None) -> Iterator[None]:
    """Force ``precision`` for the calls inside (through ``AUTOTUNE_PRECISION``, which the probes' requests
    and training read); ``auto`` or None leaves the environment as it is. The environment is the
    process's: do not run two scopes in threads at once.

    Raises:
        SpecError: ``precision`` is not auto, fp32, bf16 or fp16.
    """
    from autotune.errors import SpecError

    value = str(precision or "auto").strip().lower()
    if value not in ("auto", *PRECISIONS):
        raise SpecError(f"precision {precision!r}: give auto, fp32, bf16 or fp16")
    if value == "auto":
        yield
        return
    before = os.environ.get(PRECISION_ENV)
    os.environ[PRECISION_ENV] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PRECISION_ENV, None)
        else:
            os.environ[PRECISION_ENV] = before


def _check_forced_on(name: str, kind: str) -> None:
    from autotune.errors import SpecError

    if name == "fp16" and kind == "cpu":
        raise SpecError(f"{PRECISION_ENV}=fp16 on the CPU: fp16 autocast needs a GradScaler, which autotune uses "
                        "on CUDA only; use bf16 or fp32 there")


def resolve_precision(amp: bool, device: str | Any, cpu_bf16: bool = True) -> Precision:
    """The precision for a bundle with ``amp`` on ``device`` (``cpu``, ``cuda``, ``cuda:N``); ``cpu_bf16``
    False: the bundle's template is not shown to train in bf16 on the CPU as in fp32 (``for_config``).

    Raises:
        SpecError: ``AUTOTUNE_PRECISION`` or ``AUTOTUNE_CPU_BF16`` is invalid, or forces fp16 on the CPU.
    """
    kind = str(device).split(":")[0]
    forced = forced_precision()
    if forced is not None:
        _check_forced_on(forced, kind)
        return Precision(forced, f"forced by {PRECISION_ENV}", forced=True)
    if not amp:
        return Precision("fp32", "amp: false in the bundle")
    if kind == "cuda":
        return Precision("fp16", "amp: true; fp16 autocast + GradScaler on CUDA")
    native, how = cpu_bf16_native()
    if native and not cpu_bf16:
        return Precision("fp32", f"amp: true and this CPU runs bfloat16 natively, but this template's bf16 training "
                                 f"on the CPU is not shown to match fp32 (cpu_bf16: false); {PRECISION_ENV}=bf16 "
                                 "forces it")
    if native:
        return Precision("bf16", f"amp: true; this CPU runs bfloat16 natively ({how})")
    return Precision("fp32", f"amp: true, but this CPU has no native bfloat16 ({how}); "
                             f"bf16 would be emulated, about 100x slower; {PRECISION_ENV}=bf16 forces it")


def for_config(config: BundleConfig, device: str | Any) -> Precision:
    """``resolve_precision`` for a bundle config: its ``amp`` and its template's ``cpu_bf16`` (true when the
    template does not say)."""
    return resolve_precision(config.amp, device, config.cpu_bf16 is not False)


def for_bundle(config: BundleConfig, device: str) -> tuple[Precision, str | None]:
    """The precision training runs in, and a warning line or None.

    The precision the bundle was tuned in (``tuning.precision``), when it was tuned on this
    kind of device and nothing forces another; else what ``resolve_precision`` decides.
    """
    here = for_config(config, device)
    plan = config.plan
    tuned = plan.precision if plan is not None else None
    tuned_kind = plan.device.split(":")[0] if plan is not None else ""
    if here.forced or tuned not in PRECISIONS or tuned_kind != str(device).split(":")[0]:
        if here.forced and tuned in PRECISIONS and tuned != here.name:
            return here, (f"precision {here.name} is forced, but this bundle was tuned in {tuned}: "
                          "its memory figures do not hold; retune in the same precision")
        return here, None
    chosen = Precision(str(tuned), "as tuned (tuning.precision)")
    if tuned != here.name:
        return chosen, (f"this bundle was tuned in {tuned}, but this machine would choose {here.name} "
                        f"({here.reason}); training keeps {tuned} so the tuned memory holds: retune here, "
                        f"or set {PRECISION_ENV}={here.name}")
    return chosen, None


def cpu_bf16_native() -> tuple[bool, str]:
    """Whether this CPU runs bfloat16 autocast natively, and how that was decided."""
    from autotune.checks.environment import setting

    value = setting(CPU_BF16_ENV)
    if value is not None:
        return value == "native", f"{CPU_BF16_ENV}={value}"
    return _detected()


@functools.lru_cache(maxsize=1)
def _detected() -> tuple[bool, str]:
    if not _onednn_says_bf16():
        return False, "oneDNN bf16 check: no"
    ratio = _bf16_ratio()
    if ratio > EMULATED_RATIO:
        return False, f"oneDNN bf16 check: yes, but a conv3d ran {ratio:.0f}x slower in bf16 than in fp32"
    return True, f"oneDNN bf16 check: yes; conv3d bf16/fp32 time {ratio:.2f}"


def _onednn_says_bf16() -> bool:
    """PyTorch's own check (yes on any AVX512-BW CPU, native bf16 or not; see the module docstring)."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # a private op: absent in some builds
        return False


def _bf16_ratio(reps: int = 5) -> float:
    """Time of a small Conv3d forward under bf16 autocast over its time in fp32: best of ``reps`` each, the
    two alternating so that a burst of load on a shared machine hits both alike."""
    import torch

    conv = torch.nn.Conv3d(8, 8, 3, padding=1)
    x = torch.randn(1, 8, 24, 24, 24)

    def once(dtype: Any) -> float:
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            start = time.perf_counter()
            conv(x)
            return time.perf_counter() - start

    once(torch.bfloat16), once(None)  # warm-up: oneDNN picks its kernels on the first call
    bf16, fp32 = [], []
    for _ in range(reps):
        bf16.append(once(torch.bfloat16))
        fp32.append(once(None))
    return min(bf16) / max(min(fp32), 1e-9)
