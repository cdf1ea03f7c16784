"""The device model: PyTorch's caching allocator simulated on recorded allocations, cuDNN's searches and
workspaces on a trace, the fit of the workspace factor and its leave-one-out, the version-2 calibration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.errors import ConfigError
from autotune.probe.allocator import LARGE_BUFFER, SMALL_BUFFER, Allocator, round_size, segment_size
from autotune.probe.device_model import predict_reserved, simulate
from autotune.probe.model_fit import ModelPoint, error_summary, leave_one_out, point_factors

MiB = 1 << 20


def test_requests_round_and_segments_follow_pytorchs_sizes() -> None:
    assert round_size(1) == 512 and round_size(513) == 1024 and round_size(4096) == 4096
    assert segment_size(512) == SMALL_BUFFER and segment_size(MiB) == SMALL_BUFFER  # the small pool
    assert segment_size(MiB + 512) == LARGE_BUFFER and segment_size(10 * MiB - 512) == LARGE_BUFFER
    assert segment_size(10 * MiB) == 10 * MiB and segment_size(30 * MiB + 1) == 32 * MiB  # rounded to 2 MiB


def test_blocks_are_split_reused_best_fit_and_merged() -> None:
    a = Allocator()
    a.malloc("x", 3 * MiB)  # a 20 MiB segment, split: 17 MiB cached
    assert (a.allocated, a.reserved, a.segments) == (3 * MiB, LARGE_BUFFER, 1)
    a.malloc("y", 16 * MiB)  # fits the cached 17 MiB: no new segment; 1 MiB left is not split off (> 1 MiB only)
    assert a.segments == 1 and a.allocated == 3 * MiB + 17 * MiB
    a.malloc("z", 40 * MiB)  # nothing cached holds it: a segment of its own
    a.free("z")
    a.malloc("w", 5 * MiB)  # best fit: the smallest cached block that holds it is z's 40 MiB, split
    assert a.segments == 2 and a.reserved == LARGE_BUFFER + 40 * MiB
    a.free("w")
    a.free("x")
    a.free("y")  # x, y and the rest merge back into one free segment
    a.empty_cache()
    assert a.reserved == 0 and a.allocated == 0
    assert a.peak_reserved == LARGE_BUFFER + 40 * MiB


def test_empty_cache_keeps_segments_in_use() -> None:
    a = Allocator()
    a.malloc("keep", 12 * MiB)
    a.malloc("drop", 12 * MiB)
    a.free("drop")
    a.empty_cache()
    assert a.reserved == 12 * MiB and a.allocated == 12 * MiB


def _trace(batch: int) -> tuple[list, list]:
    """A training step and a validation pass, as the tracker records them (sizes grow with ``batch``)."""
    act = batch * 8 * MiB
    train = [("alloc", 0, 4 * MiB, "state"), ("alloc", 1, 4 * MiB, "state"), ("alloc", 2, act, "loader"),
             ("alloc", 3, act, "convolution.default"), ("work", 0, act, "convolution.default"),
             ("alloc", 4, 2 * act, "convolution.default"), ("work", 1, 2 * act, "convolution.default"),
             ("free", 1, 0, ""), ("alloc", 5, 4 * MiB, "convolution_backward.default"),
             ("work", 2, 2 * act, "convolution_backward.default"),
             ("free", 4, 0, ""), ("free", 3, 0, ""), ("free", 2, 0, "")]
    infer = [("alloc", 0, 4 * MiB, "state"), ("alloc", 1, 4 * MiB, "state"), ("alloc", 2, 3 * act, "volume"),
             ("alloc", 3, act, "convolution.default"), ("work", 0, act, "convolution.default"), ("free", 3, 0, "")]
    return train, infer


def test_a_workspace_lands_where_its_convolution_runs_and_validation_keeps_trainings_blocks() -> None:
    train, infer = _trace(2)
    bare = simulate(train, infer, {"train": 0.0, "infer": 0.0})
    with_ws = simulate(train, infer, {"train": 1.0, "infer": 1.0})
    act = 16 * MiB
    # the largest live set is state + loader + two activations; the second convolution's workspace (2 x act) sits on it
    assert bare["train"].allocated == 8 * MiB + act + act + 2 * act
    assert with_ws["train"].allocated == bare["train"].allocated + 2 * act
    assert with_ws["train"].reserved >= with_ws["train"].allocated
    alone = simulate(None, infer, {"infer": 1.0})["infer"]
    assert with_ws["infer"].allocated == alone.allocated  # the same tensors
    # without cuDNN's release, training's cached segments stay reserved through validation
    kept = simulate(train, infer, {"train": 1.0, "infer": 1.0}, release=False)["infer"]
    assert kept.reserved > alone.reserved


def _point(batch: int, w: float, algo: str = "t") -> ModelPoint:
    """A point whose 'measured' peaks are the model's own at workspace factor ``w``."""
    train, infer = _trace(batch)
    peaks = predict_reserved(train, infer, {"train": w, "infer": w})
    return ModelPoint(algo, batch, batch, train, infer, {p: int(peaks[p]["reserved"]) for p in ("train", "infer")})


def test_the_fit_recovers_a_known_factor_and_leave_one_out_never_sees_its_point() -> None:
    points = [_point(1, 2.0), _point(2, 2.0), _point(3, 2.0)]
    factors = [point_factors(p) for p in points]
    for point, found in zip(points, factors, strict=True):  # where the model meets the measured peak
        assert found["train"] == pytest.approx(2.0, abs=0.25)
        again = predict_reserved(point.train_events, point.infer_events, found)
        assert again["infer"]["reserved"] == pytest.approx(point.reserved["infer"], rel=0.05)
    rows = leave_one_out(points, factors)
    assert len(rows) == 6 and max(abs(r["error"]) for r in rows) < 0.1
    # the left-out point's own measurement does not inform its prediction: spoil it, its prediction stays
    spoiled = [*points[:2], ModelPoint("t", 3, 3, points[2].train_events, points[2].infer_events,
                                       {"train": 1, "infer": 1})]
    again = leave_one_out(spoiled, factors)
    assert again[4]["predicted_bytes"] == rows[4]["predicted_bytes"] and again[4]["error"] > 1e6
    summary = error_summary(rows, card_bytes=10 * 1024 * MiB)
    assert summary["points"] == 6 and summary["within"] == 6 and summary["max_under_of_card"] <= 0


def _v2(folder: Path, name: str, workspace: dict) -> Path:
    from autotune.probe.calibration import calibration_record, write_calibration

    fit = {"context_bytes": 600 * MiB, "cudnn_workspace_bytes": 64 * MiB, "allocator_slack_fraction": 0.5,
           "max_over_prediction": 0.1, "points": 4}
    record = calibration_record({"name": name, "total_memory": 80 << 30, "driver": "1", "torch": "2", "cuda": "13",
                                 "cudnn": 9}, fit, [], "test",
                                model={"context_bytes": 700 * MiB, "workspace": workspace, "release_after_search": True})
    return write_calibration(folder, record)


def test_a_version_2_calibration_gives_the_device_model_and_version_1_still_loads(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.probe.allowances import allowance_for, default_allowance, is_calibrated
    from autotune.probe.calibration import find_calibration

    _v2(tmp_path, "NVIDIA X1", {"unet": {"train": 12.0, "infer": 8.0}, "dints": {"train": 4.0, "infer": 2.0}})
    monkeypatch.setenv("AUTOTUNE_CALIBRATION_DIR", str(tmp_path))
    found = allowance_for("cuda:0", gpu_name="NVIDIA X1")
    assert is_calibrated(found) and found.context_bytes == 700 * MiB
    assert found.factors("dints") == {"train": 4.0, "infer": 2.0}
    assert found.factors("swinunetr") == {"train": 0.0, "infer": 0.0}  # not measured: no other template's factor
    bad = json.loads((tmp_path / "nvidia-x1.json").read_text())
    bad["model"]["workspace"]["unet"]["train"] = -1
    (tmp_path / "nvidia-x1.json").write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match=r"nvidia-x1\.json: key 'model\.workspace\.unet\.train': got -1"):
        find_calibration("NVIDIA X1", dirs=[tmp_path])  # a malformed model: refused, never skipped
    # a GPU without a calibration: the device model with the shipped reference's factors, not called calibrated
    reference = default_allowance()
    assert reference.factors("unet") and not is_calibrated(reference) and "not measured on this GPU" in reference.source
    assert allowance_for("cuda:0", gpu_name="Some Other GPU") == reference


def test_the_estimate_on_a_device_counts_the_allocator(tmp_path_factory: pytest.TempPathFactory) -> None:
    from probe_fixtures import shared_tiny_bundles

    from autotune.probe import NO_ALLOWANCE, CudaAllowance, apply_allowance, estimate_on_device

    bundle = shared_tiny_bundles(tmp_path_factory)["unet"]
    model = CudaAllowance(workspace_factors={"unet": {"train": 4.0, "infer": 4.0}})
    on_gpu = estimate_on_device(bundle, model, device="cuda:0", num_patches_per_iter=2, num_sw_batch_size=2)
    assert on_gpu["device_model"] == "simulated" and "train_events" not in on_gpu
    for phase in ("train", "infer"):  # at least the tensors, in 2 MiB segments at least
        assert on_gpu[f"{phase}_device_reserved_bytes"] >= on_gpu[f"{phase}_device_allocated_bytes"] >= \
            on_gpu[f"{phase}_peak_bytes"]
    affine = estimate_on_device(bundle, CudaAllowance(), device="cuda:0", num_patches_per_iter=2, num_sw_batch_size=2)
    assert affine["device_model"] == "affine"
    assert affine["train_device_reserved_bytes"] == apply_allowance(affine["train_peak_bytes"], CudaAllowance(), include_context=False)
    cpu = estimate_on_device(bundle, NO_ALLOWANCE, device="cpu", num_patches_per_iter=2, num_sw_batch_size=2)
    assert cpu["device_peak_bytes"] == cpu["peak_bytes"] and cpu["device_model"] == "none"
