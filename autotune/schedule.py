"""The learning-rate schedule with the batch-scaling warm-up, as one closed-form ``LambdaLR``.

A scaled-up learning rate (``autotune.bundles.scaling``) starts at the reference rate
and ramps to the scaled one over ``warmup_steps`` optimizer steps; the template's own
schedule (warm-up cosine, polynomial, cosine, none) multiplies on top. Closed forms,
not chained schedulers: PyTorch's ``PolynomialLR`` and ``CosineAnnealingLR`` update the
rate recursively and would compound with a second scheduler on the same optimizer.
The closed forms equal MONAI's ``WarmupCosineSchedule`` and PyTorch's schedulers step
for step (``tests/bundles/test_batch_scaling.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["base_factor", "lr_factor", "build_scaled_scheduler"]


def base_factor(name: str, args: Mapping[str, Any], total_steps: int) -> Callable[[int], float]:
    """The template schedule's multiplier of the base rate at step ``s`` (``name`` as in ``build.SCHEDULERS``)."""
    total = max(1, int(total_steps))
    if name == "WarmupCosineSchedule":
        warmup = min(max(int(round(float(args.get("warmup_fraction", 0.03)) * total)), 0), total)
        cycles = float(args.get("cycles", 0.5))
        multiplier = float(args.get("warmup_multiplier", 0.0))

        def warm_cosine(step: int) -> float:  # monai.optimizers.WarmupCosineSchedule.lr_lambda
            if step < warmup:
                f = float(step) / float(max(1.0, warmup))
                return multiplier + (1 - multiplier) * f
            progress = float(step - warmup) / float(max(1, total - warmup))
            return max(0.0, 0.5 * (1.0 + math.cos(math.pi * cycles * 2.0 * progress)))

        return warm_cosine
    if name == "PolynomialLR":
        power = float(args.get("power", 1.0))
        return lambda step: (1.0 - min(step, total) / total) ** power
    if name == "CosineAnnealingLR":
        return lambda step: 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total))
    return lambda step: 1.0


def lr_factor(base: Callable[[int], float], warmup_steps: int, start_factor: float) -> Callable[[int], float]:
    """``base`` times a linear ramp from ``start_factor`` to 1 over ``warmup_steps`` steps."""
    warmup = max(0, int(warmup_steps))

    def factor(step: int) -> float:
        ramp = 1.0 if warmup == 0 or step >= warmup else start_factor + (1.0 - start_factor) * step / warmup
        return ramp * base(step)

    return factor


def build_scaled_scheduler(
    section: Mapping[str, Any], optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int,
    start_factor: float,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` for the template schedule ``section`` with the batch-scaling ramp in front."""
    import torch

    name = str(section.get("name", "none"))
    base = base_factor(name, dict(section.get("args") or {}), total_steps)
    # a plain function (not an object) so state_dict() keeps only the step count, and a
    # resumed run rebuilds the factor for its own length
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(base, warmup_steps, start_factor))
