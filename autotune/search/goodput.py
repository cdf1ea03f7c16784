"""Which batch to hand to training: the template's reference batch or the largest fit (goodput).

Plain arithmetic, no torch, no probes: the hand-off (``autotune.search.handoff``) feeds it
measured samples/s, the tests feed it synthetic ones.

A larger batch pays only where it raises samples/s by more than it costs per sample.
Pollux (Qiao et al., OSDI 2021; its code is petuum/adaptdl, ``adaptdl/goodput.py``)
calls the product *goodput*: system throughput x statistical efficiency, the efficiency
of a batch M against the initial batch M0 being ``E(M) = (phi + M0) / (phi + M)``,
``phi`` the gradient noise scale (McCandlish et al. 2018, "An Empirical Model of
Large-Batch Training": B_noise = tr(Sigma) / |G|^2). The time to a target accuracy is
inversely proportional to goodput, so the predicted speed-up of handing over N instead
of the reference batch N_ref is

    s = (samples/s at N x e(N)) / samples/s at N_ref

with ``e`` the per-sample efficiency the template's learning-rate rule implies:

- ``sqrt`` (lr x sqrt(N/N_ref), the Adam-family rule): e = sqrt(N_ref/N), which is
  exactly Pollux's E(N) with phi = sqrt(N_ref x N), between the two extremes;
- ``linear`` (lr x N/N_ref, Goyal et al.): the rule assumes the linear-scaling regime
  (phi >> N, e = 1), but measured it does not hold at the templates' batches of 1-3
  patches: the full-size UNet on the hippocampus set, `linear` from 2 to 3 patches,
  reached Dice 0.80 at epoch 23 instead of 18 in two runs (training is deterministic
  there), a per-sample efficiency of 0.78, phi about 1.6 (BENCHMARKS.md, "Batch
  scaling"). So ``linear`` is taken at e = sqrt(N_ref/N) as well (0.82 at 2 -> 3): the
  larger batch must raise samples/s faster than sqrt(N/N_ref) for either rule;
- ``none`` (the lr does not follow the batch): a step of N moves the weights about as far
  as a step of N_ref, so the extra samples buy nothing: e = N_ref/N (phi -> 0).

A measured noise scale (``noise_scale``) replaces the rule's assumption with Pollux's
formula; nothing measures it yet (the probes do not record gradient norms).

The larger batch is handed over only when ``s > 1 + margin``, the margin being at least
the measurement noise of the two throughputs (the spread of the probes' step timings),
and never below ``DEFAULT_NOISE`` (timings on a shared machine).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["DEFAULT_NOISE", "HANDOFFS", "DEFAULT_HANDOFF", "Verdict", "per_sample_efficiency", "relative_spread",
           "decide"]

DEFAULT_NOISE = 0.10  # the relative noise of one samples/s figure on a shared machine (objective.TIE_TOLERANCE)
HANDOFFS = ("goodput", "largest")
DEFAULT_HANDOFF = "goodput"


def per_sample_efficiency(lr_scaling: str, reference_batch: int, batch: int,
                          noise_scale: float | None = None) -> float:
    """How much one sample at ``batch`` is worth against one at ``reference_batch`` (1 = as much).

    Args:
        lr_scaling: the template's learning-rate rule: ``linear``, ``sqrt`` or ``none``.
        reference_batch: the template's batch, N_ref.
        batch: the candidate batch, N.
        noise_scale: a measured gradient noise scale (samples); when given, Pollux's
            ``(phi + N_ref) / (phi + N)`` replaces the rule's assumption.
    """
    ref, n = max(1, int(reference_batch)), max(1, int(batch))
    if noise_scale is not None:
        phi = max(0.0, float(noise_scale))
        return (phi + ref) / (phi + n)
    if lr_scaling in ("linear", "sqrt"):  # linear: measured below its assumed regime (module docstring)
        return math.sqrt(ref / n)
    return ref / n


def relative_spread(times: Sequence[float]) -> float | None:
    """The relative noise of a median timing: (max - min) / median; None for fewer than two."""
    values = sorted(float(t) for t in times)
    if len(values) < 2:
        return None
    mid = len(values) // 2
    median = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
    return (values[-1] - values[0]) / median if median > 0 else None


@dataclass(frozen=True)
class Verdict:
    """The rule's inputs and its answer.

    Attributes:
        reference_batch: the template's batch N_ref.
        reference_samples_per_s: measured samples/s at N_ref (None: not measured).
        batch: the candidate (the largest fit under the cap, or the search's choice).
        samples_per_s: measured samples/s at ``batch`` (None: not measured).
        lr_scaling: the template's learning-rate rule.
        efficiency: the per-sample efficiency of ``batch`` against N_ref.
        speedup: predicted speed-up to a target accuracy of ``batch`` over N_ref (None: no prediction).
        margin: what ``speedup`` must pass 1 by.
        handed: the batch to hand over.
        reason: why, in words.
    """

    reference_batch: int
    reference_samples_per_s: float | None
    batch: int
    samples_per_s: float | None
    lr_scaling: str
    efficiency: float
    speedup: float | None
    margin: float
    handed: int
    reason: str

    @property
    def larger(self) -> bool:
        """The larger batch is handed over."""
        return self.handed == self.batch and self.batch > self.reference_batch

    def line(self) -> str:
        """The verdict in one line a person can check."""
        def rate(value: float | None) -> str:
            return "not measured" if value is None else f"{value:.3g}"

        if self.speedup is None:
            return f"{self.reason} -> hand over {self.handed}"
        return (f"samples/s at {self.reference_batch}: {rate(self.reference_samples_per_s)}, at {self.batch}: "
                f"{rate(self.samples_per_s)}, per-sample efficiency {self.efficiency:.3g} ({self.lr_scaling} lr rule), "
                f"predicted speed-up {self.speedup:.3g} (needs > {1 + self.margin:.3g}) -> hand over {self.handed}")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "line": self.line()}


def decide(
    reference_batch: int,
    reference_samples_per_s: float | None,
    batch: int,
    samples_per_s: float | None,
    lr_scaling: str,
    noise: float | None = None,
    noise_scale: float | None = None,
) -> Verdict:
    """Hand over ``batch`` only when its predicted time to a target accuracy beats N_ref's by the margin.

    Args:
        reference_batch: the template's batch N_ref.
        reference_samples_per_s: measured samples/s at N_ref.
        batch: the largest batch that fits under the cap (the candidate).
        samples_per_s: measured samples/s at ``batch``.
        lr_scaling: the template's learning-rate rule (``linear``, ``sqrt``, ``none``).
        noise: the relative noise of the speed-up's inputs (e.g. the step timings' spread at both
            batches, added); the margin is the larger of it and ``DEFAULT_NOISE``.
        noise_scale: a measured gradient noise scale (see ``per_sample_efficiency``).
    """
    ref, n = int(reference_batch), int(batch)
    margin = max(DEFAULT_NOISE, float(noise or 0.0))
    efficiency = per_sample_efficiency(lr_scaling, ref, n, noise_scale)
    if n <= ref:
        why = ("the largest fit is the reference batch" if n == ref
               else f"the reference batch {ref} does not fit; {n} is the largest that does")
        return Verdict(ref, reference_samples_per_s, n, samples_per_s, lr_scaling, efficiency, None, margin, n, why)
    if not reference_samples_per_s or not samples_per_s or reference_samples_per_s <= 0 or samples_per_s <= 0:
        return Verdict(ref, reference_samples_per_s, n, samples_per_s, lr_scaling, efficiency, None, margin, n,
                       f"samples/s not measured at both {ref} and {n} (estimates only, or the tpe baseline): "
                       "the largest fit, unchecked")
    speedup = float(samples_per_s) * efficiency / float(reference_samples_per_s)
    wins = speedup > 1.0 + margin
    reason = (f"{n} is predicted {speedup:.3g}x as fast to a target accuracy as {ref}" if wins else
              f"{n} is not predicted faster to a target accuracy than {ref} by more than {margin:.0%}")
    return Verdict(ref, float(reference_samples_per_s), n, float(samples_per_s), lr_scaling, efficiency, speedup,
                   margin, n if wins else ref, reason)
