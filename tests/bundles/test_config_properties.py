"""Property tests of the parsing layer: any one field of a tuned bundle's config (its ``tuning:`` block included)
edited to a wrong type, a non-finite number, a negative, zero or an absurd size is either taken or refused in one
line naming the file and the key, never another exception (``autotune.bundles.model.BundleConfig``).

In-process and fast: each example parses a dict (no file, no command); the commands' side of the same refusals is
``tests/checks/test_cli_properties.py``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from autotune.bundles.config import CONFIG_RELPATH
from autotune.bundles.model import BundleConfig
from autotune.bundles.plan import TuningPlan
from autotune.errors import ConfigError

WHERE = "/work/unet_0/configs/hyper_parameters.yaml"
BAD_VALUES = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -1, -5e9, 0, 0.0, 10**12, 1e300, 2**63, "two", "", "1", True,
                     None, [], {}, [1, 2], {"a": 1}, "$x", "cpu:0"]),
    st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
)


def _leaves(tree: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every value in ``tree`` (mappings and lists walked; containers themselves included)."""
    if path:
        yield path
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            yield from _leaves(value, (*path, index))


@pytest.fixture(scope="module")
def tuned_view(demo_bundles: dict[str, Path]) -> dict[str, Any]:
    """A tiny UNet bundle's config with a ``tuning:`` block as the tuner and a stepped-down training write it."""
    view = yaml.safe_load((demo_bundles["unet_0"] / CONFIG_RELPATH).read_text())
    record = {"num_patches_per_iter": 2, "num_sw_batch_size": 4, "validation_device": "device",
              "max_num_patches_per_iter": 4, "memory_limit": 2**26, "device": "cpu", "method": "measured",
              "precision": "fp32", "peak_bytes": 50_000_000, "train_peak_bytes": 50_000_000,
              "infer_peak_bytes": 20_000_000, "samples_per_s": 7.5, "margin": 0.1, "trials": [0, 1],
              "handoff": {"rule": "goodput"}, "batch": {"searched_range": [1, 8]}}
    view["tuning"] = TuningPlan.from_record(record).as_dict()
    view["tuning"]["training_oom"] = {"num_patches_per_iter": 2, "micro_batches": 2, "sw_batch": 4,
                                      "validation_device": "device", "memory_limit": 2**26, "device": "cpu"}
    view["bundle_root"] = "/work/unet_0"
    BundleConfig.parse(view, WHERE)  # the unedited config is taken
    return view


def _edited(view: dict[str, Any], path: tuple[Any, ...], value: Any, delete: bool) -> dict[str, Any]:
    edited = copy.deepcopy(view)
    target = edited
    for part in path[:-1]:
        target = target[part]
    if delete and isinstance(target, dict):
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return edited


@settings(deadline=None, database=None, max_examples=400, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), value=BAD_VALUES, delete=st.booleans())
@example(data=None, value="two", delete=False)
def test_any_field_edited_is_taken_or_refused_naming_the_file_and_key(tuned_view: dict[str, Any], data: Any,
                                                                       value: Any, delete: bool) -> None:
    paths = list(_leaves(tuned_view))
    if data is None:  # the issue's case: training_oom.micro_batches edited to text
        path = ("tuning", "training_oom", "micro_batches")
    else:
        path = data.draw(st.sampled_from(paths), label="path")
    edited = _edited(tuned_view, path, value, delete and path[-1] != "bundle_root")
    try:
        config = BundleConfig.parse(edited, WHERE)
        _ = config.tuned  # what training reads of it, checked as it is derived
    except ConfigError as exc:
        line = str(exc)
        assert "\n" not in line and (line.startswith(WHERE) or line.startswith("/work/unet_0")), line
        assert str(path[0]) in line or "tuning" in line, (path, line)
        return
    assert math.isfinite(config.num_epochs) and config.num_patches_per_iter >= 1


@pytest.mark.parametrize(("path", "value", "needle"), [
    (("tuning", "training_oom", "micro_batches"), "two", "tuning.training_oom.micro_batches"),
    (("tuning", "training_oom", "micro_batches"), 1_000_000, "tuning.training_oom.micro_batches"),
    (("fast_training", "ram_fraction"), 5, "fast_training.ram_fraction"),
    (("infer_volume_shape",), [51975, 52000, 52000], "infer_volume_shape"),
    (("tuning", "memory_limit"), -5, "tuning.memory_limit"),
    (("tuning", "version"), 99, "tuning.version"),
])
def test_the_issues_edits_are_refused_naming_the_key(tuned_view: dict[str, Any], path: tuple[Any, ...],
                                                     value: Any, needle: str) -> None:
    with pytest.raises(ConfigError) as refused:
        BundleConfig.parse(_edited(tuned_view, path, value, False), WHERE)
    line = str(refused.value)
    assert line.startswith(WHERE) and all(part in line for part in needle.split(".")), line
