"""``torch.compile`` of the network a fast run trains (``fast_training.compile``), eager where it fails.

``compiled_net`` wraps the network in ``CompiledNet``: its calls go through ``torch.compile``'s module
(inductor: fused kernels around each convolution, on the CPU with the machine's C++ compiler, on CUDA with
Triton) until a call fails for any reason but running out of memory; then the run says so in one line and
trains eagerly from that call on (the same weights: the compiled module shares the network's parameters).
The first call's seconds (tracing and compiling) are recorded, so a run's summary can say what compiling cost.
Checkpoints keep the plain network's state dict: the wrapper holds no state of its own.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["CompileRecord", "CompiledNet", "compiled_net"]


@dataclass
class CompileRecord:
    """What a run's ``fast_training.compile`` did: asked, in use, why not, and the first call's seconds."""

    asked: bool = False
    used: bool = False
    reason: str = "fast_training.compile: false"
    first_call_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class CompiledNet:
    """Calls go to ``compiled`` (``torch.compile(model)``) until one fails; then to ``model``, for good."""

    def __init__(self, model: Any, compiled: Any, record: CompileRecord, say: Any = None) -> None:
        self.model, self.compiled, self.record = model, compiled, record
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.compiled is None:
            return self.model(*args, **kwargs)
        first = self.record.first_call_s is None
        t0 = time.perf_counter()
        try:
            out = self.compiled(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - any compiler failure falls back to eager
            from autotune.probe.memory import is_oom_error

            if is_oom_error(exc):
                raise
            self.fall_back(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
            return self.model(*args, **kwargs)
        if first:
            self.record.first_call_s = time.perf_counter() - t0
        return out

    def fall_back(self, why: str) -> None:
        """Train eagerly from now on, saying why once."""
        self.compiled = None
        self.record.used = False
        self.record.reason = f"torch.compile failed, training eagerly: {why}"
        self.say(f"warning: {self.record.reason}")

    def __getattr__(self, name: str) -> Any:  # train(), eval(), parameters(), ... of the network
        return getattr(self.model, name)


def compiled_net(model: Any, asked: bool, say: Any = None) -> tuple[Any, CompileRecord]:
    """``model`` wrapped for ``torch.compile`` when ``asked`` (else itself) and what was decided."""
    if not asked:
        return model, CompileRecord()
    import torch

    try:
        compiled = torch.compile(model)
    except Exception as exc:  # noqa: BLE001 - e.g. a Python or platform torch.compile does not support
        record = CompileRecord(asked=True, used=False, reason=f"torch.compile unavailable: {exc}")
        return model, record
    record = CompileRecord(asked=True, used=True, reason="fast_training.compile: true")
    return CompiledNet(model, compiled, record, say), record
