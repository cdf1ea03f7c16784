"""Probers: how the searcher gets a point evaluated.

``ProbeProber`` runs a real, isolated trial (``autotune.probe``); ``EstimateProber``
answers from the FakeTensor estimator alone (plans for a GPU you do not have). Both give
the strategies the estimator's curves: training from one trace (``training_replay``),
the sliding window from a few point estimates (``memory_curve``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from autotune.tunables import BATCH, VALIDATION_DEVICE, Point, sized_by

if TYPE_CHECKING:
    from autotune.bundles.model import BundleConfig

__all__ = ["Prober", "ProbeProber", "EstimateProber", "loader_bytes_fn"]

log = logging.getLogger(__name__)


class Prober(Protocol):
    """What a strategy asks for points: a real probe or an estimate, and the estimated curves
    (``autotune.search.curves.key_curves.search_curves`` builds a key's from them)."""

    measured: bool

    def probe(self, point: Mapping[str, Any], phases: tuple[str, ...]) -> dict[str, Any]:
        """Evaluate ``point`` (num_patches_per_iter, num_sw_batch_size, validation_device)."""

    def training_replay(self, infer_point: Mapping[str, Any] | None = None) -> tuple[Any, int | None]:
        """The training curve from one estimator trace (or None), and the folded inference estimate."""

    def memory_curve(self, phase: str, point: Mapping[str, Any], known: Mapping[int, float] | None = None,
                     on_estimate: Any = None, max_passes: int | None = None) -> Any:
        """A curve read from at most ``max_passes`` point estimates (or None)."""

    def config(self) -> BundleConfig:
        """The bundle's config."""


def loader_bytes_fn(config: BundleConfig) -> Callable[[int], float]:
    """Bytes of the two loader batches training holds at N patches per pass (``make_loader_batches``:
    lcm(N, crops) float32 images and labels each), exact and not affine in N."""
    import math

    from autotune.tunables import loader_batch_patches

    voxels = math.prod(config.roi_size)
    label_channels = config.output_classes if config.sigmoid else 1
    per_patch = 4 * voxels * (config.input_channels + label_channels)
    crops = config.num_crops_per_image
    return lambda n: float(2 * loader_batch_patches(n, crops) * per_patch)


class _ModelMixin:
    """Estimated peaks become device memory by the device model where the allowance has one
    (``autotune.probe.device_model``: the allocator simulated on the trace, cuDNN's workspace by the
    calibration's factor), else as ``raw * scale + offset`` (a version-1 allowance; identity on the CPU)."""

    bundle: str
    device: str
    scale: float = 1.0
    offset: int = 0
    allowance: Any = None
    answers: Any = None  # raw answers kept for reuse (``autotune.search.curves.answers``); None: none kept
    _config: BundleConfig | None = None  # the bundle's config, loaded at the first ask

    def factors(self) -> dict[str, float] | None:
        """The device model's workspace factors for this bundle: fitted inside the calibration's domain, none
        outside it (``CudaAllowance.factors_for``); None: no device model applies."""
        if self.allowance is None or not str(self.device).startswith("cuda"):
            return None
        return self.allowance.factors_for(self.config(), self.device)[0]

    def plan_scale(self, phase: str) -> float:
        """What an estimate of ``phase`` is multiplied by before it is held against the budget: 1 for real probes
        (they measure); a plan's out-of-sample margin for ``EstimateProber``."""
        return 1.0

    def _planned(self, curve: Any, phase: str) -> Any:
        scale = self.plan_scale(phase)
        if curve is None or scale == 1.0:
            return curve
        from autotune.search.curves.edge import CorrectedCurve

        return CorrectedCurve(curve, scale, 0.0)

    def _expandable(self) -> bool:
        from autotune.cuda_alloc import alloc_conf, expandable_segments

        return expandable_segments(alloc_conf())

    def memory_curve(
        self,
        phase: str,
        point: Mapping[str, Any],
        known: Mapping[int, float] | None = None,
        on_estimate: Callable[[int, int], None] | None = None,
        max_passes: int | None = None,
    ) -> Any:
        """The estimator's peak (plus the device allowance) at each batch size, computed on demand:
        ``num_patches_per_iter`` for "train", ``num_sw_batch_size`` for "infer" (capped at the
        number of windows), from at most ``max_passes`` estimates (``autotune.search.curves.sparse``). None
        when the estimator fails at the first point asked (bisection then).

        Args:
            known: raw estimates already computed (n -> bytes), e.g. read back from the study.
            on_estimate: called with (n, raw bytes) for each new estimate (to store it).
        """
        from autotune.probe import estimate
        from autotune.search.curves.sparse import MAX_PASSES, SparseCurve

        rest, cap, step = self._curve_axis(phase, point)
        ratios: dict[int, float] = {}
        device_model = self.factors() is not None

        def raw_peak(n: int) -> float:
            if device_model:  # the same pass, recorded and simulated: the device's ratio at n
                from autotune.probe import estimate_on_device
                from autotune.search.curves.device import ratio_of

                result = estimate_on_device(self.bundle, self.allowance, rest.at(phase, n), device=self.device,
                                            phases=(phase,))
                ratio = ratio_of(result, phase)
                if ratio is not None:
                    ratios[int(n)] = ratio
            else:
                result = estimate(self.bundle, rest.at(phase, n), device=self.device, phases=(phase,))
                if self.answers is not None and phase == "infer":
                    self.answers.keep_infer(rest.at(phase, n), result)
            raw = int(result[f"{phase}_peak_bytes"])
            if on_estimate is not None:
                on_estimate(n, raw)
            return float(raw)

        passes = MAX_PASSES if max_passes is None else max(0, int(max_passes))
        raw_curve = SparseCurve(raw_peak, cap, {int(k): float(v) for k, v in (known or {}).items()}, step, passes)
        try:  # the first pass checks the estimator: at the top for inference (often all that is needed)
            if not raw_curve.known:
                raw_curve.predict(cap if cap is not None else 1)
        except Exception as exc:  # the estimator is an aid: fall back to bisection without it
            log.warning("estimate for %s (%s) failed, bisecting without it: %s", Path(self.bundle).name, phase, exc)
            return None
        if device_model:
            from autotune.search.curves.device import RatioCurve

            scale, offset = self.allowance.affine()
            return self._planned(RatioCurve(raw_curve, scale, float(offset), ratios), phase)
        return self._allowed(raw_curve)

    def _curve_axis(self, phase: str, point: Mapping[str, Any]) -> tuple[Point, int | None, Any]:
        """What a phase's curve runs along: the point's values but the tunable that sizes the phase
        (``sized_by``; a training curve also leaves the validation device to the bundle), the cap (the windows,
        for "infer") and the loader's exact bytes per N (for "train")."""
        rest = Point.taken_from(point).without(sized_by(phase).name)
        if phase == "train":
            rest = rest.without(VALIDATION_DEVICE.name)
        config = self.config()
        if phase == "infer":
            from autotune.step import num_windows

            return rest, num_windows(config), None
        return rest, None, loader_bytes_fn(config)

    def training_replay(self, infer_point: Mapping[str, Any] | None = None) -> tuple[Any, int | None]:
        """The training curve from one estimator pass (``autotune.probe.replay``), plus the device
        allowance; with ``infer_point`` (``num_sw_batch_size``, ``validation_device``) the same pass
        estimates that sliding-window point too. Returns (curve or None when the trace does not replay,
        the raw inference estimate or None)."""
        from autotune.probe import estimate, marker_batch, replay_of

        crops = self.config().num_crops_per_image
        phases: tuple[str, ...] = ("train", "infer") if infer_point else ("train",)
        point = Point.taken_from(infer_point or {}).with_values(**{BATCH.name: marker_batch(crops)})
        try:
            result = estimate(self.bundle, point, device=self.device, phases=phases, record=True)
        except Exception as exc:  # the estimator is an aid: the caller falls back
            log.warning("estimate for %s (train) failed: %s", Path(self.bundle).name, exc)
            return None, None
        infer_raw = int(result["infer_peak_bytes"]) if result.get("infer_peak_bytes") is not None else None
        if self.answers is not None:
            self.answers.keep_infer(point, result)
        try:
            curve = replay_of(result, crops)
        except ValueError as exc:
            log.warning("the training trace of %s does not replay (%s); estimating point by point",
                        Path(self.bundle).name, exc)
            return None, infer_raw
        if self.answers is not None:
            self.answers.keep_replay(curve, result)
        factors = self.factors()
        if factors is not None:
            from autotune.search.curves.device import DeviceCurve

            return self._planned(DeviceCurve(curve, factors=factors, release=self.allowance.release_after_search,
                                             expandable=self._expandable()), "train"), infer_raw
        return self._allowed(curve), infer_raw

    def config(self) -> BundleConfig:
        """The bundle's config, loaded once (the search does not change a bundle before its key is answered)."""
        if self._config is None:
            from autotune.bundles.config import load_bundle_config

            self._config = load_bundle_config(self.bundle)
        return self._config

    def _allowed(self, raw_curve: Any) -> Any:
        """``raw_curve`` with the device allowance (``raw * scale + offset``; identity on the CPU)."""
        from autotune.search.curves.edge import CorrectedCurve

        if self.scale == 1.0 and self.offset == 0:
            return raw_curve
        return CorrectedCurve(raw_curve, self.scale, float(self.offset))


class ProbeProber(_ModelMixin):
    """Real trials in an isolated child process."""

    measured = True

    def __init__(
        self,
        bundle: str | Path,
        device: str,
        memory_limit: int,
        timeout: float = 300.0,
        env: Mapping[str, str] | None = None,
        scale: float = 1.0,
        offset: int = 0,
        allowance: Any = None,
    ) -> None:
        self.bundle = str(bundle)
        self.device = device
        self.memory_limit = int(memory_limit)
        self.timeout = float(timeout)
        self.env = dict(env or {})
        self.scale, self.offset = float(scale), int(offset)
        self.allowance = allowance

    def probe(self, point: Mapping[str, Any], phases: tuple[str, ...]) -> dict[str, Any]:
        from autotune.probe import run_probe

        return run_probe(
            self.bundle,
            Point.taken_from(point),
            device=self.device,
            memory_limit=self.memory_limit,
            timeout=self.timeout,
            phases=tuple(phases),
            env=self.env or None,
        )


class EstimateProber(_ModelMixin):
    """Answers from the estimator: no compute, no real memory, any machine.

    Where no device model applies, a point whose raw answer this prober already has is not estimated again
    (``autotune.search.curves.answers``: training from the replay curve, validation from a pass that traced
    the same sliding-window batch and validation device); ``reuse_answers=False`` estimates every point.
    """

    measured = False

    def __init__(
        self, bundle: str | Path, device: str, budget_bytes: int, scale: float = 1.0, offset: int = 0,
        allowance: Any = None, reuse_answers: bool = True,
    ) -> None:
        from autotune.search.curves.answers import RawAnswers

        self.bundle = str(bundle)
        self.device = device
        self.budget_bytes = int(budget_bytes)
        self.scale, self.offset = float(scale), int(offset)
        self.allowance = allowance
        self.answers = RawAnswers() if reuse_answers else None
        self._scales: dict[str, float] = {}

    def plan_scale(self, phase: str) -> float:
        """``1 / (1 + max_under)``: the out-of-sample under-prediction of the bundle's situation (inside the
        calibration's domain or not, ``CudaAllowance.plan_scale``), so that a plan holds where the device model
        is as far under as it was on points it never saw. 1 on the CPU and without a validated calibration."""
        if phase not in self._scales:
            scale = 1.0
            if self.allowance is not None and str(self.device).startswith("cuda") and self.allowance.bounds:
                from autotune.probe import workspace_template

                config = self.config()
                _, check = self.allowance.factors_for(config, self.device)
                scale = self.allowance.plan_scale(check, workspace_template(config), phase)
            self._scales[phase] = scale
        return self._scales[phase]

    def probe(self, point: Mapping[str, Any], phases: tuple[str, ...]) -> dict[str, Any]:
        """The estimator's answer at ``point``: on CUDA with a device model, the phases simulated as a probe
        runs them (``estimate_on_device``); else the raw peaks with ``raw * scale + offset``, answered without a
        pass where this prober holds them (``RawAnswers.answer``: ``answered_by`` says from what)."""
        if self.factors() is not None:
            from autotune.probe import estimate_on_device

            result = estimate_on_device(self.bundle, self.allowance, Point.taken_from(point), device=self.device,
                                        phases=tuple(phases))
            raw = int(result.get("peak_bytes") or 0)
            result["raw_peak_bytes"] = raw
            result["peak_bytes"] = int(result["device_peak_bytes"])
            planned = []
            for phase in phases:  # each phase's own peak in device bytes, with the plan's margin
                if result.get(f"{phase}_device_reserved_bytes") is not None:
                    result[f"{phase}_peak_bytes"] = int(result[f"{phase}_device_reserved_bytes"] * self.plan_scale(phase))
                    planned.append(result[f"{phase}_peak_bytes"])
            result["peak_bytes"] = max(planned) if planned else result["peak_bytes"]
            result["plan_scale"] = {phase: self.plan_scale(phase) for phase in phases}
        else:
            result = self._raw_result(point, tuple(phases))
            raw = int(result.get("peak_bytes") or 0)
            result["raw_peak_bytes"] = raw
            result["peak_bytes"] = int(raw * self.scale) + self.offset
        result["allowance_bytes"] = result["peak_bytes"] - raw
        # an estimate never runs out of memory; "oom" marks a point past the budget, as a probe would
        result["status"] = "ok" if result["peak_bytes"] <= self.budget_bytes else "oom"
        result["measured"] = False
        return result

    def _raw_result(self, point: Mapping[str, Any], phases: tuple[str, ...]) -> dict[str, Any]:
        """The estimator's raw result at ``point``: an answer held, else a new pass (whose validation peak is
        kept)."""
        from autotune.probe import estimate

        held = self.answers.answer(self.bundle, self.device, point, phases) if self.answers is not None else None
        if held is not None:
            return held
        result = dict(estimate(self.bundle, Point.taken_from(point), device=self.device, phases=phases))
        if self.answers is not None:
            self.answers.keep_infer(point, result)
        return result
