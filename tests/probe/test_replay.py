"""One trace at the marker batch replays the estimator's training peak at every N (autotune.probe.replay)."""

from __future__ import annotations

from pathlib import Path

import pytest
from probe_fixtures import ALGOS, shared_tiny_bundles

from autotune.probe.estimate import estimate
from autotune.probe.replay import MARKER_PRIME, ReplayError, TrainingReplay, marker_batch, replay_of
from autotune.probe.runner import resolve_request
from autotune.probe.trial import run_trial


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return shared_tiny_bundles(tmp_path_factory)


def _crops(bundle: Path) -> int:
    return resolve_request(bundle, check_device=False)["config"].num_crops_per_image


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("algo", ALGOS)
def test_one_trace_gives_the_estimate_at_every_n(bundles: dict[str, Path], algo: str, precision: str) -> None:
    crops = _crops(bundles[algo])
    traced = estimate(bundles[algo], phases=("train",), num_patches_per_iter=marker_batch(crops), record=True,
                      precision=precision)
    curve = replay_of(traced, crops)
    assert curve.predict(marker_batch(crops)) == traced["train_peak_bytes"]
    # every N, odd and even (crops 2: a loader batch of 2N patches, two forward passes), and far past the trace
    for n in (1, 2, 3, 5, 64):
        direct = estimate(bundles[algo], phases=("train",), num_patches_per_iter=n, precision=precision)
        assert curve.predict(n) == direct["train_peak_bytes"], (algo, precision, n)
    assert curve.as_dict(2, 4) == {n: int(curve.predict(n)) for n in (2, 3, 4)}


def test_the_marker_batch_is_a_prime_times_the_crops() -> None:
    assert all(MARKER_PRIME % d for d in range(2, int(MARKER_PRIME**0.5) + 1))
    assert marker_batch(1) == MARKER_PRIME and marker_batch(2) == 2 * MARKER_PRIME and marker_batch(0) == MARKER_PRIME


def test_events_that_do_not_replay_are_refused() -> None:
    with pytest.raises(ReplayError):
        TrainingReplay([])
    with pytest.raises(ReplayError):  # a free of a storage never counted
        TrainingReplay([("alloc", 0, 4, "state"), ("free", 7, 0, "")])
    with pytest.raises(ReplayError):  # grows with the prime but is not whole bytes per patch of the marker batch
        TrainingReplay([("alloc", 0, 3 * MARKER_PRIME, "empty")], crops=2)
    with pytest.raises(ReplayError, match="no training events"):
        replay_of({"train_peak_bytes": 1}, 1)
    curve = TrainingReplay([("alloc", 0, 1000, "state"), ("alloc", 1, 512 * MARKER_PRIME, "conv"),
                            ("free", 1, 0, ""), ("alloc", 2, 4 * MARKER_PRIME, "loss")])
    assert curve.predict(1) == 1024 + 512  # the state rounded up to 512, one patch's activation
    assert curve.predict(3) == 1024 + 3 * 512
    with pytest.raises(ReplayError):
        curve.predict(0)


def test_group_norm_in_bf16_is_estimated_as_the_kernels_allocate(bundles: dict[str, Path]) -> None:
    """SegResNet's GroupNorm under bf16 autocast: the kernels give the input's gradient the input's dtype and
    keep mean and rstd in the weight's fp32; PyTorch's decomposition does neither. The estimator corrects both,
    so the estimate is the probe's tracked peak, byte for byte (it was 2-3% over at full size)."""
    sizes = {"num_patches_per_iter": 2, "precision": "bf16"}
    real = run_trial(resolve_request(bundles["segresnet"], phases=("train",), warmup_steps=1, measure_steps=1,
                                     **sizes))
    assert real["status"] == "ok", real["error_tail"]
    assert estimate(bundles["segresnet"], phases=("train",), **sizes)["train_peak_bytes"] == real["train_peak_bytes"]
