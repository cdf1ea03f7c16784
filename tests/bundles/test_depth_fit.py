"""A template's ``roi.min_bottleneck`` fits UNet's depth to the data: a small volume gets fewer poolings and a roi
near its size, not one padded up to a larger multiple; a large one keeps the template's network; a network or roi
the user gives is theirs."""

from __future__ import annotations

from typing import Any

import pytest

from autotune.bundles.render import render_config
from autotune.bundles.templates import load_template


def _stats(shape: list[float]) -> dict[str, Any]:
    return {"stats_summary": {
        "image_stats": {"spacing": {"median": [1.0, 1.0, 1.0]}, "shape": {"median": shape},
                        "sizemm": {"percentile_99_5": [s + 4 for s in shape]}, "channels": {"max": 1},
                        "intensity": {"percentile_00_5": 0.0, "percentile_99_5": 1.0}},
        "label_stats": {"labels": [0, 1, 2]}}}


def _render(shape: list[float], overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    source = {"name": "t", "modality": "MRI", "datalist": "d.json", "dataroot": "."}
    return render_config(load_template("unet"), _stats(shape), source, 0, 5, overrides)


@pytest.mark.parametrize(("shape", "strides", "channels", "roi"), [
    # the hippocampus's median: four strides would pad it to 48x64x48, 3 voxels deep at the bottleneck
    ([35.5, 50.0, 36.0], [2, 2, 2], [16, 32, 64, 128], [40, 56, 40]),
    ([96.0, 96.0, 80.0], [2, 2, 2, 2], [16, 32, 64, 128, 256], [96, 96, 80]),  # 6 and 5 deep: the template's
    ([20.0, 20.0, 20.0], [2, 2, 2], [16, 32, 64, 128], [32, 32, 32]),  # the roi floor of 32: 4 deep at three
])
def test_unet_keeps_the_poolings_that_leave_min_bottleneck_voxels(shape: list[float], strides: list[int],
                                                                   channels: list[int], roi: list[int]) -> None:
    config = _render(shape)
    assert config["network"]["args"]["strides"] == strides and config["network"]["args"]["channels"] == channels
    assert config["roi_size"] == roi
    assert min(roi) // 2 ** len(strides) >= load_template("unet")["roi"]["min_bottleneck"]


def test_a_network_or_roi_the_user_gives_is_kept() -> None:
    given = {"network": {"args": {"channels": [8, 16, 32, 64, 128], "strides": [2, 2, 2, 2]}}}
    config = _render([35.5, 50.0, 36.0], given)
    assert config["network"]["args"]["strides"] == [2, 2, 2, 2] and config["roi_size"] == [48, 64, 48]
    config = _render([35.5, 50.0, 36.0], {"roi_size": [48, 64, 48]})
    assert config["network"]["args"]["strides"] == [2, 2, 2, 2]


@pytest.mark.parametrize("bad", [0, 2.5, "four", True])
def test_a_bad_min_bottleneck_is_one_config_error(bad: Any) -> None:
    from autotune.errors import ConfigError

    template = load_template("unet")
    template["roi"]["min_bottleneck"] = bad
    source = {"name": "t", "modality": "MRI", "datalist": "d.json", "dataroot": "."}
    with pytest.raises(ConfigError, match="roi.min_bottleneck"):
        render_config(template, _stats([35.5, 50.0, 36.0]), source, 0, 5)
