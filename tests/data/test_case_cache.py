"""Work not done twice: other folds keep the statistics, new cases are the only ones read, a changed file
re-analyses its case, and the summary always equals MONAI's DataAnalyzer over all cases."""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest
import yaml

from autotune.data import monai_stats, validate
from autotune.data.analyze import analyze
from autotune.data.case_cache import CASE_CACHE
from autotune.data.datalist import load_data_source
from autotune.utils import plain_data


@pytest.fixture()
def reads(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Records each DataAnalyzer run (the label files it is given) and each case the checks read."""
    from monai.apps.auto3dseg import DataAnalyzer

    seen: dict[str, list[Any]] = {"analyzer": [], "checked": []}
    run_analyzer = DataAnalyzer.get_all_case_stats
    check_case: Callable[..., Any] = validate.check_case

    def counting_analyzer(self: DataAnalyzer, *args: Any, **kwargs: Any) -> Any:
        seen["analyzer"].append([Path(entry["label"]).name for entry in self.datalist["training"]])
        return run_analyzer(self, *args, **kwargs)

    def counting_check(entry: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        seen["checked"].append(Path(entry["label"]).name)
        return check_case(entry, *args, **kwargs)

    monkeypatch.setattr(DataAnalyzer, "get_all_case_stats", counting_analyzer)
    monkeypatch.setattr(validate, "check_case", counting_check)
    return seen


def _list_cases(dataset: Path, count: int) -> None:
    """Point the demo's datalist.json at its first ``count`` cases."""
    cases = [{"image": f"imagesTr/case_{index:03d}.nii.gz", "label": f"labelsTr/case_{index:03d}.nii.gz"}
             for index in range(count)]
    (dataset / "datalist.json").write_text(json.dumps({"training": cases, "testing": []}))


def _stats(work: Path) -> dict[str, Any]:
    return yaml.safe_load((work / "datastats.yaml").read_text())


def _monai_summary(dataset: Path) -> dict[str, Any]:
    """``stats_summary`` as MONAI's DataAnalyzer computes it over every case, from scratch."""
    from monai.apps.auto3dseg import DataAnalyzer

    datalist = load_data_source(dataset / "input.yaml", num_fold=1).as_datalist()
    # One torch thread, as autotune's analysis runs it: a float32 mean over a case's voxels rounds
    # differently with another thread count (about 1e-8 relative), whoever computes it.
    with warnings.catch_warnings(), monai_stats._torch_threads(1):
        warnings.simplefilter("ignore")
        raw = DataAnalyzer(datalist, "", output_path="", device="cpu", worker=0).get_all_case_stats()
    return plain_data(raw["stats_summary"], str_keys=True, str_other=True)


def test_generate_with_other_folds_does_not_analyse_again(demo_data: Path, tmp_path: Path,
                                                           reads: dict[str, list[Any]]) -> None:
    from autotune.pipeline import generate

    work = tmp_path / "work"
    analyze(demo_data / "input.yaml", work, progress=False)  # 5 folds, as `autotune analyze` by default
    assert len(reads["analyzer"]) == 1 and len(reads["checked"]) == 6
    stats = (work / "datastats.yaml").read_bytes()
    bundles = generate(demo_data / "input.yaml", work, algos="segresnet", num_fold=1, overrides="tiny",
                       progress=False)
    assert len(reads["analyzer"]) == 1 and len(reads["checked"]) == 6  # nothing read again
    assert (work / "datastats.yaml").read_bytes() == stats
    assert [bundle["identifier"] for bundle in bundles] == ["segresnet_0"]
    assert {entry["fold"] for entry in json.loads((work / "datalist.json").read_text())["training"]} == {0}


def test_added_cases_are_the_only_ones_read_and_the_summary_is_monais(demo_data_copy: Path, tmp_path: Path,
                                                                       reads: dict[str, list[Any]]) -> None:
    work = tmp_path / "work"
    _list_cases(demo_data_copy, 4)
    first = analyze(demo_data_copy / "input.yaml", work, num_fold=2, progress=False)
    assert first.cases_read == 4 and _stats(work)["stats_summary"]["n_cases"] == 4
    _list_cases(demo_data_copy, 6)
    reads["analyzer"].clear()
    reads["checked"].clear()
    grown = analyze(demo_data_copy / "input.yaml", work, num_fold=2, progress=False)
    assert not grown.skipped and grown.cases_read == 2
    assert reads["analyzer"] == [["case_004.nii.gz", "case_005.nii.gz"]]
    assert reads["checked"] == ["case_004.nii.gz", "case_005.nii.gz"]

    scratch = analyze(demo_data_copy / "input.yaml", tmp_path / "scratch", num_fold=2, progress=False)
    assert scratch.cases_read == 6
    assert _stats(work)["stats_summary"] == _stats(tmp_path / "scratch")["stats_summary"]
    assert _stats(work)["stats_summary"] == _monai_summary(demo_data_copy)
    assert (json.loads((work / "datastats_by_case.json").read_text())
            == json.loads((tmp_path / "scratch" / "datastats_by_case.json").read_text()))


def test_a_changed_image_re_analyses_its_case(demo_data_copy: Path, tmp_path: Path,
                                              reads: dict[str, list[Any]]) -> None:
    work = tmp_path / "work"
    analyze(demo_data_copy / "input.yaml", work, progress=False)
    before = _stats(work)["stats_summary"]
    path = demo_data_copy / "imagesTr" / "case_003.nii.gz"
    old = nib.load(str(path))
    nib.save(nib.Nifti1Image(np.asanyarray(old.dataobj) * 2.0, old.affine), str(path))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # coarse-mtime filesystems
    reads["analyzer"].clear()
    reads["checked"].clear()
    again = analyze(demo_data_copy / "input.yaml", work, progress=False)
    assert again.cases_read == 1
    assert reads["analyzer"] == [["case_003.nii.gz"]] and reads["checked"] == ["case_003.nii.gz"]
    after = _stats(work)["stats_summary"]
    assert after != before
    assert after == _monai_summary(demo_data_copy)


def test_same_bytes_under_a_new_mtime_are_not_analysed_again(demo_data_copy: Path, tmp_path: Path,
                                                             reads: dict[str, list[Any]]) -> None:
    work = tmp_path / "work"
    analyze(demo_data_copy / "input.yaml", work, progress=False)
    for path in (demo_data_copy / "labelsTr").iterdir():  # touched, e.g. by a copy: stamps differ, bytes do not
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    again = analyze(demo_data_copy / "input.yaml", work, progress=False)
    assert not again.skipped and again.cases_read == 0 and len(reads["analyzer"]) == 1


def test_another_monai_version_or_a_broken_cache_analyses_everything(demo_data: Path, tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    work = tmp_path / "work"
    analyze(demo_data / "input.yaml", work, progress=False)
    cache = work / CASE_CACHE
    data = json.loads(cache.read_text())
    data["settings"]["monai"] = "0.0.0"
    cache.write_text(json.dumps(data))
    assert analyze(demo_data / "input.yaml", work, force=False, progress=False).skipped  # datastats up to date
    (work / "datastats.yaml").unlink()
    assert analyze(demo_data / "input.yaml", work, progress=False).cases_read == 6
    (work / "datastats.yaml").unlink()
    assert analyze(demo_data / "input.yaml", work, progress=False).cases_read == 0
    cache.write_text("{ not json")
    (work / "datastats.yaml").unlink()
    with caplog.at_level(logging.WARNING, logger="autotune.data.case_cache"):
        assert analyze(demo_data / "input.yaml", work, progress=False).cases_read == 6
    assert any(CASE_CACHE in record.getMessage() for record in caplog.records)
    assert json.loads(cache.read_text())["cases"]


def test_a_changed_declaration_rewrites_data_src_and_reads_no_image(demo_data_copy: Path, tmp_path: Path,
                                                                   reads: dict[str, list[Any]]) -> None:
    work = tmp_path / "work"
    analyze(demo_data_copy / "input.yaml", work, progress=False)
    config = yaml.safe_load((demo_data_copy / "input.yaml").read_text())
    config["class_names"] = ["liver", "tumour"]
    (demo_data_copy / "input.yaml").write_text(yaml.safe_dump(config))
    again = analyze(demo_data_copy / "input.yaml", work, progress=False)
    assert not again.skipped and again.cases_read == 0 and len(reads["analyzer"]) == 1
    assert yaml.safe_load((work / "data_src.yaml").read_text())["class_names"] == ["liver", "tumour"]


def test_cached_label_values_are_still_held_against_the_declared_classes(demo_data_copy: Path,
                                                                         tmp_path: Path) -> None:
    from autotune.errors import DataError

    work = tmp_path / "work"
    analyze(demo_data_copy / "input.yaml", work, progress=False)
    config = yaml.safe_load((demo_data_copy / "input.yaml").read_text())
    config["class_names"] = ["class1"]  # declares 0-1; every label holds 2
    (demo_data_copy / "input.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(DataError, match=r"case_000\.nii\.gz: label holds the value 2"):
        analyze(demo_data_copy / "input.yaml", work, progress=False)
