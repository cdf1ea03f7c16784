"""Property tests: spec and datalist parsing either succeed or raise ``AutotuneError``, never crash.

Inputs are arbitrary nested data (what a YAML or JSON file can hold), "near-valid" data built
from the real keys with random values, and arbitrary bytes as file contents. A parser may
refuse an input only with an ``AutotuneError`` (one line naming the culprit); any other
exception is a bug. When it accepts an input, what it returns must satisfy its contract.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from autotune.data.datalist import MODALITIES, DataSource, load_data_source
from autotune.errors import AutotuneError
from autotune.probe.runner import VALIDATION_DEVICES
from autotune.search.strategies.space import SPEC_KEYS, parse_specs

ALGOS = ["segresnet", "dints", "unet"]
RANGE_KEYS = ("range_num_images_per_batch", "range_num_patches_per_iter", "range_num_sw_batch_size")

# Whole file well under 30 s; no example database written into the source tree.
FAST = settings(max_examples=80, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# ----------------------------------------------------------------------------- strategies

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
)
keys = st.one_of(st.text(max_size=10), st.integers(-3, 3), st.none(), st.booleans())
# Anything a YAML file can hold (dict keys need not be text there).
anything = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=4)),
    max_leaves=12,
)
# Anything a JSON file can hold (text keys only; NaN and infinities are written as JSON does).
json_anything = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(max_size=10), children,
                                                                               max_size=4)),
    max_leaves=12,
)

small_ints = st.integers(-3, 70)
int_ranges = st.one_of(
    st.tuples(small_ints, small_ints).map(list),
    st.tuples(st.integers(1, 16), st.integers(1, 64)).map(list),
    st.tuples(small_ints, small_ints),
    st.lists(small_ints, max_size=3),
    st.lists(st.one_of(st.floats(0, 64), st.booleans(), st.text(max_size=3)), min_size=2, max_size=2),
    anything,
)
num_trials = st.one_of(st.integers(-2, 60), st.booleans(), st.floats(-2, 60), st.text(max_size=4), anything)
device_names = st.sampled_from([*VALIDATION_DEVICES, "gpu", "cuda", "CPU", ""])
validation_devices = st.one_of(device_names, st.lists(device_names, max_size=3),
                               st.lists(st.sampled_from(VALIDATION_DEVICES), min_size=1, max_size=3), anything)
spec_entry = st.one_of(
    st.fixed_dictionaries({}, optional={
        "num_trials": num_trials,
        "range_num_images_per_batch": int_ranges,
        "range_num_patches_per_iter": int_ranges,
        "range_num_sw_batch_size": int_ranges,
        "validation_devices": validation_devices,
    }),
    st.fixed_dictionaries({}, optional={"num_trial": anything, "range_num_images": int_ranges, "": anything}),
    st.none(),
    anything,
)
near_valid_specs = st.one_of(
    st.fixed_dictionaries({}, optional={"universal": spec_entry, "segresnet": spec_entry, "dints": spec_entry,
                                        "unet": spec_entry}),
    st.fixed_dictionaries({}, optional={"swinunetr": spec_entry, "Universal": spec_entry, "unet": spec_entry}),
    st.dictionaries(keys, spec_entry, max_size=3),
)

# Datalist pieces. Valid values come first; "near-valid" data is valid data with one nested value
# replaced by junk, deleted, or a junk key added (see ``_mutated``).
good_paths = st.sampled_from(["imagesTr/case_0.nii.gz", "./case_1.nii.gz", "labelsTr/case_0.nii.gz",
                              "/abs/case.nii.gz", "~/case.nii.gz"])
bad_paths = st.sampled_from(["../outside.nii.gz", "a/../../b.nii", "~nosuchuser_xyz/case.nii.gz", "", "  ", ".",
                             "a\x00b.nii", "~"])
path_text = st.one_of(good_paths, good_paths, bad_paths, st.text(max_size=12))
paths = st.one_of(path_text, st.lists(path_text, max_size=3), anything)
good_modality = st.one_of(
    st.sampled_from(["CT", "MRI", "mr", "ct", "T2", "FLAIR", "t1-gd"]),
    st.dictionaries(st.sampled_from(["0", "1"]), st.sampled_from(["T2", "ADC", "MRI"]), min_size=1),
    st.lists(st.sampled_from(["T1", "T2", "FLAIR"]), min_size=1, max_size=2),
)
modality = st.one_of(
    good_modality, st.sampled_from(["PET", "", "C T"]),
    st.dictionaries(st.sampled_from(["0", "1", "2"]), st.sampled_from(["CT", "MRI", "PET"]), max_size=3),
    st.lists(st.sampled_from(["CT", "T1", "X"]), max_size=3), anything,
)
good_labels = st.one_of(
    st.lists(st.integers(0, 4), max_size=3),
    st.dictionaries(st.sampled_from(["0", "1", "2", " 3", "-1"]), st.text(max_size=6), min_size=1, max_size=3),
)
label_keys = st.sampled_from(["0", "1", "-1", " 3", "x", "", "²", "--1", "+2", "1.5", "1_0", "１"])
labels = st.one_of(good_labels, st.dictionaries(label_keys, st.text(max_size=6), max_size=4), anything)
good_class_names = st.lists(
    st.one_of(st.text(min_size=1, max_size=6),
              st.fixed_dictionaries({"name": st.text(max_size=6), "index": st.lists(st.integers(0, 3), max_size=2)})),
    max_size=3,
)
class_names = st.one_of(
    good_class_names,
    st.lists(st.one_of(st.text(max_size=6), st.fixed_dictionaries({"name": anything, "index": anything})), max_size=3),
    anything,
)
fold = st.one_of(st.integers(0, 4), st.integers(-2, -1), st.booleans(), st.floats(-1, 5), st.text(max_size=2))
junk = st.one_of(bad_paths, fold, modality, labels, class_names, paths, anything)


def _good_training(channels: int) -> st.SearchStrategy[list[dict[str, Any]]]:
    image = good_paths if channels == 1 else st.lists(good_paths, min_size=channels, max_size=channels)
    entry = st.fixed_dictionaries({"image": image, "label": good_paths}, optional={"fold": st.integers(0, 4)})
    return st.lists(entry, min_size=1, max_size=5)


good_training = st.integers(1, 2).flatmap(_good_training)
good_testing = st.lists(st.one_of(good_paths, st.fixed_dictionaries({"image": good_paths})), max_size=3)
good_settings = {"name": st.text(min_size=1, max_size=8).filter(str.strip), "labels": good_labels,
                 "class_names": good_class_names, "sigmoid": st.booleans()}
junk_settings = {"modality": modality, "name": st.one_of(st.text(max_size=8), anything), "labels": labels,
                 "class_names": class_names, "sigmoid": st.one_of(st.booleans(), anything)}
valid_datalist = st.fixed_dictionaries({"training": good_training},
                                       optional={"testing": good_testing, "modality": good_modality, **good_settings})
valid_config = st.fixed_dictionaries(
    {"datalist": st.sampled_from(["datalist.json", "./datalist.json", "sub/datalist.json"]), "modality": good_modality},
    optional={"dataroot": st.sampled_from([".", "./", "sub"]), **good_settings},
)
valid_decathlon = st.fixed_dictionaries(
    {"modality": st.dictionaries(st.sampled_from(["0", "1"]), st.sampled_from(["CT", "ct"]), min_size=1),
     "training": good_training},
    optional={"labels": st.dictionaries(st.sampled_from(["0", "1", "2"]), st.text(max_size=6), min_size=1),
              "test": st.lists(good_paths, max_size=2), "testing": good_testing,
              "name": st.text(min_size=1, max_size=8).filter(str.strip)},
)


@st.composite
def _mutated(draw: st.DrawFn, base: st.SearchStrategy[Any]) -> Any:
    """A value of ``base`` with one nested value replaced by junk or deleted, or a junk key or item added."""
    value = draw(base)
    places: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in items:
            places.append((node, key))
            walk(child)

    walk(value)
    if not places:
        return value
    container, key = draw(st.sampled_from(places))
    action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
    if action == "replace":
        container[key] = draw(junk)
    elif action == "delete":
        del container[key]
    elif isinstance(container, dict):
        new_key = draw(st.sampled_from(["fold", "image", "label", "training", "testing", "modality", "labels",
                                        "datalist", "dataroot", "name", "extra"]))
        container[new_key] = draw(junk)
    else:
        container.append(draw(junk))
    return value


def _near(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Valid data, once mutated, twice mutated."""
    return st.one_of(valid, _mutated(valid), _mutated(_mutated(valid)))


near_valid_datalist = st.one_of(
    _near(valid_datalist),
    st.fixed_dictionaries({}, optional={"training": st.lists(st.one_of(
        st.fixed_dictionaries({}, optional={"image": paths, "label": paths, "fold": fold}), anything), max_size=3),
        "testing": st.one_of(st.lists(st.one_of(paths, st.fixed_dictionaries({"image": paths})), max_size=3),
                             anything),
        **junk_settings}),
)
near_valid_config = st.one_of(
    _near(valid_config),
    st.fixed_dictionaries({}, optional={
        "datalist": st.one_of(st.sampled_from(["datalist.json", "missing.json", "", "sub", "../datalist.json",
                                               "input.yaml"]), anything),
        "dataroot": st.one_of(st.sampled_from([".", "sub", "missing", "", ".."]), anything),
        **junk_settings,
    }),
)
near_valid_decathlon = _near(valid_decathlon)
num_folds = st.one_of(st.integers(1, 5), st.integers(1, 5), st.integers(-1, 0), st.booleans())

# ----------------------------------------------------------------------------- helpers


@contextmanager
def _scratch() -> Iterator[Path]:
    """A fresh folder per example (``tmp_path`` would be shared by all examples of one test)."""
    with tempfile.TemporaryDirectory(prefix="autotune-prop-") as folder:
        root = Path(folder) / "case"
        (root / "sub").mkdir(parents=True)
        yield root


def _load(path: Path, num_fold: Any = 1) -> DataSource | None:
    """``load_data_source(path)``; None if refused with an AutotuneError, any other exception propagates."""
    try:
        return load_data_source(path, num_fold=num_fold)
    except AutotuneError:
        return None


def _check_source(source: DataSource, num_fold: int) -> None:
    """What an accepted data source promises: absolute paths, a fold per case, a known modality."""
    assert isinstance(source, DataSource)
    assert source.modality in MODALITIES
    assert source.training, "an accepted datalist has at least one training case"
    assert source.num_channels >= 1
    for entry in source.training:
        images = entry["image"] if isinstance(entry["image"], list) else [entry["image"]]
        assert images and all(isinstance(p, str) and os.path.isabs(p) for p in images)
        assert isinstance(entry["label"], str) and os.path.isabs(entry["label"])
        assert isinstance(entry["fold"], int) and not isinstance(entry["fold"], bool) and entry["fold"] >= 0
        if not source.folds_given:
            assert entry["fold"] < num_fold
    for entry in source.testing:
        images = entry["image"] if isinstance(entry["image"], list) else [entry["image"]]
        assert images and all(isinstance(p, str) and os.path.isabs(p) for p in images)
    if source.labels is not None:
        assert all(isinstance(v, int) and not isinstance(v, bool) for v in source.labels)
        assert source.labels == sorted(source.labels)
    if source.class_names is not None:
        assert all(isinstance(name, str) for name in source.class_names)
    assert isinstance(source.sigmoid, bool)
    assert isinstance(source.name, str) and source.name.strip()


def _write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _write_yaml(path: Path, data: Any) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- (a) parse_specs


def _check_specs(specs: Any) -> None:
    try:
        parsed = parse_specs(specs, algos=ALGOS)
    except AutotuneError:
        event("refused")
        return
    event("accepted")
    assert isinstance(parsed, dict) and list(parsed) == ALGOS
    for algo, explicit in parsed.items():
        assert set(explicit) <= set(SPEC_KEYS) - {"range_num_images_per_batch"}, (algo, explicit)
        for key in ("range_num_patches_per_iter", "range_num_sw_batch_size"):
            if key in explicit:
                lo, hi = explicit[key]
                assert all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)), explicit
                assert 1 <= lo <= hi, explicit
        if "num_trials" in explicit:
            trials = explicit["num_trials"]
            assert isinstance(trials, int) and not isinstance(trials, bool) and trials >= 1
        if "validation_devices" in explicit:
            devices = explicit["validation_devices"]
            assert devices and set(devices) <= set(VALIDATION_DEVICES) and len(set(devices)) == len(devices)


@FAST
@given(specs=anything)
def test_parse_specs_arbitrary_data_returns_or_raises_autotune_error(specs: Any) -> None:
    _check_specs(specs)


@settings(FAST, max_examples=150)
@given(specs=near_valid_specs)
def test_parse_specs_near_valid_data_returns_or_raises_autotune_error(specs: Any) -> None:
    _check_specs(specs)


@FAST
@given(lo=st.integers(1, 64), hi=st.integers(1, 64), algo=st.sampled_from(["universal", *ALGOS]))
def test_parse_specs_keeps_valid_ranges(lo: int, hi: int, algo: str) -> None:
    """A valid [min, max] comes back unchanged for the algorithms it applies to; min > max is refused."""
    specs = {algo: {"range_num_images_per_batch": [lo, hi], "range_num_sw_batch_size": [lo, hi]}}
    if lo > hi:
        with pytest.raises(AutotuneError, match="minimum"):
            parse_specs(specs, algos=ALGOS)
        return
    parsed = parse_specs(specs, algos=ALGOS)
    for name in ALGOS:
        expected = (lo, hi) if algo in ("universal", name) else None
        assert parsed[name].get("range_num_patches_per_iter") == expected
        assert parsed[name].get("range_num_sw_batch_size") == expected




@pytest.mark.parametrize(
    "first",
    [
        pytest.param("range_num_patches_per_iter", id="patches-first"),
        pytest.param("range_num_images_per_batch", id="images-first"),
    ],
)
def test_parse_specs_refuses_both_range_names_in_any_order(first: str) -> None:
    second = next(k for k in ("range_num_patches_per_iter", "range_num_images_per_batch") if k != first)
    with pytest.raises(AutotuneError, match="not both"):
        parse_specs({"unet": {first: [1, 2], second: [3, 4]}}, algos=ALGOS)


# ----------------------------------------------------------------------------- (b) datalists


@FAST
@given(data=json_anything)
def test_datalist_json_arbitrary_data(data: Any) -> None:
    with _scratch() as root:
        _load(_write_json(root / "datalist.json", data))


@settings(FAST, max_examples=150)
@given(data=near_valid_datalist, num_fold=num_folds)
def test_datalist_json_near_valid_data(data: dict[str, Any], num_fold: Any) -> None:
    with _scratch() as root:
        source = _load(_write_json(root / "datalist.json", data), num_fold=num_fold)
        event("accepted" if source is not None else "refused")
        if source is not None:
            _check_source(source, num_fold)
            assert source.dataroot == root


@FAST
@given(config=anything)
def test_input_yaml_arbitrary_data(config: Any) -> None:
    with _scratch() as root:
        _write_json(root / "datalist.json", {"training": [{"image": "i.nii.gz", "label": "l.nii.gz"}]})
        _load(_write_yaml(root / "input.yaml", config))


@settings(FAST, max_examples=150)
@given(config=near_valid_config, datalist=st.one_of(valid_datalist, near_valid_datalist, json_anything),
       num_fold=num_folds)
def test_input_yaml_near_valid_data(config: dict[str, Any], datalist: Any, num_fold: Any) -> None:
    with _scratch() as root:
        _write_json(root / "datalist.json", datalist)
        _write_json(root / "sub" / "datalist.json", datalist)
        source = _load(_write_yaml(root / "input.yaml", config), num_fold=num_fold)
        event("accepted" if source is not None else "refused")
        if source is not None:
            _check_source(source, num_fold)


@FAST
@given(dataset=st.one_of(near_valid_decathlon, near_valid_datalist, json_anything), num_fold=num_folds)
def test_decathlon_folder_near_valid_data(dataset: Any, num_fold: Any) -> None:
    with _scratch() as root:
        _write_json(root / "dataset.json", dataset)
        source = _load(root, num_fold=num_fold)
        event("accepted" if source is not None else "refused")
        if source is not None:
            _check_source(source, num_fold)


def _expected_folds_ok(training: list[dict[str, Any]], num_fold: int) -> bool:
    return all("fold" in entry for entry in training) or len(training) >= num_fold


@FAST
@given(data=valid_datalist, num_fold=st.integers(1, 5), fmt=st.sampled_from(["json", "yaml", "decathlon"]))
def test_valid_data_is_accepted(data: dict[str, Any], num_fold: int, fmt: str) -> None:
    """Valid data in each format is accepted, unless there are too few cases for the folds to assign."""
    with _scratch() as root:
        if fmt == "json":
            path = _write_json(root / "datalist.json", data)
        elif fmt == "yaml":
            datalist = {k: v for k, v in data.items() if k != "modality"}
            _write_json(root / "sub" / "datalist.json", datalist)
            path = _write_yaml(root / "input.yaml", {"modality": data.get("modality", "CT"),
                                                     "datalist": "sub/datalist.json", "dataroot": "."})
        else:
            path = _write_json(root / "dataset.json", {**data, "modality": {"0": "CT"}, "labels": {"0": "bg"}}).parent
        source = _load(path, num_fold=num_fold)
        if not _expected_folds_ok(data["training"], num_fold):
            assert source is None
            return
        assert source is not None, load_data_source(path, num_fold=num_fold)  # re-raise to show why
        _check_source(source, num_fold)
        assert len(source.training) == len(data["training"])
        assert source.folds_given == all("fold" in entry for entry in data["training"])
        if source.folds_given:
            assert [e["fold"] for e in source.training] == [e["fold"] for e in data["training"]]


@FAST
@given(content=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(lambda text: text.encode("utf-8"))),
       name=st.sampled_from(["datalist.json", "input.yaml", "input.yml", "dataset.json"]))
def test_arbitrary_bytes_as_file_content(content: bytes, name: str) -> None:
    with _scratch() as root:
        (root / name).write_bytes(content)
        if name == "input.yaml":  # a valid datalist for the config to point at
            _write_json(root / "datalist.json", {"training": [{"image": "i.nii.gz", "label": "l.nii.gz"}]})
        _load(root if name == "dataset.json" else root / name)


# Known crashes, found by the properties above; each is the minimal input. ``strict``: when the
# owner fixes one, its XPASS fails the run, as a reminder to drop the mark.
_KNOWN_BAD_CONTENT: list[Any] = [
    pytest.param("input.yaml", b"modality: CT\nname: 2020-13-45\ndatalist: datalist.json\n", id="yaml-bad-date"),
    pytest.param("input.yaml", b"name: 0000-00-00\n", id="yaml-zero-date"),
    pytest.param("input.yaml", b"modality: !!int CT\n", id="yaml-int-tag"),
    pytest.param("input.yaml", b"modality: !!float CT\n", id="yaml-float-tag"),
    pytest.param("input.yaml", b"sigmoid: !!bool maybe\n", id="yaml-bool-tag"),
    pytest.param("input.yaml", b"name: !!timestamp x\n", id="yaml-timestamp-tag"),
    pytest.param("input.yaml", b"labels: " + b"1" * 5000 + b"\n", id="yaml-5000-digit-int"),
    pytest.param("datalist.json", b'{"labels": ' + b"1" * 5000 + b"}", id="json-5000-digit-int"),
    pytest.param("datalist.json", b"[" * 20_000, id="json-deep-nesting"),
    pytest.param("input.yaml", b"[" * 3_000, id="yaml-deep-nesting"),
]


@pytest.mark.parametrize(("name", "content"), _KNOWN_BAD_CONTENT)
def test_known_unreadable_files_raise_autotune_error(name: str, content: bytes) -> None:
    with _scratch() as root:
        (root / name).write_bytes(content)
        _write_json(root / "datalist.json" if name != "datalist.json" else root / "other.json",
                    {"training": [{"image": "i.nii.gz", "label": "l.nii.gz"}]})
        _load(root / name)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: {"modality": "CT", "training": [{"image": "~nosuchuser_xyz/i.nii.gz", "label": "l"}]},
                     id="unknown-home-user"),
        pytest.param(lambda: {"modality": "CT", "labels": {"²": "x"}, "training": [{"image": "i", "label": "l"}]},
                     id="superscript-label-key"),
        pytest.param(lambda: {"modality": "CT", "labels": {"--1": "x"}, "training": [{"image": "i", "label": "l"}]},
                     id="double-minus-label-key"),
    ],
)
def test_found_datalist_crashes_are_input_errors_now(make: Callable[[], dict[str, Any]]) -> None:
    """Regression: these crashed ``load_data_source`` with RuntimeError/ValueError before the fix."""
    with _scratch() as root:
        _load(_write_json(root / "datalist.json", make()))
        _load(_write_json(root / "dataset.json", make()).parent)
