"""The affine memory model of ``autotune estimate``'s report: predict, max_fitting at the edge, the cap;
the number of sliding windows that caps a sliding-window batch."""

from __future__ import annotations

from config_fixtures import bundle_config

from autotune.probe.memory_model import MAX_FITTING, MemoryModel
from autotune.step import num_windows


def test_max_fitting_is_consistent_with_predict() -> None:
    model = MemoryModel(intercept=1000.0, slope=300.0, phase="train", points=[(1, 1300), (2, 1600)])
    for limit in (0, 999, 1000, 1299, 1300, 1301, 4599, 4600, 10_000.5, 123_456):
        n = model.max_fitting(limit)
        assert n >= 0
        if n > 0:
            assert model.predict(n) <= limit
        assert model.predict(n + 1) > limit
    assert model.max_fitting(999) == 0
    assert model.max_fitting(1300) == 1
    flat = MemoryModel(intercept=500.0, slope=0.0, phase="infer")
    assert flat.max_fitting(400) == 0 and flat.max_fitting(600) == MAX_FITTING


def test_cap_bounds_prediction_and_answer() -> None:
    capped = MemoryModel(intercept=0.0, slope=10.0, cap=8)
    assert capped.max_fitting(1e9) == 8 and capped.predict(100) == capped.predict(8) == 80
    assert capped.max_fitting(45) == 4
    flat = MemoryModel(intercept=5.0, slope=0.0, cap=3)
    assert flat.max_fitting(10) == 3 and flat.max_fitting(4) == 0


def test_num_windows_counts_monai_scan() -> None:
    # 64^3 volume, 32^3 roi, overlap 0.5: windows start every 16 voxels -> 3 per axis
    assert num_windows(bundle_config(roi_size=[32, 32, 32], infer_volume_shape=[64, 64, 64], sw_overlap=0.5)) == 27
    # no volume shape: one window of the roi itself
    assert num_windows(bundle_config(roi_size=[16, 16, 16])) == 1
    # an overlap per axis (SegResNet2D's): none along the slices, so 3 x 3 x 2 windows
    assert num_windows(bundle_config(infer_volume_shape=[64, 64, 64], sw_overlap_axes=[0.5, 0.5, 0.0])) == 18
