"""Property tests of the command line and the loaders on hostile input, run in-process (``autotune.cli.main``).

Hypothesis generates malformed option values, bundle configs, override files, datalists, images, environment
settings and storage URLs: wrong types, NaN and infinities, numbers out of range, odd characters, nesting
and aliases. For every run:

- the exit code is a documented one (``autotune.cli.EXIT_CODES``), never 70, the internal-error code;
- nothing prints or logs a traceback; a refusal is one line on stderr;
- no file outside the work folder changes (the shared demo data and work folder are hashed);
- no earlier good file inside the work folder changes unless the command succeeded.

Where the input is malformed by construction (a bad option value, a broken bundle config) the exit code must
be 2. The numbers of examples are bounded so that the file runs in about 25 s on two cores; every failure
hypothesis found is kept as an ``@example``.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest
import yaml
from cli_harness import (
    alias_bomb,
    assert_refused_cleanly,
    assert_unchanged,
    environment,
    inside,
    run_checked,
    run_cli,
    snapshot,
)
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from autotune.bundles.config import CONFIG_RELPATH
from autotune.checks.environment import SETTINGS
from autotune.errors import AutotuneError

BOUNDED = settings(deadline=None, database=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])

# ----------------------------------------------------------------------------- values that are never valid

odd_text = st.one_of(
    st.sampled_from(["", " ", "\x00", "a\nb", "\u2603", "١٢", "１２", "0x10", "None", "null", "[]", "{}", "$x", "~",
                     "~nosuchuser_xyz", "--", "9" * 400, "1e999", "nan", "NaN", "inf", "-inf", "1,,2", "é"]),
    st.text(max_size=12),
)
non_finite = st.sampled_from([math.nan, math.inf, -math.inf])
_INT_TEXT = re.compile(r"\s*[+-]?[0-9]+\s*")


def _is_float_text(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def bad_int_text(low: int, high: int) -> st.SearchStrategy[str]:
    """Text that is not a whole number from ``low`` to ``high``."""
    return st.one_of(
        st.integers(max_value=low - 1).map(str), st.integers(min_value=high + 1).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        odd_text.filter(lambda t: not _INT_TEXT.fullmatch(t) or not low <= int(t) <= high),
    )


def bad_number_text(low: float, high: float, high_open: bool = False, low_open: bool = False) -> st.SearchStrategy[str]:
    """Text that is not a finite number in the range."""
    def outside(text: str) -> bool:
        if not _is_float_text(text):
            return True
        value = float(text)
        return value < low or value > high or (low_open and value == low) or (high_open and value == high)

    return st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), odd_text).filter(outside)


bad_size = st.one_of(
    st.sampled_from(["0", "-1GiB", "0.4", "1e3", "8XB", "GiB", "2PiB", "1.5.5GiB", "9" * 40 + "TiB", "nan", "inf"]),
    odd_text.filter(lambda t: not re.search(r"[0-9]", t)),
)
bad_duration = st.one_of(
    st.sampled_from(["0", "-1m", "1y", "0s", "400d", "9" * 40, "nan", "inf", "1.5.5h", "h"]),
    odd_text.filter(lambda t: not re.search(r"[0-9]", t)),
)
bad_device = odd_text.filter(lambda t: not re.fullmatch(r"auto|cpu|cuda(:[0-9]{1,3})?", t.strip().lower()))
bad_host = st.sampled_from(["no-such-host.invalid", "a b", "..", "a..b", "x" * 300, "\x00", "http://x", "*", "é.x",
                            ""])
bad_storage = st.one_of(st.sampled_from(["nosuchdialect://x", "not a url", "sqlite", "sqlite:/x.db", "\x00",
                                         "http://u:secret@h/x", ""]),
                        odd_text.filter(lambda t: "://" not in t))
bad_phases = odd_text.filter(lambda t: not t.strip(", ") or not {p.strip() for p in t.split(",") if p.strip()}
                             <= {"train", "infer"})
bad_folds = odd_text.filter(lambda t: not t.strip(", ") or not all(
    _INT_TEXT.fullmatch(p) and 0 <= int(p) <= 99 for p in t.split(",") if p.strip()))

# (command line before the option, option, values it refuses); positional arguments are placeholders: the
# options are checked as they are parsed, before anything is read
OPTIONS: list[tuple[tuple[str, ...], str, st.SearchStrategy[str]]] = [
    (("dashboard",), "--port", bad_int_text(1, 65535)),
    (("dashboard",), "--host", bad_host),
    (("dashboard",), "--storage", bad_storage),
    (("estimate", "b"), "--num-patches-per-iter", bad_int_text(1, 65536)),
    (("estimate", "b"), "--num-sw-batch-size", bad_int_text(1, 65536)),
    (("estimate", "b"), "--memory-limit", bad_size),
    (("estimate", "b"), "--device", bad_device),
    (("probe", "b"), "--timeout", bad_number_text(0, 366 * 86400.0, low_open=True)),
    (("probe", "b"), "--phases", bad_phases),
    (("probe", "b"), "--warmup-steps", bad_int_text(0, 1000)),
    (("probe", "b"), "--measure-steps", bad_int_text(1, 1000)),
    (("tune", "b"), "--margin", bad_number_text(0, 1, high_open=True)),
    (("tune", "b"), "--num-trials", bad_int_text(1, 10_000)),
    (("tune", "b"), "--target-memory", bad_size),
    (("tune", "b"), "--storage", bad_storage),
    (("worker", "--work-dir", "w"), "--timeout", bad_number_text(0, 366 * 86400.0, low_open=True)),
    (("verify", "b"), "--memory-limit", bad_size),
    (("train", "b"), "--epochs", bad_int_text(1, 1_000_000)),
    (("train", "b"), "--max-time", bad_duration),
    (("train", "b"), "--val-every", bad_int_text(1, 1_000_000)),
    (("train", "b"), "--nproc", bad_int_text(1, 1024)),
    (("infer", "b", "--images", "i", "--output", "o"), "--device", bad_device),
    (("run", "--input", "i", "--work-dir", "w"), "--folds", bad_folds),
    (("run", "--input", "i", "--work-dir", "w"), "--validation-devices", bad_phases),
    (("analyze", "--input", "i", "--work-dir", "w"), "--num-fold", bad_int_text(1, 100)),
    (("demo-data", "out"), "--cases", bad_int_text(1, 10_000)),
    (("demo-data", "out"), "--size", bad_int_text(16, 512)),
    (("demo-data", "out"), "--seed", bad_int_text(0, 2**32 - 1)),
]


@st.composite
def option_runs(draw: st.DrawFn) -> list[str]:
    before, option, values = draw(st.sampled_from(OPTIONS))
    return [*before, f"{option}={draw(values)}"]


@settings(BOUNDED, max_examples=120)
@given(argv=option_runs())
@example(argv=["dashboard", "--port=70000"])
@example(argv=["dashboard", "--port=-1"])
@example(argv=["dashboard", "--host=no-such-host.invalid"])
@example(argv=["probe", "b", "--timeout=nan"])
@example(argv=["estimate", "b", "--memory-limit=" + "9" * 400])
@example(argv=["demo-data", "out", "--size=100000"])
@example(argv=["dashboard", "--port=--"])  # found: argparse stored [] for a lone '--', an internal error
@example(argv=["estimate", "b", "--num-patches-per-iter=--"])  # found: the same [] reached the bundle's loader
def test_a_bad_option_value_is_one_line_naming_it(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="autotune-hostile-") as folder, inside(Path(folder)):
        outcome = run_cli(argv, capsys)
        assert not any(Path(folder).iterdir()), "an option refused as it is parsed writes nothing"
    assert_refused_cleanly(outcome, argv)
    assert f"argument {argv[-1].split('=')[0]}" in outcome.err, outcome.err


# ----------------------------------------------------------------------------- broken bundle configs

INT_KEYS = ("input_channels", "output_classes", "num_images_per_batch", "num_crops_per_image", "num_patches_per_iter",
            "num_sw_batch_size", "num_epochs", "num_epochs_per_validation", "seed")
NUMBER_KEYS = ("learning_rate", "cache_rate", "sw_overlap")
FLAG_KEYS = ("amp", "sw_input_on_cpu", "crop_foreground", "cache_on_device")
TRIPLE_KEYS = ("roi_size", "resample_resolution")
SECTIONS = ("network", "loss", "optimizer")
REQUIRED = ("algo", *SECTIONS, *TRIPLE_KEYS, "input_channels", "output_classes", "num_images_per_batch",
            "num_crops_per_image", "num_patches_per_iter", "num_sw_batch_size", "num_epochs", "amp", "sw_input_on_cpu")

not_a_number = st.one_of(non_finite, odd_text, st.booleans(), st.none(), st.lists(st.integers(), max_size=2),
                         st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
bad_for_key = {
    **{key: st.one_of(not_a_number, st.integers(max_value=-1), st.integers(min_value=2**40),
                      st.floats(0.5, 100.0)) for key in INT_KEYS},
    "learning_rate": st.one_of(not_a_number, st.floats(max_value=0.0), st.floats(min_value=1e4, max_value=1e300)),
    "cache_rate": st.one_of(not_a_number, st.floats(min_value=1.001, max_value=1e9), st.floats(max_value=-1e-9)),
    "sw_overlap": st.one_of(not_a_number, st.floats(min_value=1.0, max_value=1e9), st.floats(max_value=-1e-9)),
    **{key: st.one_of(non_finite, odd_text, st.integers(), st.none(), st.lists(st.booleans(), max_size=2))
       for key in FLAG_KEYS},
    **{key: st.one_of(not_a_number, st.lists(st.integers(1, 64), max_size=2), st.lists(st.integers(1, 64),
                      min_size=4, max_size=5), st.tuples(st.integers(1, 64), st.integers(1, 64), st.one_of(
                          non_finite, odd_text, st.just(0), st.just(-3), st.just(10**9))).map(list))
       for key in TRIPLE_KEYS},
    **{key: st.one_of(not_a_number, st.fixed_dictionaries({"args": st.dictionaries(st.text(max_size=3),
                      st.integers(), max_size=2)}), st.fixed_dictionaries({"name": st.one_of(
                          st.integers(), st.none(), st.lists(st.text(max_size=2), max_size=1))}))
       for key in SECTIONS},
}


def _places(config: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths of every mapping in ``config``."""
    if isinstance(config, dict):
        yield path
        for key, value in config.items():
            yield from _places(value, (*path, key))


#: a good ``tuning.training_oom`` record (a pass of 2 patches stepped down to 2 micro-batches of one)
GOOD_OOM = {"num_patches_per_iter": 2, "micro_batches": 2, "sw_batch": 4, "validation_device": "device",
            "device": "cpu"}
FILES = ["", "- a\n- b\n", "42\n", "algo: [unet\n", "\x00\x01", alias_bomb(), "a: &x [1, *x]\n",
         "a: " + "[" * 200 + "]" * 200, "algo: !!set {unet}\n", "a: !!python/object:os.system x\n", "a: 1\na: 2\n" * 2]
mutations = st.one_of(
    st.sampled_from(sorted(bad_for_key)).flatmap(lambda key: st.tuples(st.just("value"), st.just(key),
                                                                       bad_for_key[key])),
    st.tuples(st.just("missing"), st.sampled_from(REQUIRED), st.none()),
    st.tuples(st.just("non-finite"), st.integers(0, 20), non_finite),
    st.tuples(st.just("expression"), st.integers(0, 20), st.text(max_size=6).map(lambda t: "$" + t)),
    st.tuples(st.just("tuning"), st.sampled_from(["num_patches_per_iter", "memory_limit", "device", "version"]),
              st.one_of(st.integers(-3, 0), non_finite, odd_text, st.none())),
    st.tuples(st.just("training_oom"), st.sampled_from(sorted(GOOD_OOM)),
              st.one_of(st.integers(-3, 0), st.just(10**6), non_finite, odd_text, st.none())),
    st.tuples(st.just("file"), st.none(), st.sampled_from(FILES)),
)


def broken_config(good: dict[str, Any], mutation: tuple[str, Any, Any]) -> str:
    """The good config's text with one thing broken: a checked key's value, a required key removed, a NaN or a
    ``$`` expression in any mapping, a bad ``tuning:`` block, or the whole file replaced by what is not a config."""
    how, where, value = mutation
    if how == "file":
        return str(value)
    config = json.loads(json.dumps(good))
    if how == "value":
        config[where] = value
    elif how == "missing":
        del config[where]
    elif how in ("tuning", "training_oom"):
        config["tuning"] = {"num_patches_per_iter": 2, "num_sw_batch_size": 4, "memory_limit": 2**26,
                            "device": "cpu"}
        if how == "tuning":
            config["tuning"][where] = value
        else:  # a step-down record edited by hand (issue 66: "two" and 1000000 micro-batches)
            config["tuning"]["training_oom"] = {**GOOD_OOM, where: value}
    else:
        places = list(_places(config))
        target = config
        for key in places[where % len(places)]:
            target = target[key]
        target["x" if how == "expression" else "learning_rate"] = value
    return yaml.safe_dump(config, allow_unicode=True)


@pytest.fixture(scope="module")
def good_config(good_work: Path) -> dict[str, Any]:
    return yaml.safe_load((good_work / "unet_0" / CONFIG_RELPATH).read_text())


@contextmanager
def scratch_work(good_work: Path, with_lists: bool = False) -> Iterator[Path]:
    """A fresh work folder per example holding a good bundle and a good file beside it (``tmp_path`` is shared by
    all examples of a test)."""
    with tempfile.TemporaryDirectory(prefix="autotune-hostile-") as folder:
        work = Path(folder) / "work"
        shutil.copytree(good_work / "unet_0", work / "unet_0")
        for name in ("datastats.yaml", *(("datalist.json", "data_src.yaml", "datastats_cache.json",
                                          "datastats_by_case.json") if with_lists else ())):
            shutil.copy2(good_work / name, work / name)
        yield work


@settings(BOUNDED, max_examples=60)
@given(mutation=mutations, command=st.sampled_from(["estimate", "verify", "train", "tune"]))
@example(mutation=("file", None, alias_bomb()), command="train")
@example(mutation=("training_oom", "micro_batches", "two"), command="train")
@example(mutation=("training_oom", "micro_batches", 10**6), command="train")
@example(mutation=("training_oom", "micro_batches", 3), command="train")  # more micro-batches than patches per pass
@example(mutation=("value", "learning_rate", "١٢"), command="estimate")  # found: float() read Arabic-Indic digits
@example(mutation=("value", "learning_rate", "0.5"), command="verify")  # found: a number written as text passed
def test_a_broken_bundle_config_is_refused_at_load(mutation: tuple[str, Any, Any], command: str,
                                                   good_config: dict[str, Any], good_work: Path, demo_data: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    text = broken_config(good_config, mutation)
    outside = snapshot(good_work, demo_data)
    with scratch_work(good_work) as work:
        config = work / "unet_0" / CONFIG_RELPATH
        config.write_bytes(text.encode("utf-8", "surrogatepass"))
        good = snapshot(work / "datastats.yaml")
        argv = [command, str(work / "unet_0"), "--device", "cpu", *(["--no-retune"] if command == "verify" else [])]
        with inside(work):
            outcome = run_cli(argv, capsys)
        assert_refused_cleanly(outcome, argv)
        assert str(config) in outcome.err, outcome.err
        assert_unchanged(good, snapshot(work / "datastats.yaml"), "a good file in the work folder")
        assert not (work / "unet_0" / "model_fold0").exists() and not (work / "studies").exists()
    assert_unchanged(outside, snapshot(good_work, demo_data), "a file outside the work folder")


# ----------------------------------------------------------------------------- override files

config_keys = st.sampled_from(["learning_rate", "num_epochs", "roi_size", "network", "amp", "cache_rate",
                               "intensity_normalization", "batch_scaling", "unet", "dints", "x"])
yaml_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
              odd_text),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(config_keys, children, max_size=3)),
    max_leaves=8,
)
override_texts = st.one_of(
    st.dictionaries(config_keys, yaml_values, max_size=4).map(lambda d: yaml.safe_dump(d, allow_unicode=True)),
    st.builds(lambda inner: yaml.safe_dump({"unet": inner}), st.dictionaries(config_keys, yaml_values, max_size=3)),
    st.sampled_from([alias_bomb(), alias_bomb(5, 30), "unet: &x {a: *x}\n", "- 1\n", "x: !!binary aGk=\n",
                     "learning_rate: &v .nan\nunet: {learning_rate: *v}\n", "[" * 300, "\xff\xfe"]),
    st.text(max_size=40),
)


@settings(BOUNDED, max_examples=30)
@given(text=override_texts)
@example(text="learning_rate: .nan\n")
@example(text="num_epochs: 5\n")
@example(text=alias_bomb())
def test_any_override_file_keeps_the_properties(text: str, good_work: Path, demo_data: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    outside = snapshot(good_work, demo_data)
    with scratch_work(good_work, with_lists=True) as work:
        overrides = work.parent / "overrides.yaml"
        overrides.write_bytes(text.encode("utf-8", "surrogatepass"))
        good = snapshot(work)
        argv = ["generate", "--input", str(demo_data), "--work-dir", str(work), "--algos", "unet",
                "--num-fold", "1", "--overrides", str(overrides), "-q"]
        outcome = run_checked(argv, work, capsys)
        if outcome.code != 0:
            assert_unchanged(good, snapshot(work), "a good file in the work folder")
    assert_unchanged(outside, snapshot(good_work, demo_data), "a file outside the work folder")


# ----------------------------------------------------------------------------- datalists and images

path_values = st.one_of(st.sampled_from(["imagesTr/case_000.nii.gz", "labelsTr/case_000.nii.gz", "../x.nii.gz",
                                         "missing.nii.gz", "/", ".", "datalist.json"]), odd_text, yaml_values)
datalist_entries = st.fixed_dictionaries({}, optional={"image": path_values, "label": path_values,
                                                       "fold": st.one_of(st.integers(-2, 6), non_finite, odd_text)})


@st.composite
def datalists(draw: st.DrawFn, good: dict[str, Any]) -> Any:
    """The good datalist with one entry, key or value broken, or something else altogether."""
    datalist = json.loads(json.dumps(good))
    how = draw(st.sampled_from(["entry", "value", "top", "junk"]))
    if how == "entry":
        datalist["training"][draw(st.integers(0, len(datalist["training"]) - 1))] = draw(datalist_entries)
    elif how == "value":
        entry = datalist["training"][draw(st.integers(0, len(datalist["training"]) - 1))]
        entry[draw(st.sampled_from(["image", "label", "fold"]))] = draw(path_values)
    elif how == "top":
        datalist[draw(st.sampled_from(["training", "testing", "labels", "modality", "class_names"]))] = draw(
            yaml_values)
    else:
        return draw(yaml_values)
    return datalist


images = st.one_of(
    st.tuples(st.sampled_from(["nan", "inf", "blank", "huge", "tiny-shape", "2d", "5d", "int64", "bool",
                               "complex"]), st.integers(0, 5)),
)


def _write_image(root: Path, kind: str, case: int) -> None:
    """Replace case ``case``'s image by one of the kinds of bad or odd image."""
    path = root / "imagesTr" / f"case_{case:03d}.nii.gz"
    image = nib.load(str(path))
    data = np.asanyarray(image.dataobj).astype(np.float32)
    data = {
        "nan": lambda d: np.where(d > d.mean(), np.nan, d).astype(np.float32),
        "inf": lambda d: np.where(d > d.mean(), np.inf, d).astype(np.float32),
        "blank": np.zeros_like,
        "huge": lambda d: (d / d.max() * 3e38).astype(np.float32),
        "tiny-shape": lambda d: d[:2, :2, :2],
        "2d": lambda d: d[:, :, 0],
        "5d": lambda d: d[..., None, None],
        "int64": lambda d: (d * 1e12).astype(np.int64),
        "bool": lambda d: d > d.mean(),
        "complex": lambda d: d.astype(np.complex64),
    }[kind](data)
    if data.dtype == bool:
        data = data.astype(np.uint8)
    nib.save(nib.Nifti1Image(data, image.affine, dtype=data.dtype), str(path))


@settings(BOUNDED, max_examples=25)
@given(data=st.data(), image=st.one_of(st.none(), images))
@example(data=None, image=("nan", 1))
@example(data=None, image=("huge", 0))  # found: refused at the statistics after the lists were rewritten
@example(data={"training": [{"image": "\x00", "label": "labelsTr/case_000.nii.gz"}]}, image=None)  # found: exit 70
def test_any_datalist_or_image_keeps_the_properties(data: Any, image: tuple[str, int] | None, good_work: Path,
                                                    demo_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good_list = json.loads((demo_data / "datalist.json").read_text())
    outside = snapshot(good_work, demo_data)
    with tempfile.TemporaryDirectory(prefix="autotune-hostile-") as folder:
        root = Path(shutil.copytree(demo_data, Path(folder) / "data"))
        work = Path(shutil.copytree(good_work, Path(folder) / "work", ignore=shutil.ignore_patterns("unet_0")))
        if image is not None:
            _write_image(root, *image)
        listed = isinstance(data, dict) or (data is not None and (
            image is None or data.draw(st.booleans(), label="also the datalist")))
        if listed:
            given = data if isinstance(data, dict) else data.draw(datalists(good_list), label="datalist")
            (root / "datalist.json").write_text(json.dumps(given))
        good = snapshot(work)
        argv = ["analyze", "--input", str(root / "datalist.json"), "--work-dir", str(work), "--num-fold", "2", "-q"]
        outcome = run_checked(argv, work, capsys)
        if not listed and image is not None and image[0] in ("nan", "inf", "blank", "huge", "tiny-shape", "2d", "5d", "complex"):
            assert outcome.code == 2 and f"case_{image[1]:03d}.nii.gz" in outcome.err, outcome.err
        if outcome.code != 0:
            assert_unchanged(good, snapshot(work), "a good file in the work folder")
    assert_unchanged(outside, snapshot(good_work, demo_data), "a file outside the work folder")


input_yaml_texts = st.one_of(
    st.builds(lambda key, value: yaml.safe_dump({"name": "demo", "modality": "MRI", "datalist": "datalist.json",
                                                 "dataroot": ".", key: value}, allow_unicode=True),
              st.sampled_from(["modality", "datalist", "dataroot", "class_names", "labels", "sigmoid", "name"]),
              yaml_values),
    st.sampled_from([alias_bomb(), "modality: &m [*m]\n", "datalist: !!binary aGk=\n", "- modality\n",
                     "modality: MRI\ndatalist: datalist.json\ndataroot: " + "[" * 150 + "]" * 150 + "\n"]),
    st.text(max_size=40),
)


@settings(BOUNDED, max_examples=20)
@given(text=input_yaml_texts)
@example(text=alias_bomb())
def test_any_input_yaml_keeps_the_properties(text: str, good_work: Path, demo_data: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    outside = snapshot(good_work, demo_data)
    with tempfile.TemporaryDirectory(prefix="autotune-hostile-") as folder:
        root = Path(shutil.copytree(demo_data, Path(folder) / "data"))
        work = Path(shutil.copytree(good_work, Path(folder) / "work", ignore=shutil.ignore_patterns("unet_0")))
        (root / "input.yaml").write_bytes(text.encode("utf-8", "surrogatepass"))
        good = snapshot(work)
        argv = ["analyze", "--input", str(root / "input.yaml"), "--work-dir", str(work), "--num-fold", "2", "-q"]
        outcome = run_checked(argv, work, capsys)
        if outcome.code != 0:
            assert_unchanged(good, snapshot(work), "a good file in the work folder")
    assert_unchanged(outside, snapshot(good_work, demo_data), "a file outside the work folder")


# ----------------------------------------------------------------------------- settings and storages

@settings(BOUNDED, max_examples=20)
@given(name=st.sampled_from(sorted(SETTINGS)), value=odd_text.filter(lambda t: "\x00" not in t),
       storage=st.one_of(st.none(), bad_storage.filter(lambda t: "\x00" not in t and t.strip()),
                         st.sampled_from(["sqlite:///{work}/sub/s.db", "sqlite:///{work}", "sqlite:///{work}/junk.db",
                                          "sqlite:////proc/no/s.db", "mysql+nosuchdriver://u@127.0.0.1/x",
                                          "postgresql+psycopg://u:secret@127.0.0.1:1/x"])))
@example(name="AUTOTUNE_PRECISION", value="half", storage=None)
@example(name="AUTOTUNE_STORAGE_RETRY_SECONDS", value="nan", storage="sqlite:///{work}/junk.db")
def test_any_setting_or_storage_keeps_the_properties(name: str, value: str, storage: str | None, good_work: Path,
                                                     capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import optuna_dashboard

    monkeypatch.setattr(optuna_dashboard, "run_server", lambda *args, **kwargs: None)  # never serve in a test
    with tempfile.TemporaryDirectory(prefix="autotune-hostile-") as folder:
        work = Path(folder) / "work"
        work.mkdir()
        (work / "junk.db").write_bytes(b"not a database" * 10)
        good = snapshot(work)
        argv = ["dashboard"] + (["--storage=" + storage.replace("{work}", str(work))] if storage else [])
        with inside(work), environment(**{name: value}):
            outcome = run_cli(argv, capsys)
        assert_refused_cleanly(outcome, argv, exit_two=False)
        assert outcome.code in (0, 2), outcome.text
        assert "secret" not in outcome.text
        if outcome.code != 0:
            assert_unchanged(good, snapshot(work), "a good file in the work folder")


# ----------------------------------------------------------------------------- the loaders

yaml_documents = st.one_of(
    st.builds(lambda value: yaml.safe_dump(value, allow_unicode=True), yaml_values),
    st.builds(lambda name, width, depth: "\n".join(
        [f"{name}0: &{name}0 [x{', x' * (width - 1)}]"]
        + [f"{name}{i}: &{name}{i} [{', '.join([f'*{name}{i - 1}'] * width)}]" for i in range(1, depth + 1)]),
        st.sampled_from(["a", "b_1"]), st.integers(1, 12), st.integers(1, 12)),
    st.text(max_size=60),
)


@settings(BOUNDED, max_examples=100, deadline=1000)
@given(text=yaml_documents, loader=st.sampled_from(["yaml", "overrides", "specs", "bundle", "datalist"]))
@example(text=alias_bomb(12, 12), loader="bundle")
def test_loaders_answer_within_a_second_or_refuse_in_one_line(text: str, loader: str) -> None:
    from autotune.bundles.config import load_bundle_config
    from autotune.bundles.templates import load_overrides
    from autotune.data.datalist import load_data_source
    from autotune.stages import load_specs
    from autotune.utils import read_yaml

    with tempfile.TemporaryDirectory(prefix="autotune-hostile-") as folder:
        path = Path(folder) / ("input.yaml" if loader == "datalist" else "f.yaml")
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        read = {"yaml": read_yaml, "overrides": load_overrides, "specs": load_specs, "bundle": load_bundle_config,
                "datalist": load_data_source}[loader]
        try:
            read(path)
        except AutotuneError as exc:
            assert "\n" not in str(exc) and str(exc).strip()
