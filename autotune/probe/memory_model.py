"""The affine memory model: peak bytes as a line in the batch size, with an optional cap.

``MemoryModel`` is ``peak(N) = intercept + slope * N``, fitted from two fake passes
(``autotune.probe.estimate.fit_memory_model``). It serves ``autotune estimate``'s report
(``autotune.probe.report``): the predicted peak at N and the largest N under a limit
(``max_fitting``). The search does not use it: a training peak is not affine in N (a
loader batch holds lcm(N, crops) patches), so the fast search reads the replayed curve of one
trace (``autotune.probe.replay``) instead. The cap of a sliding-window batch is the number of
windows over the validation volume (``autotune.step.num_windows``): past it a larger batch
holds no more memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["MAX_FITTING", "MemoryModel"]

MAX_FITTING = 1 << 20  # max_fitting's answer when memory does not grow with N and nothing caps it


@dataclass
class MemoryModel:
    """Peak memory as a line in the batch size: ``peak(N) = intercept + slope * N`` bytes.

    Attributes:
        intercept: bytes at N = 0 (model, gradients, optimizer state, fixed buffers).
        slope: bytes per unit of N.
        cap: the N beyond which memory no longer grows (a sliding-window batch larger than
            the number of windows), or None; ``predict`` reads no further and ``max_fitting``
            never answers more than it.
        phase: "train" (N is ``num_patches_per_iter``), "infer" (``num_sw_batch_size``), or None.
        points: the (N, peak) pairs it was fitted to.
    """

    intercept: float
    slope: float
    cap: int | None = None
    phase: str | None = None
    points: list[tuple[int, int]] = field(default_factory=list)

    def predict(self, n: int) -> float:
        """Predicted peak bytes at ``n``."""
        if self.cap is not None:
            n = min(n, self.cap)
        return self.intercept + self.slope * n

    def max_fitting(self, limit_bytes: float) -> int:
        """Largest N >= 0 with ``predict(N) <= limit_bytes`` (0 if none; at most ``cap``, else ``MAX_FITTING``)."""
        top = self.cap if self.cap is not None else MAX_FITTING
        if self.slope <= 0:
            return top if self.intercept <= limit_bytes else 0
        n = math.floor((limit_bytes - self.intercept) / self.slope)
        while n > 0 and self.predict(n) > limit_bytes:  # float rounding at the edge
            n -= 1
        while n + 1 <= top and self.predict(n + 1) <= limit_bytes:
            n += 1
        return max(0, min(n, top))
