"""Input formats, modality names, paths and folds of ``autotune.data.datalist``."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import pytest
import yaml

from autotune.data.datalist import (
    DataSource,
    assign_folds,
    load_data_source,
    normalise_modality,
    write_data_src_config,
    write_datalist,
)
from autotune.errors import InputError


def _write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _pairs(source: DataSource) -> list[tuple[str, str]]:
    return [(entry["image"], entry["label"]) for entry in source.training]


def test_three_input_formats_give_the_same_cases(demo_data: Path, tmp_path: Path) -> None:
    from_yaml = load_data_source(demo_data / "input.yaml")
    from_folder = load_data_source(demo_data)
    json_path = _write_json(tmp_path / "with_modality.json",
                            {**json.loads((demo_data / "datalist.json").read_text()), "modality": "MRI"})
    moved = load_data_source(json_path)  # dataroot is the JSON's folder, not the dataset's

    assert _pairs(from_yaml) == _pairs(from_folder)
    assert len(from_yaml.training) == 6
    for source in (from_yaml, from_folder):
        assert source.modality == "MRI"
        assert source.dataroot == demo_data
        assert source.num_channels == 1
        assert not source.folds_given
        assert source.name == "demo"
        assert source.testing == []
        for image, label in _pairs(source):
            assert Path(image).is_absolute() and Path(image).is_file()
            assert Path(label).is_absolute() and Path(label).is_file()
    assert from_yaml.class_names == ["class1", "class2"]
    assert from_folder.class_names == ["class1", "class2"]
    assert from_folder.labels == [0, 1, 2]
    assert from_yaml.labels is None
    assert moved.dataroot == tmp_path
    assert not Path(moved.training[0]["image"]).is_file()  # relative to the JSON's own folder
    assert moved.name == "with_modality"


def test_datalist_json_without_modality_assumes_mri_and_says_so(demo_data: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="autotune.data.datalist"):
        source = load_data_source(demo_data / "datalist.json")
    assert source.modality == "MRI"
    assert "assuming MRI" in caplog.text
    assert _pairs(source) == _pairs(load_data_source(demo_data))


@pytest.mark.parametrize(
    ("given", "expected"),
    [("CT", "CT"), ("ct", "CT"), ("mr", "MRI"), ("MR", "MRI"), ("mri", "MRI"), ({"0": "MRI"}, "MRI"),
     ({"0": "T2", "1": "ADC"}, "MRI"), (["FLAIR", "T1w", "t1gd", "T2w"], "MRI"), ({"0": "CT"}, "CT")],
    ids=["CT", "ct", "mr", "MR", "mri", "decathlon-dict", "prostate", "brats-list", "decathlon-ct"],
)
def test_modality_names_are_normalised(given: object, expected: str) -> None:
    assert normalise_modality(given, "input.yaml") == expected


@pytest.mark.parametrize("given", ["PET", {"0": "CT", "1": "MRI"}, [], 3], ids=["PET", "mixed", "empty", "number"])
def test_bad_modality_is_an_input_error_listing_the_valid_ones(given: object) -> None:
    with pytest.raises(InputError, match=r"input\.yaml: key 'modality'") as info:
        normalise_modality(given, "input.yaml")
    assert "CT" in str(info.value) and "MRI" in str(info.value)


@pytest.mark.parametrize(("num_cases", "num_fold"), [(6, 5), (10, 5), (160, 5), (7, 3), (5, 1), (0, 4)])
def test_folds_are_balanced_and_deterministic(num_cases: int, num_fold: int) -> None:
    folds = assign_folds(num_cases, num_fold, seed=0)
    assert len(folds) == num_cases
    assert folds == assign_folds(num_cases, num_fold, seed=0)
    assert set(folds) <= set(range(num_fold))
    sizes = [Counter(folds).get(fold, 0) for fold in range(num_fold)]
    assert max(sizes) - min(sizes) <= 1


def test_fold_seed_changes_the_shuffle() -> None:
    assert assign_folds(40, 5, seed=0) != assign_folds(40, 5, seed=1)
    with pytest.raises(InputError, match="num_fold"):
        assign_folds(10, 0)


def test_folds_from_load_follow_num_fold_and_seed(demo_data: Path) -> None:
    source = load_data_source(demo_data, num_fold=3, seed=7)
    assert [entry["fold"] for entry in source.training] == assign_folds(6, 3, seed=7)
    assert source.num_fold == 3
    with pytest.raises(InputError, match="cannot be split into 7 folds"):
        load_data_source(demo_data, num_fold=7)


def test_given_folds_are_kept(demo_data: Path, tmp_path: Path) -> None:
    datalist = json.loads((demo_data / "datalist.json").read_text())
    given = [0, 0, 1, 1, 2, 3]
    for entry, fold in zip(datalist["training"], given, strict=True):
        entry["image"] = str(demo_data / entry["image"])
        entry["label"] = str(demo_data / entry["label"])
        entry["fold"] = fold
    path = _write_json(tmp_path / "folded.json", {**datalist, "modality": "CT"})
    source = load_data_source(path, num_fold=5)
    assert source.folds_given
    assert [entry["fold"] for entry in source.training] == given
    assert source.num_fold == 4
    assert source.modality == "CT"


def test_some_folds_missing_means_all_are_assigned(demo_data_copy: Path, caplog: pytest.LogCaptureFixture) -> None:
    datalist = json.loads((demo_data_copy / "datalist.json").read_text())
    datalist["training"][0]["fold"] = 4
    path = _write_json(demo_data_copy / "partial.json", {**datalist, "modality": "MRI"})
    with caplog.at_level(logging.WARNING, logger="autotune.data.datalist"):
        source = load_data_source(path, num_fold=2)
    assert not source.folds_given
    assert [entry["fold"] for entry in source.training] == assign_folds(6, 2)
    assert "only some" in caplog.text


def test_relative_and_absolute_paths(demo_data: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    datalist = {
        "modality": "MRI",
        "training": [
            {"image": str(demo_data / "imagesTr" / "case_000.nii.gz"), "label": "labelsTr/case_000.nii.gz"},
            {"image": "./imagesTr/sub/../case_001.nii.gz", "label": "labelsTr/case_001.nii.gz"},
        ],
        "testing": ["imagesTr/case_002.nii.gz", {"image": str(outside / "t.nii.gz")}],
    }
    listed = _write_json(tmp_path / "mixed_paths.json", datalist)
    source = load_data_source(listed, num_fold=2)
    assert source.dataroot == tmp_path
    config = tmp_path / "input.yaml"
    config.write_text(yaml.safe_dump({"modality": "mr", "datalist": str(listed),
                                      "dataroot": str(demo_data)}))
    source = load_data_source(config, num_fold=2)
    assert source.modality == "MRI"
    assert source.dataroot == demo_data
    assert source.training[0]["image"] == str(demo_data / "imagesTr" / "case_000.nii.gz")
    assert source.training[0]["label"] == str(demo_data / "labelsTr" / "case_000.nii.gz")
    assert source.training[1]["image"] == str(demo_data / "imagesTr" / "case_001.nii.gz")
    assert source.testing == [{"image": str(demo_data / "imagesTr" / "case_002.nii.gz")},
                              {"image": str(outside / "t.nii.gz")}]


def test_path_escaping_dataroot_is_refused(tmp_path: Path) -> None:
    datalist = {"modality": "MRI", "training": [{"image": "../x.nii.gz", "label": "labelsTr/case_000.nii.gz"}]}
    with pytest.raises(InputError, match=r"training\[0\]\.image '\.\./x\.nii\.gz' points outside dataroot"):
        load_data_source(_write_json(tmp_path / "escape.json", datalist), num_fold=1)


def test_multi_modal_image_lists(demo_data_copy: Path) -> None:
    datalist = json.loads((demo_data_copy / "datalist.json").read_text())
    for entry in datalist["training"]:
        entry["image"] = [entry["image"], entry["image"].replace("case_", "./case_")]
    path = _write_json(demo_data_copy / "two_channels.json", {**datalist, "modality": ["T1", "T2"]})
    source = load_data_source(path)
    assert source.num_channels == 2
    image = source.training[0]["image"]
    assert isinstance(image, list) and len(image) == 2
    assert image[0] == image[1] == str(demo_data_copy / "imagesTr" / "case_000.nii.gz")

    datalist["training"][3]["image"] = datalist["training"][3]["image"][:1]
    _write_json(path, {**datalist, "modality": "MRI"})
    with pytest.raises(InputError, match=r"training\[3\]\.image has 1 file\(s\) but training\[0\]\.image has 2"):
        load_data_source(path)


def test_written_datalist_and_config_round_trip(demo_data: Path, tmp_path: Path) -> None:
    source = load_data_source(demo_data, num_fold=3)
    datalist_path = write_datalist(source, tmp_path / "work" / "datalist.json")
    config_path = write_data_src_config(source, datalist_path, tmp_path / "work" / "data_src.yaml")
    written = json.loads(datalist_path.read_text())
    assert written["training"][0] == source.training[0]
    config = yaml.safe_load(config_path.read_text())
    assert config == {"name": "demo", "modality": "MRI", "datalist": str(datalist_path),
                      "dataroot": str(demo_data), "class_names": ["class1", "class2"], "sigmoid": False,
                      "labels": [0, 1, 2]}
    again = load_data_source(config_path)
    assert again.folds_given
    assert again.training == source.training
    assert (again.class_names, again.labels, again.name) == (source.class_names, source.labels, source.name)


def test_decathlon_testing_entries_are_strings(demo_data: Path, tmp_path: Path) -> None:
    folder = tmp_path / "Task99_Demo"
    folder.mkdir()
    dataset = json.loads((demo_data / "dataset.json").read_text())
    for entry in dataset["training"]:
        entry["image"] = str(demo_data / entry["image"])
        entry["label"] = str(demo_data / entry["label"])
    dataset["test"] = ["./imagesTs/a.nii.gz"]
    _write_json(folder / "dataset.json", dataset)
    source = load_data_source(folder)
    assert source.testing == [{"image": str(folder / "imagesTs" / "a.nii.gz")}]
    assert source.dataroot == folder
