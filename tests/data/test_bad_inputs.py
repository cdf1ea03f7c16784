"""A catalogue of bad inputs: each must give exit code 2 and one stderr line naming the culprit.

Every case starts from a private copy of the demo dataset, breaks one thing, and runs
``autotune analyze`` (or ``autotune demo-data``) through ``autotune.cli.main``.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from autotune.cli import main

Breaker = Callable[[Path], tuple[list[str], str]]


def _analyze(input_path: Path | str, *extra: str) -> list[str]:
    return ["analyze", "--input", str(input_path), "--work-dir", str(Path(input_path).parent / "work"), "--quiet",
            *extra]


def _edit_datalist(root: Path, change: Callable[[dict], object]) -> None:
    path = root / "datalist.json"
    datalist = json.loads(path.read_text())
    change(datalist)
    path.write_text(json.dumps(datalist))


def _nifti(path: Path) -> tuple[np.ndarray, np.ndarray]:
    image = nib.load(str(path))
    return np.asanyarray(image.dataobj), image.affine


def _save(path: Path, data: np.ndarray, affine: np.ndarray) -> None:
    nib.save(nib.Nifti1Image(data, affine), str(path))


def missing_input(root: Path) -> tuple[list[str], str]:
    return _analyze(root / "nope.yaml"), "nope.yaml"


def bad_yaml_syntax(root: Path) -> tuple[list[str], str]:
    (root / "input.yaml").write_text("modality: [CT\ndatalist: datalist.json\n")
    return _analyze(root / "input.yaml"), "input.yaml"


def yaml_top_level_list(root: Path) -> tuple[list[str], str]:
    (root / "input.yaml").write_text("- modality: CT\n- datalist: datalist.json\n")
    return _analyze(root / "input.yaml"), "input.yaml"


def unknown_modality(root: Path) -> tuple[list[str], str]:
    (root / "input.yaml").write_text("modality: PET\ndatalist: datalist.json\ndataroot: .\n")
    return _analyze(root / "input.yaml"), "'modality'"


def datalist_missing(root: Path) -> tuple[list[str], str]:
    (root / "input.yaml").write_text("modality: MRI\ndatalist: missing_list.json\ndataroot: .\n")
    return _analyze(root / "input.yaml"), "missing_list.json"


def dataroot_not_a_folder(root: Path) -> tuple[list[str], str]:
    (root / "input.yaml").write_text("modality: MRI\ndatalist: datalist.json\ndataroot: no_such_dir\n")
    return _analyze(root / "input.yaml"), "'dataroot'"


def bad_json(root: Path) -> tuple[list[str], str]:
    (root / "datalist.json").write_text('{"training": [{"image": "a.nii.gz",}')
    return _analyze(root / "input.yaml"), "datalist.json"


def empty_training(root: Path) -> tuple[list[str], str]:
    _edit_datalist(root, lambda d: d.update(training=[]))
    return _analyze(root / "input.yaml"), "'training' is empty"


def training_not_a_list(root: Path) -> tuple[list[str], str]:
    _edit_datalist(root, lambda d: d.update(training={"image": "imagesTr/case_000.nii.gz"}))
    return _analyze(root / "input.yaml"), "'training'"


def entry_without_label(root: Path) -> tuple[list[str], str]:
    _edit_datalist(root, lambda d: d["training"][2].pop("label"))
    return _analyze(root / "input.yaml"), "training[2] has no 'label'"


def negative_fold(root: Path) -> tuple[list[str], str]:
    def change(datalist: dict) -> None:
        for index, entry in enumerate(datalist["training"]):
            entry["fold"] = index % 2
        datalist["training"][4]["fold"] = -1

    _edit_datalist(root, change)
    return _analyze(root / "input.yaml"), "training[4].fold"


def path_escaping_dataroot(root: Path) -> tuple[list[str], str]:
    _edit_datalist(root, lambda d: d["training"][1].update(image="../../etc/x.nii.gz"))
    return _analyze(root / "input.yaml"), "training[1].image"


def folder_without_dataset_json(root: Path) -> tuple[list[str], str]:
    (root / "dataset.json").unlink()
    return _analyze(root), str(root)


def unknown_input_type(root: Path) -> tuple[list[str], str]:
    (root / "notes.txt").write_text("hello")
    return _analyze(root / "notes.txt"), "notes.txt"


def sigmoid_not_boolean(root: Path) -> tuple[list[str], str]:
    (root / "input.yaml").write_text("modality: MRI\ndatalist: datalist.json\nsigmoid: maybe\n")
    return _analyze(root / "input.yaml"), "'sigmoid'"


def missing_image_file(root: Path) -> tuple[list[str], str]:
    (root / "imagesTr" / "case_003.nii.gz").unlink()
    return _analyze(root / "input.yaml"), "imagesTr/case_003.nii.gz"


def corrupt_nifti(root: Path) -> tuple[list[str], str]:
    (root / "imagesTr" / "case_002.nii.gz").write_bytes(np.random.default_rng(0).bytes(4096))
    return _analyze(root / "input.yaml"), "imagesTr/case_002.nii.gz"


def corrupt_inside_gzip(root: Path) -> tuple[list[str], str]:
    (root / "labelsTr" / "case_001.nii.gz").write_bytes(gzip.compress(b"\x00" * 2000))
    return _analyze(root / "input.yaml"), "labelsTr/case_001.nii.gz"


def truncated_gzip(root: Path) -> tuple[list[str], str]:
    path = root / "imagesTr" / "case_004.nii.gz"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return _analyze(root / "input.yaml"), "imagesTr/case_004.nii.gz"


def shape_mismatch(root: Path) -> tuple[list[str], str]:
    path = root / "labelsTr" / "case_000.nii.gz"
    label, affine = _nifti(path)
    _save(path, label[:-2], affine)
    return _analyze(root / "input.yaml"), "labelsTr/case_000.nii.gz"


def affine_mismatch(root: Path) -> tuple[list[str], str]:
    path = root / "labelsTr" / "case_005.nii.gz"
    label, affine = _nifti(path)
    shifted = affine.copy()
    shifted[:3, 3] += 2.5
    _save(path, label, shifted)
    return _analyze(root / "input.yaml"), "labelsTr/case_005.nii.gz"


def non_integer_labels(root: Path) -> tuple[list[str], str]:
    path = root / "labelsTr" / "case_001.nii.gz"
    label, affine = _nifti(path)
    _save(path, label.astype(np.float32) * 0.5, affine)
    return _analyze(root / "input.yaml"), "labelsTr/case_001.nii.gz"


def image_2d(root: Path) -> tuple[list[str], str]:
    path = root / "imagesTr" / "case_003.nii.gz"
    image, affine = _nifti(path)
    _save(path, image[:, :, 0], affine)
    return _analyze(root / "input.yaml"), "imagesTr/case_003.nii.gz"


def label_beyond_declared_labels(root: Path) -> tuple[list[str], str]:
    path = root / "labelsTr" / "case_002.nii.gz"
    label, affine = _nifti(path)
    label[0, 0, 0] = 7
    _save(path, label, affine)
    return _analyze(root), "labelsTr/case_002.nii.gz"


def case_listed_twice(root: Path) -> tuple[list[str], str]:
    _edit_datalist(root, lambda d: d["training"].append(dict(d["training"][1])))
    return _analyze(root / "input.yaml"), "training[1].image and training[6].image are the same file"


def class_names_fewer_than_label_values(root: Path) -> tuple[list[str], str]:
    (root / "input.yaml").write_text("modality: MRI\ndatalist: datalist.json\nclass_names: [class1]\n")
    return _analyze(root / "input.yaml"), "labelsTr/case_000.nii.gz: label holds the value 2"


def all_labels_empty(root: Path) -> tuple[list[str], str]:
    for path in (root / "labelsTr").glob("case_*.nii.gz"):
        label, affine = _nifti(path)
        _save(path, np.zeros_like(label), affine)
    return _analyze(root / "input.yaml"), "all 6 labels are empty"


def num_fold_zero(root: Path) -> tuple[list[str], str]:
    return _analyze(root / "input.yaml", "--num-fold", "0"), "--num-fold"


def more_folds_than_cases(root: Path) -> tuple[list[str], str]:
    return _analyze(root / "input.yaml", "--num-fold", "9"), "9 folds"


def cases_zero(root: Path) -> tuple[list[str], str]:
    return ["demo-data", str(root / "new"), "--cases", "0"], "--cases"


def size_too_small(root: Path) -> tuple[list[str], str]:
    return ["demo-data", str(root / "new"), "--size", "8"], "--size"


def demo_unknown_modality(root: Path) -> tuple[list[str], str]:
    return ["demo-data", str(root / "new"), "--modality", "XRAY"], "--modality 'XRAY'"


def _patch_header(path: Path, offset: int, fmt: str, *values: float) -> None:
    """Write ``values`` into the NIfTI-1 header of a .nii.gz at ``offset`` (the voxel data stays as it is)."""
    import struct

    raw = bytearray(gzip.decompress(path.read_bytes()))
    struct.pack_into(fmt, raw, offset, *values)
    path.write_bytes(gzip.compress(bytes(raw)))


def zero_spacing_in_header(root: Path) -> tuple[list[str], str]:
    path = root / "imagesTr" / "case_004.nii.gz"
    _patch_header(path, 80, "<f", 0.0)  # pixdim[1]
    _patch_header(path, 280, "<f", 0.0)  # srow_x[0]: the sform's x voxel size
    return _analyze(root / "input.yaml"), "imagesTr/case_004.nii.gz: the header's voxel spacing is 0x"


def header_too_large_for_ram(root: Path) -> tuple[list[str], str]:
    path = root / "imagesTr" / "case_002.nii.gz"
    _patch_header(path, 42, "<3h", 30000, 30000, 30000)  # dim[1:4]; the data stays a few KiB
    return _analyze(root / "input.yaml"), "imagesTr/case_002.nii.gz: the header declares a 30000x30000x30000 grid"


def header_larger_than_its_file(root: Path) -> tuple[list[str], str]:
    path = root / "imagesTr" / "case_003.nii.gz"
    _patch_header(path, 42, "<3h", 512, 512, 512)  # well within RAM; far beyond what a few KiB can yield
    return _analyze(root / "input.yaml"), "imagesTr/case_003.nii.gz: the header declares a 512x512x512 grid"


BREAKERS: list[Breaker] = [
    missing_input, bad_yaml_syntax, yaml_top_level_list, unknown_modality, datalist_missing, dataroot_not_a_folder,
    bad_json, empty_training, training_not_a_list, entry_without_label, negative_fold, path_escaping_dataroot,
    folder_without_dataset_json, unknown_input_type, sigmoid_not_boolean, missing_image_file, corrupt_nifti,
    corrupt_inside_gzip, truncated_gzip, shape_mismatch, affine_mismatch, non_integer_labels, image_2d,
    label_beyond_declared_labels, case_listed_twice, class_names_fewer_than_label_values, all_labels_empty,
    num_fold_zero, more_folds_than_cases, cases_zero, size_too_small,
    demo_unknown_modality, zero_spacing_in_header, header_too_large_for_ram, header_larger_than_its_file,
]


@pytest.mark.parametrize("breaker", BREAKERS, ids=[breaker.__name__ for breaker in BREAKERS])
def test_bad_input_gives_one_line_naming_the_culprit(breaker: Breaker, demo_data_copy: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    argv, culprit = breaker(demo_data_copy)
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert err.startswith(f"autotune {argv[0]}: error: "), err
    assert culprit in err, err
    assert not (demo_data_copy / "work" / "datastats.yaml").exists()
