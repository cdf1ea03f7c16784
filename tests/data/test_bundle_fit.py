"""A bundle against what it is given (``autotune.data.bundle_fit``): label values come from the analysis's per-case
record where the files are unchanged (no label read), else from the label itself; both refuse alike."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from config_fixtures import bundle_config

import autotune.data.bundle_fit as bundle_fit
from autotune.data.analyze import analyze
from autotune.errors import DataError


def _cases(data: Path) -> list[dict[str, str]]:
    return [{"image": str(data / "imagesTr" / f"case_{i:03d}.nii.gz"), "label": str(data / "labelsTr" / f"case_{i:03d}.nii.gz")}
            for i in range(6)]


def test_label_values_come_from_the_record_else_from_the_label(small_demo_data: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    data = Path(shutil.copytree(small_demo_data, tmp_path / "data"))
    stats = analyze(data, tmp_path / "work", num_fold=1, progress=False).datastats
    cfg = bundle_config(output_classes=3, roi_size=[16, 16, 16], datastats=str(stats))
    read: list[str] = []
    reader = bundle_fit._read_label_values
    monkeypatch.setattr(bundle_fit, "_read_label_values", lambda path: read.append(path) or reader(path))
    bundle_fit.check_cases_fit(cfg, _cases(data))  # labels 0-2 fit 3 classes
    assert read == [], "every label's values came from datastats_cache.json"
    with pytest.raises(DataError, match=r"the label holds the value 2 but the bundle's output_classes is 2 "
                                        r"\(label values 0-1\) \(the bundle config\)"):
        bundle_fit.check_cases_fit(cfg.with_values(output_classes=2), _cases(data))
    assert read == []
    touched = data / "labelsTr" / "case_000.nii.gz"
    touched.touch()  # changed since the analysis (its modification time): only its label is read
    bundle_fit.check_cases_fit(cfg, _cases(data))
    assert read == [str(touched)]
    read.clear()
    with pytest.raises(DataError, match=r"labelsTr/case_00\d.nii.gz: the label holds the value 2"):
        bundle_fit.check_cases_fit(cfg.with_values(output_classes=2, datastats=None), _cases(data))  # no record
    assert read and read[0] == str(touched)
