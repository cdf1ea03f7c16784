"""The tunables, each defined once (``autotune.tunables``): the places that enumerate them read the table."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.errors import ProbeError, SpecError
from autotune.tunables import (
    BATCH,
    SW_BATCH,
    TUNABLES,
    VALIDATION_DEVICE,
    Point,
    ValidationDevice,
    bundle_values,
    sized_by,
    tunable,
    written_values,
)


def test_the_specs_take_each_tunables_keys_and_monais_names() -> None:
    from config_fixtures import bundle_config

    from autotune.search.strategies.space import SPEC_KEYS, parse_specs, spec_for

    assert set(SPEC_KEYS) == {"num_trials", *(name for t in TUNABLES for name in t.spec_names)}
    explicit = parse_specs({"segresnet": {"range_num_images_per_batch": [2, 5], "validation_devices": "cpu",
                                          "range_num_sw_batch_size": [1, 3]}}, ["segresnet"])["segresnet"]
    spec = spec_for(explicit, bundle_config(tuning_ranges={"num_patches_per_iter": [1, 8]}))
    assert [spec.space_of(t) for t in TUNABLES] == [(2, 5), (1, 3), ("cpu",)]
    assert spec.as_dict() == {"num_trials": 20, "range_num_patches_per_iter": [2, 5], "range_num_sw_batch_size": [1, 3],
                              "validation_devices": ["cpu"]}
    defaults = spec_for({}, bundle_config(tuning_ranges={"num_sw_batch_size": [1, 7]},
                                          tuning_validation_devices=["device"]))
    assert (defaults.patches_range, defaults.sw_range, defaults.validation_devices) == ((1, 64), (1, 7), ("device",))
    with pytest.raises(SpecError, match="give range_num_patches_per_iter or range_num_images_per_batch, not both"):
        parse_specs({"universal": {"range_num_images_per_batch": [1, 2], "range_num_patches_per_iter": [1, 2]}}, ["unet"])
    with pytest.raises(SpecError, match="validation device"):
        parse_specs({"universal": {"validation_devices": ["gpu"]}}, ["unet"])


def test_a_view_and_a_record_are_read_and_written_through_the_table(demo_bundles: dict[str, Path]) -> None:
    from autotune.bundles.config import load_bundle_config
    from autotune.tunables import loader_settings

    cfg = load_bundle_config(demo_bundles["unet_0"]).with_values(
        num_patches_per_iter=3, num_images_per_batch=3, num_sw_batch_size=5, sw_input_on_cpu=True, num_crops_per_image=2)
    assert bundle_values(cfg) == {"num_patches_per_iter": 3, "num_sw_batch_size": 5, "validation_device": "cpu"}
    for n, crops in ((1, 1), (3, 2), (4, 6), (7, 4)):
        point = Point.of(num_patches_per_iter=n, num_sw_batch_size=2, validation_device=ValidationDevice.DEVICE)
        written = written_values(point, cfg.with_values(num_crops_per_image=crops))
        assert {k: written[k] for k in ("num_patches_per_iter", "num_images_per_batch", "num_crops_per_image")} == \
            loader_settings(n, crops)
        assert (written["num_sw_batch_size"], written["sw_input_on_cpu"]) == (2, False)
        assert [t.written_value(written) for t in TUNABLES] == [n, 2, "device"]  # what a tuned result shows


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
    assert req["config"].num_sw_batch_size == 3  # the step reads it from the config, as training does
    assert req["validation_device"] in VALIDATION_DEVICE.choices
    with pytest.raises(ProbeError, match="unknown tunable 'num_workers'"):
        resolve_request(bundle, num_workers=2, check_device=False)
    assert set(distributions(AlgoSpec(), ("device",))) == {t.name for t in TUNABLES}


# A fourth tunable, registered as docs/architecture.md ("Adding a tunable") says: its definition in TUNABLES and
# its key in a family's table, nothing else edited. It runs in a fresh interpreter where the table is patched
# before any other module is imported, as an edit of autotune/tunables.py would be seen.
_FOURTH = r'''
import json, sys
import autotune.tunables as T

NEW = T.Tunable(name="num_prefetch", kind="int", phase="train", spec_key="range_num_prefetch", default_range=(1, 8),
                label="prefetch", unit="batches", probed="training steps with P batches prefetched", metavar="P")
T.TUNABLES = (*T.TUNABLES, NEW)
from autotune.families import own
own.KEYS["num_prefetch"] = ("num_prefetch",)

bundle, out = sys.argv[1], {}
from autotune.bundles.config import load_bundle_config
config = load_bundle_config(bundle)
from autotune.search.strategies.space import SPEC_KEYS, parse_specs, spec_for
spec = spec_for(parse_specs({"unet": {"range_num_prefetch": [2, 4]}}, ["unet"])["unet"], config)
out["spec"] = [list(spec.space_of(NEW)), list(spec_for({}, config).space_of(NEW)), "range_num_prefetch" in SPEC_KEYS]

from autotune.probe.runner import resolve_request
from autotune.tunables import bundle_values
request = resolve_request(bundle, num_prefetch=3, check_device=False)
out["request"] = [request["num_prefetch"], request["config"].tunable_value("num_prefetch"),
                  resolve_request(bundle, check_device=False)["num_prefetch"], bundle_values(load_bundle_config(bundle))]

from autotune.bundles.plan import TuningPlan
from autotune.errors import ConfigError
record = {"num_patches_per_iter": 2, "num_sw_batch_size": 4, "validation_device": "cpu", "num_prefetch": 3,
          "memory_limit": 1 << 26, "device": "cpu", "max_num_patches_per_iter": 5}
plan = TuningPlan.from_record(record)
block = plan.as_dict()
try:
    TuningPlan.from_dict({**block, "num_prefetch": 0}, "tuning")
    bad = None
except ConfigError as exc:
    bad = str(exc)
old = TuningPlan.from_dict({k: v for k, v in block.items() if k != "num_prefetch"}, "tuning")
out["plan"] = [list(block), plan.value("num_prefetch"), TuningPlan.from_dict(block, "tuning") == plan, bad,
               old.value("num_prefetch")]

from autotune.search.strategies.evaluate import Evaluation
from autotune.search.strategies.outcome import SearchOutcome, distributions
from autotune.search.driver.strategy_run import _answer
from autotune.tunables import written_values
common = {"status": "ok", "feasible": True, "peak_bytes": 1, "value": 1.0, "trial_number": 0, "reused": False}
train = Evaluation(point={"num_patches_per_iter": 2, "num_prefetch": 3}, phases=("train",), **common)
infer = Evaluation(point={"num_patches_per_iter": 2, "num_sw_batch_size": 4, "validation_device": "cpu"},
                   phases=("infer",), **common)
outcome = SearchOutcome.of_points(5, train, infer, [train, infer])
answer = _answer(outcome, {})
out["outcome"] = [outcome.value("num_prefetch"), answer.point.get("num_prefetch"),
                  sorted(distributions(spec, ("device",))), written_values(answer.point, config)["num_prefetch"]]

from autotune.cli import build_parser
from autotune.commands.probe import tunable_args
from autotune.commands.search import specs_from_args
parser = build_parser()
out["cli"] = [tunable_args(parser.parse_args(["probe", bundle, "--num-prefetch", "3"]))["num_prefetch"],
              specs_from_args(parser.parse_args(["tune", bundle, "--range-num-prefetch", "1", "6"]))["universal"],
              " ".join(parser._subparsers._group_actions[0].choices["estimate"].format_help().split())]
print(json.dumps(out))
'''


def test_a_fourth_tunable_needs_its_definition_and_a_family_key_only(demo_bundles: dict, tmp_path: Path) -> None:
    """Registered in the table and one family's key table, a train-phase whole-number tunable is in the specs'
    keys and ranges, the probe's request, the plan's block, a strategy's outcome, the record and the write-back's
    plain keys, and the command line's flags: no other file edited."""
    import json
    import os
    import subprocess
    import sys

    from bundle_fixtures import copy_bundle

    bundle = copy_bundle(demo_bundles["unet_0"], tmp_path / "unet_0")
    hyper = bundle / "configs" / "hyper_parameters.yaml"  # the template's starting value (the family's side)
    hyper.write_text(hyper.read_text(encoding="utf-8") + "num_prefetch: 2\n", encoding="utf-8")
    run = subprocess.run([sys.executable, "-c", _FOURTH, str(bundle)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["spec"] == [[2, 4], [1, 8], True]
    # the step (autotune.probe.workload) reads it from the request's view, as training reads its config
    assert out["request"][:3] == [3, 3, 2] and out["request"][3]["num_prefetch"] == 2
    keys, value, round_trip, bad, old = out["plan"]
    assert keys[:4] == ["version", "num_patches_per_iter", "num_sw_batch_size", "num_prefetch"] and value == 3
    assert round_trip and bad == "tuning.num_prefetch: must be a positive integer, got 0; run 'autotune tune' again"
    assert old is None  # a block written before the tunable existed still loads
    assert out["outcome"] == [3, 3, ["num_patches_per_iter", "num_prefetch", "num_sw_batch_size", "validation_device"],
                              3]  # the write-back's plain key
    flag, universal, help_text = out["cli"]
    assert flag == 3 and universal == {"range_num_prefetch": [1, 6]}
    assert "--num-prefetch P training steps with P batches prefetched (default: the bundle's value)" in help_text


def test_where_the_volume_lives_is_one_enum_and_one_function() -> None:
    """The validation device is ``ValidationDevice`` inside the code, its strings in files and studies; where a
    volume is put for windows on a device is ``volume_device``, whoever asks (trainer, inferer, probe, estimator)."""
    assert VALIDATION_DEVICE.choices == ("device", "cpu") and ValidationDevice.CPU == "cpu"
    assert f"{ValidationDevice.CPU}" == str(ValidationDevice.CPU) == "cpu"
    assert ValidationDevice.CPU.volume_device("cuda:0") == "cpu" and ValidationDevice.DEVICE.volume_device("cuda:1") == "cuda:1"
    assert ValidationDevice.of_flag(True) is ValidationDevice.CPU and ValidationDevice.of_flag(False) is ValidationDevice.DEVICE
    assert ValidationDevice.of(None) is ValidationDevice.DEVICE
    point = Point.of(validation_device=ValidationDevice.CPU)
    assert point.values["validation_device"] == "cpu" and type(point.values["validation_device"]) is str
    assert point.validation_device is ValidationDevice.CPU
    with pytest.raises(ValueError, match="'gpu' is not a valid ValidationDevice"):
        ValidationDevice.of("gpu")


def test_a_point_holds_one_value_per_tunable_and_sizes_a_phase_by_sized_by() -> None:
    from autotune.tunables import Point, loader_settings

    point = Point.of({"num_patches_per_iter": 3, "validation_device": None}, num_sw_batch_size=5)
    assert point.as_dict() == {"num_patches_per_iter": 3, "num_sw_batch_size": 5}  # None: the bundle's value
    assert (point.num_patches_per_iter, point.num_sw_batch_size, point.validation_device) == (3, 5, None)
    assert point.at("joint", 4).num_patches_per_iter == 4 and point.at("infer", 2).num_sw_batch_size == 2
    assert point.without("num_patches_per_iter").as_dict() == {"num_sw_batch_size": 5}
    assert Point.taken_from({"num_patches_per_iter": 2, "phase": "train"}).as_dict() == {"num_patches_per_iter": 2}
    assert Point.of(num_workers=2).unknown() == ["num_workers"] and Point.of(point) == point
    assert loader_settings(4, 6) == {"num_patches_per_iter": 4, "num_images_per_batch": 2, "num_crops_per_image": 6}
