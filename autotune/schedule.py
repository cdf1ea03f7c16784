"""The learning-rate schedule with the batch-scaling warm-up, as one closed-form ``LambdaLR``.

A scaled-up learning rate (``autotune.bundles.scaling``) starts at the reference rate
and ramps to the scaled one over ``warmup_steps`` optimizer steps; the template's own
schedule (warm-up cosine, polynomial, cosine, none) multiplies on top. Closed forms,
not chained schedulers: PyTorch's ``PolynomialLR`` and ``CosineAnnealingLR`` update the
rate recursively and would compound with a second scheduler on the same optimizer.
The closed forms equal MONAI's ``WarmupCosineSchedule`` and PyTorch's schedulers step
for step (``tests/bundles/test_batch_scaling.py``).

``FittedSchedule`` is that factor as an object whose length can change during the run: a run
trained to a wall-clock budget (``autotune train --max-time``) re-plans its total steps from the
measured time per step, and the warm-up and the decay follow (``refit``). Its state is plain data
(``LambdaLR.state_dict`` keeps it), so a checkpoint holds the length the run had planned.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["base_factor", "lr_factor", "FittedSchedule", "build_scaled_scheduler", "fitted_schedule_of"]


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


class FittedSchedule:
    """The learning-rate factor at optimizer step ``s``: the template schedule ``name`` (with ``args``) over
    ``total_steps``, times the batch-scaling ramp of ``warmup_steps`` from ``start_factor``.

    Attributes are plain data only (names, numbers, a dict), because ``LambdaLR.state_dict`` saves them into
    checkpoints that load with ``weights_only=True``.
    """

    def __init__(self, name: str, args: Mapping[str, Any], total_steps: int, warmup_steps: int = 0,
                 start_factor: float = 1.0) -> None:
        self.name = str(name)
        self.args = dict(args)
        self.total_steps = max(1, int(total_steps))
        self.warmup_steps = max(0, int(warmup_steps))
        self.start_factor = float(start_factor)

    def __call__(self, step: int) -> float:
        return lr_factor(base_factor(self.name, self.args, self.total_steps), self.warmup_steps,
                         self.start_factor)(step)

    def refit(self, total_steps: int) -> None:
        """Plan the schedule for ``total_steps`` steps in all (its warm-up and decay follow)."""
        self.total_steps = max(1, int(total_steps))


def build_scaled_scheduler(
    section: Mapping[str, Any], optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int,
    start_factor: float,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` for the template schedule ``section`` with the batch-scaling ramp in front."""
    import torch

    name = str(section.get("name", "none"))
    factor = FittedSchedule(name, dict(section.get("args") or {}), total_steps, warmup_steps, start_factor)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def fitted_schedule_of(scheduler: Any) -> FittedSchedule | None:
    """The ``FittedSchedule`` inside ``scheduler`` (a ``LambdaLR`` made here), or None."""
    for factor in getattr(scheduler, "lr_lambdas", None) or ():
        if isinstance(factor, FittedSchedule):
            return factor
    return None
