"""From the largest batch that fits to the batch, learning rate and schedule training gets.

``cap_range`` before the search (the training set caps the searched range of patches per
iteration), ``apply_handoff`` after it (the goodput rule below: the template's reference batch
or the largest fit), ``handoff_updates`` at write-back (the learning rate and the
sample-counted schedule follow the handed batch, by the rules in ``autotune.bundles.scaling``; the
loader batch of each batch is ``autotune.tunables.loader_settings``).

The goodput rule (``decide``) is plain arithmetic, no torch, no probes: the hand-off feeds it
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

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from autotune.bundles.scaling import coverage_cap, scaled_learning_rate, steps_per_epoch
from autotune.errors import AutotuneError
from autotune.families import family_for
from autotune.tunables import loader_settings

if TYPE_CHECKING:
    from autotune.bundles.model import BatchScaling, BundleConfig
    from autotune.bundles.result import TuningResult

__all__ = ["DEFAULT_NOISE", "HANDOFFS", "DEFAULT_HANDOFF", "Verdict", "per_sample_efficiency", "decide",
           "training_set", "cap_range", "batch_report", "apply_handoff", "handoff_updates"]

DEFAULT_NOISE = 0.10  # the relative noise of one samples/s figure on a shared machine (objective.TIE_TOLERANCE)
HANDOFFS = ("goodput", "largest")
DEFAULT_HANDOFF = "goodput"
DEFAULT_LEARNING_RATE = 1e-3  # a bundle with no batch_scaling block and no learning_rate key keeps this one


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


def training_set(config: BundleConfig) -> tuple[int, list[float]]:
    """(training cases of the bundle's fold, median case shape at the training spacing).

    Raises:
        AutotuneError: the datalist or ``datastats.yaml`` cannot be read.
    """
    from autotune.bundles.render import stat, xyz_stat
    from autotune.data.split import split_datalist
    from autotune.errors import ConfigError
    from autotune.utils import read_yaml

    train, _val, _note = split_datalist(config)
    source = config.datastats or ""
    stats = read_yaml(source, ConfigError)
    shape = xyz_stat(stat(stats, "image_stats.shape.median", source), "image_stats#shape#median", source)
    spacing = xyz_stat(stat(stats, "image_stats.spacing.median", source), "image_stats#spacing#median", source)
    resolution = config.resample_resolution
    return len(train), [shape[i] * spacing[i] / resolution[i] for i in range(3)]


def _no_block(config: BundleConfig) -> str:
    """Why a bundle has no ``batch_scaling`` block, and what follows."""
    return family_for(config).no_reference_reason(config)


def _block_for(config: BundleConfig, handoff: str) -> tuple[BatchScaling | None, str | None]:
    """The bundle's checked ``batch_scaling`` block as the write-back applies it, and a note on any change.

    ``--handoff largest`` on a MONAI bundle keeps the template's learning rate, as MONAI's own
    ``auto_scale_*`` does when it changes the batch: the learning-rate rule is taken as ``none``.
    """
    block = config.batch_scaling
    if block is None or handoff != "largest" or not family_for(config).keeps_learning_rate_largest(config):
        return block, None
    return block.model_copy(update={"lr_scaling": "none"}), ("--handoff largest on MONAI's template: the largest fit with the "
                                             "template's learning rate, as MONAI's auto_scale_* hands its batch over")


def _reference_batch(config: BundleConfig) -> int:
    return config.batch_scaling.reference_batch if config.batch_scaling is not None else 1


def cap_range(spec: Any, config: BundleConfig, say: Callable[[str], None]) -> tuple[Any, dict[str, Any]]:
    """Cap ``spec.patches_range`` by the training set; an explicit range is searched as given.

    Returns:
        (the spec to search, the cap's record for the ``tuning:`` block).
    """
    algo = config.algo
    lo, hi = spec.patches_range
    explicit = "range_num_patches_per_iter" in spec.given
    try:
        cases, shape = training_set(config)
    except AutotuneError as exc:
        say(f"[{algo}] no training-set cap on patches/iter: {exc}")
        return spec, {"applied": False, "reason": f"training set unreadable: {exc}", "range": [lo, hi]}
    cap = coverage_cap(cases, shape, config.roi_size, _reference_batch(config))
    info: dict[str, Any] = {**cap.as_dict(), "template_range": [lo, hi], "explicit_range": explicit}
    if explicit:
        if hi > cap.value:
            say(f"[{algo}] warning: patches/iter range {[lo, hi]} passes the training-set cap {cap.value} "
                f"({cases} cases, 5% of their voxels per step); searched as given")
        info.update(applied=False, range=[lo, hi])
        return spec, info
    top = max(lo, min(hi, cap.value))
    info.update(applied=top < hi, range=[lo, top])
    return dataclasses.replace(spec, patches_range=(lo, top)), info


EXTEND_LIMIT = 4096  # the largest N a report reads the estimate at past the searched range ("at least" beyond)


def _memory_would_hold(predicted: int | None, largest: int | None) -> str:
    """``; memory would hold about P (...)`` when the estimator's N at the budget passes the largest fit found."""
    if predicted is None or largest is None or predicted <= largest:
        return ""
    about = f"at least {predicted}" if predicted >= EXTEND_LIMIT else f"about {predicted}"
    return f"; memory would hold {about} (the estimator's N at the budget, not probed)"


def batch_report(record: Mapping[str, Any], cap: Mapping[str, Any], predicted_max: int | None) -> dict[str, Any]:
    """The largest batch that fits, the batch handed to training, and why they differ."""
    handed, largest = record.get("num_patches_per_iter"), record.get("max_num_patches_per_iter")
    lo, top = (cap.get("range") or [None, None])[:2]
    held = _memory_would_hold(predicted_max, largest)
    verdict = record.get("handoff") or {}
    if handed is None:
        reason = "nothing fits"
    elif largest is not None and handed < largest and verdict.get("rule") == "goodput" and \
            verdict.get("handed") == handed:
        reason = f"{largest} fits, but the goodput rule hands over {handed}: {verdict.get('line')}"
    elif largest is not None and handed < largest:
        reason = (f"{largest} fits, but {handed} trained faster on a repeated measurement "
                  "(objective throughput)")
    elif cap.get("applied") and largest == top:
        reason = (f"the training-set cap {top} stops the range (5% of the fold's {cap.get('train_cases')} "
                  f"cases' voxels per step){held}")
    elif largest == top:
        reason = f"the top of the searched range {[lo, top]} stopped the search{held}"
    else:
        reason = f"memory: {handed} is the largest that fits the budget"
    return {"largest_fit_in_range": largest, "predicted_largest_fit": predicted_max, "handed_to_training": handed,
            "searched_range": [lo, top], "reason": reason,
            "cap": {k: v for k, v in cap.items() if k != "range"}}


def _speed(evaluation: Any) -> tuple[float | None, float | None]:
    """(samples/s, relative spread of the step timings) of a training evaluation."""
    result = evaluation.result or {}
    rate, spread = result.get("samples_per_s"), result.get("step_seconds_spread")
    return (float(rate) if rate else None), (float(spread) if spread is not None else None)


def apply_handoff(
    result: TuningResult,
    config: BundleConfig,
    candidate: Any,
    measure_reference: Callable[[int], Any] | None,
    handoff: str,
    say: Callable[[str], None],
) -> TuningResult:
    """Decide which batch a tuned ``result`` hands to training: the result with that batch and the verdict
    (its ``handoff``).

    Args:
        result: the key's tuned result (its ``num_patches_per_iter`` is the search's choice).
        config: the bundle config (its ``batch_scaling`` block: reference batch and lr rule).
        candidate: the search's training evaluation at ``num_patches_per_iter``.
        measure_reference: measures training at a batch (a study point when one exists); None when the
            search measures no speed (estimates, the TPE baseline): the rule cannot decide.
        handoff: ``goodput`` (the rule) or ``largest`` (the search's choice).
        say: progress lines.
    """

    algo, n = config.algo, int(result.num_patches_per_iter or 0)
    if handoff == "largest":
        return result.replace(handoff={
            "rule": "largest", "handed": n,
            "line": f"--handoff largest (the goodput rule is off): the search's batch -> hand over {n}"})
    block = config.batch_scaling
    if block is None:
        said = {"rule": "goodput", "handed": n, "line": f"{_no_block(config)} -> hand over {n}"}
        say(f"[{algo}] hand-off: {said['line']}")
        return result.replace(handoff=said)
    ref = block.reference_batch
    rate, spread = _speed(candidate) if candidate is not None else (None, None)
    reference = None
    ref_rate = ref_spread = None
    if n > ref and measure_reference is not None and rate is not None:
        reference = measure_reference(ref)  # at most one probe; an earlier point at ref is reused
        if reference is not None and reference.feasible:
            ref_rate, ref_spread = _speed(reference)
    noise = (spread or 0.0) + (ref_spread or 0.0)
    verdict = decide(ref, ref_rate, n, rate, block.lr_scaling, noise=noise)
    result = result.replace(handoff={
        "rule": "goodput", **verdict.as_dict(), "largest_fit": result.max_num_patches_per_iter,
        "largest_fit_trial": result.train_trial,
        "reference_trial": reference.trial_number if reference is not None else None})
    say(f"[{algo}] hand-off: {verdict.line()}")
    if verdict.handed == n or reference is None:
        return result
    measured = reference.result or {}
    train_peak = measured.get("train_peak_bytes") or measured.get("peak_bytes")
    return result.replace(
        num_patches_per_iter=verdict.handed, train_trial=reference.trial_number, train_peak_bytes=train_peak,
        samples_per_s=ref_rate,
        peak_bytes=max(int(train_peak or 0), int(result.infer_peak_bytes or 0)) or result.peak_bytes,
    )


def handoff_updates(config: BundleConfig, batch: int, handoff: str = DEFAULT_HANDOFF) -> dict[str, Any]:
    """Learning rate, warm-up and the ``tuning:`` record of both, for ``batch`` patches per step.

    Args:
        config: the bundle config (its ``batch_scaling`` block).
        batch: the batch handed to training.
        handoff: the rule that chose it (``goodput`` or ``largest``; see ``_block_for``).

    Returns:
        top-level keys for the bundle (``learning_rate``, ``lr_warmup_samples``,
        ``lr_warmup_start_factor``) and ``record`` for the ``tuning:`` block (for a MONAI bundle with its
        ``reference``: what a later tuning reads, the configs then holding the tuned values).
    """
    block, note = _block_for(config, handoff)
    crops, epochs = config.num_crops_per_image, config.num_epochs
    try:
        cases = training_set(config)[0]
    except AutotuneError:
        cases = None
    if block is None:
        lr = config.learning_rate if config.learning_rate is not None else DEFAULT_LEARNING_RATE
        return {"learning_rate": lr, "lr_warmup_samples": 0, "lr_warmup_start_factor": 1.0,
                "record": {"lr_scaling": "none", "reason": _no_block(config),
                           "learning_rate": {"before": lr, "after": lr}}}
    ref_batch, ref_lr = block.reference_batch, block.reference_learning_rate
    lr = scaled_learning_rate(ref_lr, ref_batch, batch, block.lr_scaling)
    ramp = lr > ref_lr
    samples_per_epoch = cases * crops if cases is not None else None
    warmup_samples = int(round(block.warmup_epochs * samples_per_epoch)) if ramp and samples_per_epoch else 0
    start = ref_lr / lr if warmup_samples else 1.0
    record: dict[str, Any] = {
        "lr_scaling": block.lr_scaling, "reference_batch": ref_batch, "batch": int(batch),
        "learning_rate": {"before": ref_lr, "after": lr},
        "warmup": {"samples": warmup_samples, "start_factor": round(start, 6),
                   "steps": -(-warmup_samples // int(batch)) if warmup_samples else 0},
    }
    if note:
        record["reason"] = note
    reference = family_for(config).handoff_reference(config)
    if reference is not None:
        record["reference"] = reference
    if cases is not None:
        def steps(n: int) -> int:
            return steps_per_epoch(cases, loader_settings(n, crops)["num_images_per_batch"], crops, n)

        record["schedule"] = {
            "unit": "samples", "train_cases": cases, "samples_per_epoch": samples_per_epoch, "epochs": epochs,
            "total_samples": samples_per_epoch * epochs,
            "steps_per_epoch": {"before": steps(ref_batch), "after": steps(int(batch))},
            "total_steps": {"before": steps(ref_batch) * epochs, "after": steps(int(batch)) * epochs},
        }
    return {"learning_rate": lr, "lr_warmup_samples": warmup_samples, "lr_warmup_start_factor": start,
            "record": record}

