"""The integrity pass of ``analyze``: data wrong in meaning, not only in form.

Refusals: exit code 2 and exactly one stderr line, no datastats.yaml. Warnings: the exact
line is logged, the exit code is 0 and datastats.yaml is written (it keeps the warnings).
Each case starts from a private copy of the demo dataset (6 cases, classes 1 and 2).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import yaml

from autotune.cli import main
from autotune.data.analyze import analyze
from autotune.data.classes import declared_classes
from autotune.data.datalist import load_data_source
from autotune.data.integrity import (
    MIN_CLASS_SHARE,
    SPACING_FACTOR,
    check_dataset,
    geometry_warnings,
)
from autotune.data.validate import CaseInfo
from autotune.errors import InputError

LOGGER = "autotune.data.integrity"
DUPLICATE_FIX = "remove the duplicate case, or it can land in training and validation at once and inflate validation Dice"


def _argv(input_path: Path, *extra: str) -> list[str]:
    work = input_path.parent / "work" if input_path.is_file() else input_path / "work"
    return ["analyze", "--input", str(input_path), "--work-dir", str(work), "--quiet", *extra]


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI, expect exit 2 and one line; return the line without the ``autotune analyze: error:`` prefix."""
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith("autotune analyze: error: "), err
    assert not (Path(argv[4]) / "datastats.yaml").exists()
    return err[len("autotune analyze: error: "):-1]


def _warned(argv: list[str], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> list[str]:
    """Run the CLI, expect exit 0 and a finished analysis; return the integrity warnings logged."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, (out, err)
    lines = [record.getMessage() for record in caplog.records if record.name.startswith("autotune.data")]
    stats = yaml.safe_load((Path(argv[4]) / "datastats.yaml").read_text())
    assert stats["stats_summary"]["n_cases"] == 6  # the analysis finished
    assert stats["autotune"]["warnings"] == lines
    assert f"warnings:  {len(lines)}" in out
    assert all("\n" not in line for line in lines)
    return lines


def _edit_datalist(root: Path, change: object) -> None:
    path = root / "datalist.json"
    datalist = json.loads(path.read_text())
    change(datalist)  # type: ignore[operator]
    path.write_text(json.dumps(datalist))


def _label(root: Path, index: int) -> Path:
    return root / "labelsTr" / f"case_{index:03d}.nii.gz"


def _image(root: Path, index: int) -> Path:
    return root / "imagesTr" / f"case_{index:03d}.nii.gz"


def _load(path: Path) -> np.ndarray:
    return np.asanyarray(nib.load(str(path)).dataobj).copy()


def _save(path: Path, data: np.ndarray, affine: np.ndarray | None = None) -> None:
    nib.save(nib.Nifti1Image(data, nib.load(str(path)).affine if affine is None else affine), str(path))


def _no_class_names(root: Path) -> Path:
    (root / "input.yaml").write_text("modality: MRI\ndatalist: datalist.json\ndataroot: .\n")
    return root / "input.yaml"


# --- refusals -----------------------------------------------------------------------------------------------


def test_same_case_listed_twice_is_refused(demo_data_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = demo_data_copy
    _edit_datalist(root, lambda d: d["training"].__setitem__(3, dict(d["training"][0])))
    line = _refused(_argv(root / "input.yaml"), capsys)
    assert line == (f"{root}/datalist.json: training[0].image and training[3].image are the same file "
                    f"{_image(root, 0)}; {DUPLICATE_FIX}")


def test_duplicate_under_another_spelling_is_refused(demo_data_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = demo_data_copy
    (root / "alias.nii.gz").symlink_to(_label(root, 1))
    _edit_datalist(root, lambda d: d["training"][4].update(label="alias.nii.gz"))
    line = _refused(_argv(root / "input.yaml"), capsys)
    assert line == (f"{root}/datalist.json: training[1].label and training[4].label are the same file "
                    f"{_label(root, 1)} (training[4] spells it {root}/alias.nii.gz); {DUPLICATE_FIX}")


def test_hard_linked_copy_in_a_decathlon_folder_is_refused(demo_data_copy: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    root = demo_data_copy
    os.link(_image(root, 2), root / "imagesTr" / "copy.nii.gz")
    dataset = json.loads((root / "dataset.json").read_text())
    dataset["training"][5]["image"] = "./imagesTr/copy.nii.gz"
    (root / "dataset.json").write_text(json.dumps(dataset))
    line = _refused(_argv(root), capsys)
    assert line == (f"{root}/dataset.json: training[2].image and training[5].image are the same file "
                    f"{_image(root, 2)} (training[5] spells it {root}/imagesTr/copy.nii.gz); {DUPLICATE_FIX}")


def test_value_class_names_do_not_name_is_refused(demo_data_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = demo_data_copy
    label = _load(_label(root, 2))
    label[0, 0, 0] = 7
    _save(_label(root, 2), label)
    line = _refused(_argv(root / "input.yaml"), capsys)
    assert line == (f"{_label(root, 2)}: label holds the value 7, which class_names in {root}/input.yaml does not name "
                    "(2 class(es): label values 0-2); fix the label, or give class_names one name per foreground value")


def test_class_names_naming_fewer_classes_than_the_labels_hold(demo_data_copy: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    root = demo_data_copy
    config = yaml.safe_load((root / "input.yaml").read_text())
    config["class_names"] = ["class1"]
    (root / "input.yaml").write_text(yaml.safe_dump(config))
    line = _refused(_argv(root / "input.yaml"), capsys)
    assert line == (f"{_label(root, 0)}: label holds the value 2, which class_names in {root}/input.yaml does not name "
                    "(1 class(es): label values 0-1); fix the label, or give class_names one name per foreground value")


def test_value_between_declared_labels_is_refused(demo_data_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Not only values above the largest: labels {0, 1, 3} refuse a 2.
    root = demo_data_copy
    dataset = json.loads((root / "dataset.json").read_text())
    dataset["labels"] = {"0": "background", "1": "class1", "3": "class3"}
    (root / "dataset.json").write_text(json.dumps(dataset))
    line = _refused(_argv(root), capsys)
    assert line == (f"{_label(root, 0)}: label holds the value 2, which is not among the labels [0, 1, 3] declared in "
                    f"{root}/dataset.json; fix the label, or add the value to 'labels' in dataset.json")


def test_labels_and_class_names_that_disagree_are_refused(demo_data_copy: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    root = demo_data_copy
    (root / "input.yaml").write_text("modality: MRI\ndatalist: datalist.json\nlabels: [0, 1, 2]\n"
                                     "class_names: [liver]\n")
    line = _refused(_argv(root / "input.yaml"), capsys)
    assert line == (f"{root}/input.yaml: class_names names 1 class(es) but labels declares 2 foreground value(s) "
                    "[1, 2]; give one class name per foreground label value")


def test_every_label_empty_is_refused(demo_data_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = demo_data_copy
    for index in range(6):
        _save(_label(root, index), np.zeros_like(_load(_label(root, index))))
    line = _refused(_argv(root / "input.yaml"), capsys)
    assert line == (f"{root}/datalist.json: all 6 labels are empty (only background 0, e.g. {_label(root, 0)}); "
                    "point each 'label' at its segmentation mask: with no foreground there is nothing to learn")


def test_some_empty_labels_pass(demo_data_copy: Path, capsys: pytest.CaptureFixture[str],
                                caplog: pytest.LogCaptureFixture) -> None:
    # Cases without foreground are real (healthy scans); only "all empty" is refused.
    root = demo_data_copy
    _save(_label(root, 3), np.zeros_like(_load(_label(root, 3))))
    assert _warned(_argv(root / "input.yaml"), capsys, caplog) == []


# --- warnings -----------------------------------------------------------------------------------------------


def test_declared_class_in_no_label_warns(demo_data_copy: Path, capsys: pytest.CaptureFixture[str],
                                          caplog: pytest.LogCaptureFixture) -> None:
    root = demo_data_copy
    for index in range(6):
        label = _load(_label(root, index))
        label[label == 2] = 1
        _save(_label(root, index), label)
    assert _warned(_argv(root / "input.yaml"), capsys, caplog) == [
        f"{root}/input.yaml: declared class(es) 2 (class2) are in none of the 6 labels; the network still gets an "
        "output channel for each: remove them from the declaration or check the labels"]


def test_class_in_few_cases_warns(demo_data_copy: Path, capsys: pytest.CaptureFixture[str],
                                  caplog: pytest.LogCaptureFixture) -> None:
    root = demo_data_copy
    assert 2 in _load(_label(root, 0))
    for index in range(1, 6):
        label = _load(_label(root, index))
        label[label == 2] = 1
        _save(_label(root, index), label)
    assert 1 / 6 < MIN_CLASS_SHARE
    assert _warned(_argv(root), capsys, caplog) == [
        f"{_label(root, 0)}: class 2 (class2) is in only 1 of 6 labels (17%, under 20%); some validation folds may "
        "hold none of it and its Dice will be noisy: add cases that hold it or merge it"]


def test_stray_value_without_declared_classes_warns(demo_data_copy: Path, capsys: pytest.CaptureFixture[str],
                                                    caplog: pytest.LogCaptureFixture) -> None:
    root = demo_data_copy
    label = _load(_label(root, 2))
    label[0, 0, 0] = 7
    _save(_label(root, 2), label)
    argv = _argv(_no_class_names(root))
    assert _warned(argv, capsys, caplog) == [  # one line: no "3-6 absent" or "7 is rare" on top
        f"{_label(root, 2)}: label value 7 is in this label only, while the other 5 labels together hold 0-2; it makes "
        "the network 8 classes wide: fix this label, or declare the classes (labels or class_names) so that analyze "
        "refuses such values"]
    stats = yaml.safe_load((root / "work" / "datastats.yaml").read_text())
    assert stats["stats_summary"]["label_stats"]["labels"] == [0, 1, 2, 7]
    # The skipped second run says it again, from datastats.yaml.
    assert _warned(argv, capsys, caplog) == stats["autotune"]["warnings"]


def test_gap_in_undeclared_values_warns(demo_data_copy: Path, capsys: pytest.CaptureFixture[str],
                                        caplog: pytest.LogCaptureFixture) -> None:
    root = demo_data_copy
    for index in range(6):
        label = _load(_label(root, index))
        label[label == 2] = 3
        _save(_label(root, index), label)
    assert _warned(_argv(_no_class_names(root)), capsys, caplog) == [
        f"{root}/datalist.json: label value(s) 2 are in none of the 6 labels, yet values go up to 3; the network "
        "still gets an output channel for each: renumber the labels 0, 1, 2, ... without gaps"]


def test_odd_orientation_warns(demo_data_copy: Path, capsys: pytest.CaptureFixture[str],
                               caplog: pytest.LogCaptureFixture) -> None:
    root = demo_data_copy
    flipped = np.diag([-1.0, -1.0, 1.0, 1.0])
    for path in (_image(root, 4), _label(root, 4)):
        _save(path, _load(path), flipped)
    assert _warned(_argv(root / "input.yaml"), capsys, caplog) == [
        f"{_image(root, 4)}: orientation LPS differs from RAS, which 5 of 6 images have (1 image(s) differ); training "
        "reorients to RAS, but a different export can hide a label that does not match its image: check these in a "
        "viewer"]


def test_spacing_far_from_the_median_warns(demo_data_copy: Path, capsys: pytest.CaptureFixture[str],
                                           caplog: pytest.LogCaptureFixture) -> None:
    root = demo_data_copy
    for index, factor in ((1, 4.0), (3, 2.5)):  # 2.5x is within SPACING_FACTOR: no line for case 3
        for path in (_image(root, index), _label(root, index)):
            _save(path, _load(path), np.diag([factor, 1.0, 1.0, 1.0]))
    assert 2.5 < SPACING_FACTOR < 4.0
    assert _warned(_argv(root / "input.yaml"), capsys, caplog) == [
        f"{_image(root, 1)}: spacing 4x1x1 mm is 4x off the median 1x1x1 mm (over 3x; 1 of 6 image(s) are); training "
        "resamples every case to the median spacing: check the voxel size in these headers"]


def test_warnings_reach_stderr_one_line_each_from_the_command_line(demo_data_copy: Path) -> None:
    root = demo_data_copy
    for index in range(6):
        label = _load(_label(root, index))
        label[label == 2] = 1
        _save(_label(root, index), label)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    run = subprocess.run([sys.executable, "-m", "autotune", *_argv(root / "input.yaml")], capture_output=True,
                         text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines() == [
        f"WARNING {LOGGER}: {root}/input.yaml: declared class(es) 2 (class2) are in none of the 6 labels; the network "
        "still gets an output channel for each: remove them from the declaration or check the labels",
        f"created the work folder {root / 'work'}"]  # said even with --quiet: a folder made for the user
    assert (root / "work" / "datastats.yaml").is_file()


# --- the rules on their own (no files) ----------------------------------------------------------------------


def _case(index: int, values: tuple[int, ...], orientation: str = "RAS",
          spacing: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> CaseInfo:
    return CaseInfo(image=[f"/d/img{index}.nii.gz"], label=f"/d/lab{index}.nii.gz", shape=(8, 8, 8), spacing=spacing,
                    channels=1, label_values=values, orientation=orientation)


def _undeclared(tmp_path: Path, cases: int) -> object:
    datalist = {"modality": "CT", "training": [{"image": f"i{n}.nii.gz", "label": f"l{n}.nii.gz", "fold": 0}
                                               for n in range(cases)]}
    (tmp_path / "list.json").write_text(json.dumps(datalist))
    return load_data_source(tmp_path / "list.json")


def test_stray_rule(tmp_path: Path) -> None:
    source = _undeclared(tmp_path, 6)
    base = [_case(n, (0, 1, 2)) for n in range(4)]
    lines = check_dataset(source, [*base, _case(4, (0, 1, 2, 7)), _case(5, (0, 2, 9))])  # type: ignore[arg-type]
    assert [line.split(":")[0] for line in lines] == ["/d/lab4.nii.gz", "/d/lab5.nii.gz"]
    assert "makes the network 10 classes wide" in lines[0]
    # K + 1 in one case is a rare class, not a stray.
    lines = check_dataset(source, [*base, _case(4, (0, 1, 2, 3)), _case(5, (0, 1))])  # type: ignore[arg-type]
    assert len(lines) == 1 and lines[0].startswith("/d/lab4.nii.gz: class 3 is in only 1 of 6 labels")
    # Too few cases to call one value stray: the gap is reported instead.
    small = _undeclared(tmp_path, 2)
    lines = check_dataset(small, [_case(0, (0, 1)), _case(1, (0, 1, 4))])  # type: ignore[arg-type]
    assert len(lines) == 1 and "label value(s) 2, 3 are in none of the 2 labels" in lines[0]


def test_binary_masks_saved_as_255_warn_in_one_short_line(tmp_path: Path) -> None:
    lines = check_dataset(_undeclared(tmp_path, 4), [_case(n, (0, 255)) for n in range(4)])  # type: ignore[arg-type]
    assert lines == ["".join((f"{tmp_path}/list.json: label value(s) 1, 2, 3, 4, 5, 6, 7, 8, ... (254 in all) are in ",
                              "none of the 4 labels, yet values go up to 255; the network still gets an output ",
                              "channel for each: renumber the labels 0, 1, 2, ... without gaps"))]


def test_spacing_is_compared_in_ras_axis_order() -> None:
    ras = [_case(n, (0, 1), "RAS", (1.0, 1.0, 5.0)) for n in range(4)]
    assert geometry_warnings([*ras, _case(4, (0, 1), "SRA", (5.0, 1.0, 1.0))]) == [
        "/d/img4.nii.gz: orientation SRA differs from RAS, which 4 of 5 images have (1 image(s) differ); training "
        "reorients to RAS, but a different export can hide a label that does not match its image: check these in a "
        "viewer"]
    assert geometry_warnings([*ras, _case(4, (0, 1), "RAS", (5.0, 1.0, 1.0))])[0].startswith(
        "/d/img4.nii.gz: spacing 5x1x1 mm is 5x off the median 1x1x5 mm")
    assert geometry_warnings([*ras, _case(4, (0, 1), "R??", (1.0, 1.0, 5.0))])[0].startswith(
        "/d/img4.nii.gz: orientation R??")


def test_declared_classes(demo_data: Path, tmp_path: Path) -> None:
    folder = declared_classes(load_data_source(demo_data))
    assert folder is not None and folder.values == (0, 1, 2) and folder.names == {1: "class1", 2: "class2"}
    from_yaml = declared_classes(load_data_source(demo_data / "input.yaml"))
    assert from_yaml is not None and from_yaml.values == (0, 1, 2)
    datalist = json.loads((demo_data / "datalist.json").read_text())
    for extra, expected in (({"labels": [1, 2]}, (0, 1, 2)),  # background is always allowed
                            ({"sigmoid": True, "class_names": ["tc", "wt", "et"]}, None),  # regions, not values
                            ({}, None)):
        path = tmp_path / "list.json"
        path.write_text(json.dumps({**datalist, "modality": "MRI", **extra}))
        declared = declared_classes(load_data_source(path))
        assert (declared.values if declared else None) == expected
    path.write_text(json.dumps({**datalist, "modality": "MRI", "labels": [0, 1], "class_names": ["a", "b"]}))
    with pytest.raises(InputError, match=r"class_names names 2 class\(es\) but labels declares 1"):
        declared_classes(load_data_source(path))


def test_library_call_returns_the_warnings(demo_data_copy: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = demo_data_copy
    for path in (_image(root, 0), _label(root, 0)):
        _save(path, _load(path), np.diag([1.0, 1.0, 9.0, 1.0]))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        result = analyze(root / "input.yaml", root / "work", progress=False)
    assert len(result.warnings) == 1 and result.warnings[0].startswith(f"{_image(root, 0)}: spacing 1x1x9 mm is 9x")
    assert [record.getMessage() for record in caplog.records] == result.warnings
