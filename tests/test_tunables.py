"""The tunables, each defined once (``autotune.tunables``): the places that enumerate them read the table."""

from __future__ import annotations

import pytest

from autotune.errors import ProbeError, SpecError
from autotune.tunables import (
    BATCH,
    SW_BATCH,
    TUNABLES,
    VALIDATION_DEVICE,
    bundle_values,
    sized_by,
    tunable,
    written_values,
)


def test_the_specs_take_each_tunables_keys_and_monais_names() -> None:
    from autotune.search.strategies.space import SPEC_KEYS, parse_specs, spec_for

    assert set(SPEC_KEYS) == {"num_trials", *(name for t in TUNABLES for name in t.spec_names)}
    explicit = parse_specs({"segresnet": {"range_num_images_per_batch": [2, 5], "validation_devices": "cpu",
                                          "range_num_sw_batch_size": [1, 3]}}, ["segresnet"])["segresnet"]
    spec = spec_for(explicit, {"tuning_ranges": {"num_patches_per_iter": [1, 8]}})
    assert [spec.space_of(t) for t in TUNABLES] == [(2, 5), (1, 3), ("cpu",)]
    assert spec.as_dict() == {"num_trials": 20, "range_num_patches_per_iter": [2, 5], "range_num_sw_batch_size": [1, 3],
                              "validation_devices": ["cpu"]}
    defaults = spec_for({}, {"tuning_ranges": {"num_sw_batch_size": [1, 7]}, "tuning_validation_devices": ["device"]})
    assert (defaults.patches_range, defaults.sw_range, defaults.validation_devices) == ((1, 64), (1, 7), ("device",))
    with pytest.raises(SpecError, match="give range_num_patches_per_iter or range_num_images_per_batch, not both"):
        parse_specs({"universal": {"range_num_images_per_batch": [1, 2], "range_num_patches_per_iter": [1, 2]}}, ["unet"])
    with pytest.raises(SpecError, match="validation device"):
        parse_specs({"universal": {"validation_devices": ["gpu"]}}, ["unet"])


def test_a_view_and_a_record_are_read_and_written_through_the_table() -> None:
    from autotune.search.handoff import loader_settings

    cfg = {"num_patches_per_iter": 3, "num_sw_batch_size": 5, "sw_input_on_cpu": True, "num_crops_per_image": 2}
    assert bundle_values(cfg) == {"num_patches_per_iter": 3, "num_sw_batch_size": 5, "validation_device": "cpu"}
    for n, crops in ((1, 1), (3, 2), (4, 6), (7, 4)):
        record = {"num_patches_per_iter": n, "num_sw_batch_size": 2, "sw_input_on_cpu": False}
        written = written_values(record, {"num_crops_per_image": crops})
        assert {k: written[k] for k in ("num_patches_per_iter", "num_images_per_batch", "num_crops_per_image")} == \
            loader_settings(n, crops)
        assert (written["num_sw_batch_size"], written["sw_input_on_cpu"]) == (2, False)


def test_each_phase_is_sized_by_one_whole_number_tunable() -> None:
    from autotune.search.strategies.objective import size_param

    assert (sized_by("train"), sized_by("joint"), sized_by("infer")) == (BATCH, BATCH, SW_BATCH)
    assert [size_param(p) for p in ("train", "joint", "infer")] == [BATCH.name, BATCH.name, SW_BATCH.name]
    assert tunable("validation_device") is VALIDATION_DEVICE
    with pytest.raises(KeyError, match="known: num_patches_per_iter, num_sw_batch_size, validation_device"):
        tunable("num_workers")


def test_the_probe_request_holds_every_tunable_and_refuses_an_unknown_one(demo_bundles: dict) -> None:
    from autotune.probe.runner import resolve_request
    from autotune.search.strategies.outcome import distributions
    from autotune.search.strategies.space import AlgoSpec

    bundle = next(iter(demo_bundles.values()))
    req = resolve_request(bundle, num_sw_batch_size=3, check_device=False)
    assert {t.name for t in TUNABLES} <= set(req) and req["num_sw_batch_size"] == 3
    assert req["validation_device"] in VALIDATION_DEVICE.choices
    with pytest.raises(ProbeError, match="unknown tunable 'num_workers'"):
        resolve_request(bundle, num_workers=2, check_device=False)
    assert set(distributions(AlgoSpec(), ("device",))) == {t.name for t in TUNABLES}
