"""``analyze`` end to end on the demo data (and the Hippocampus subset when present), plus case checks."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import yaml

from autotune.cli import main
from autotune.data.analyze import analyze, content_hash
from autotune.data.datalist import load_data_source
from autotune.data.synthetic import make_demo_dataset
from autotune.data.validate import check_cases
from autotune.errors import DataError

PERCENTILES = ("percentile_00_5", "percentile_10_0", "percentile_90_0", "percentile_99_5")


def _hippocampus() -> Path | None:
    here = Path(__file__).resolve()
    for candidate in (Path("/work/shared/datasets/Task04_Hippocampus"),
                      here.parents[3] / "shared" / "datasets" / "Task04_Hippocampus"):
        if (candidate / "dataset.json").is_file():
            return candidate
    return None


def _rewrite(path: Path, data: np.ndarray, affine: np.ndarray | None = None) -> None:
    old = nib.load(str(path))
    nib.save(nib.Nifti1Image(data, old.affine if affine is None else affine), str(path))


def _assert_datastats(path: Path, n_cases: int) -> dict:
    stats = yaml.safe_load(path.read_text())
    summary = stats["stats_summary"]
    for key in ("shape", "spacing", "sizemm", "channels"):
        assert "percentile_99_5" in summary["image_stats"][key], key
    assert len(summary["image_stats"]["shape"]["percentile_99_5"]) == 3
    for key in PERCENTILES:
        assert isinstance(summary["image_foreground_stats"]["intensity"][key], float)
    assert summary["n_cases"] == n_cases
    assert stats["autotune"]["n_cases"] == n_cases
    assert len(stats["autotune"]["content_hash"]) == 64
    assert stats["autotune"]["analyzer"] == "monai.apps.auto3dseg.DataAnalyzer"
    return stats


def test_analyze_writes_datastats_datalist_and_config(demo_data: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    result = analyze(demo_data / "input.yaml", work, num_fold=3, progress=False)
    assert not result.skipped
    assert result.n_cases == 6
    assert result.datastats == work / "datastats.yaml"
    stats = _assert_datastats(result.datastats, 6)
    summary = stats["stats_summary"]
    assert summary["label_stats"]["labels"] == [0, 1, 2]
    assert summary["image_stats"]["spacing"]["percentile_99_5"] == [1.0, 1.0, 1.0]
    assert min(summary["image_stats"]["shape"]["min"]) >= 28
    assert stats["autotune"]["content_hash"] == result.content_hash
    assert result.content_hash == content_hash(load_data_source(demo_data / "input.yaml", num_fold=3))
    datalist = json.loads(result.datalist.read_text())
    assert sorted({entry["fold"] for entry in datalist["training"]}) == [0, 1, 2]
    assert all(Path(entry["image"]).is_absolute() for entry in datalist["training"])
    again = load_data_source(result.data_src)
    assert again.folds_given and again.class_names == ["class1", "class2"]
    assert (work / "datastats_by_case.json").is_file()
    assert (work / "datastats_cache.json").is_file()
    assert result.cases_read == 6


def test_second_run_is_skipped_force_redoes_and_other_folds_keep_the_statistics(demo_data: Path,
                                                                                 tmp_path: Path) -> None:
    work = tmp_path / "work"
    first = analyze(demo_data, work, num_fold=2, progress=False)
    created = yaml.safe_load(first.datastats.read_text())["autotune"]["created"]
    stamp = first.datastats.stat().st_mtime_ns
    second = analyze(demo_data, work, num_fold=2, progress=False)
    assert second.skipped and second.content_hash == first.content_hash and second.cases_read == 0
    assert first.datastats.stat().st_mtime_ns == stamp
    forced = analyze(demo_data, work, num_fold=2, force=True, progress=False)
    assert not forced.skipped and forced.content_hash == first.content_hash and forced.cases_read == 6
    assert yaml.safe_load(first.datastats.read_text())["autotune"]["created"] >= created
    stamp = first.datastats.stat().st_mtime_ns
    other_folds = analyze(demo_data, work, num_fold=3, progress=False)
    assert other_folds.skipped and other_folds.content_hash == first.content_hash
    assert first.datastats.stat().st_mtime_ns == stamp
    assert sorted({entry["fold"] for entry in json.loads(first.datalist.read_text())["training"]}) == [0, 1, 2]
    assert load_data_source(first.data_src).num_fold == 3


def test_changed_file_is_analysed_again(demo_data_copy: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    first = analyze(demo_data_copy / "input.yaml", work, progress=False)
    label_path = demo_data_copy / "labelsTr" / "case_002.nii.gz"
    label = np.asanyarray(nib.load(str(label_path)).dataobj).copy()
    label[:4] = 0
    _rewrite(label_path, label)
    stat = label_path.stat()
    os.utime(label_path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # coarse-mtime filesystems
    second = analyze(demo_data_copy / "input.yaml", work, progress=False)
    assert not second.skipped
    assert second.content_hash != first.content_hash
    assert yaml.safe_load(second.datastats.read_text())["autotune"]["content_hash"] == second.content_hash


def test_progress_goes_to_stderr_and_cli_prints_the_result(demo_data: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    work = tmp_path / "work"
    assert main(["analyze", "--input", str(demo_data / "input.yaml"), "--work-dir", str(work), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert err == f"created the work folder {work}\n"  # the one line --quiet keeps: a folder made for the user
    assert f"{work / 'datastats.yaml'} (written)" in out
    assert "cases:     6" in out
    assert main(["analyze", "--input", str(demo_data / "input.yaml"), "--work-dir", str(work)]) == 0
    out, err = capsys.readouterr()
    assert "(up to date)" in out and "up to date" in err
    analyze(demo_data / "input.yaml", work, force=True, progress=True)
    assert "analyzing 6 cases" in capsys.readouterr().err


def test_file_the_analyzer_cannot_load_is_named(demo_data_copy: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # Skip our own checks so that DataAnalyzer meets the bad file itself.
    # (The module is fetched by name: ``autotune.data.analyze`` as an attribute is the re-exported function.)
    module = importlib.import_module("autotune.data.analyze")
    monkeypatch.setattr(module, "check_cases", lambda source, progress=True, known=None: [])
    bad = demo_data_copy / "imagesTr" / "case_001.nii.gz"
    bad.write_bytes(b"not a nifti file")
    with pytest.raises(DataError, match=r"DataAnalyzer failed .*case_001\.nii\.gz"):
        analyze(demo_data_copy / "input.yaml", tmp_path / "work", progress=False)


def test_cases_the_analyzer_skips_are_an_error(demo_data: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # DataAnalyzer logs a case whose statistics fail and goes on; the summary then has fewer cases.
    from monai.auto3dseg import SegSummarizer

    original = SegSummarizer.__call__

    def flaky(self: SegSummarizer, data: dict) -> dict:
        if "case_001" in str(data["image"].meta.get("filename_or_obj")):
            raise ValueError("simulated statistics failure")
        return original(self, data)

    monkeypatch.setattr(SegSummarizer, "__call__", flaky)
    with pytest.raises(DataError, match=r"could only process 5 of 6 cases .*case_001\.nii\.gz"):
        analyze(demo_data, tmp_path / "work", progress=False)


def test_analyzer_exception_becomes_a_data_error(demo_data: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from monai.apps.auto3dseg import DataAnalyzer

    def boom(self: object, *args: object, **kwargs: object) -> None:
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(DataAnalyzer, "get_all_case_stats", boom)
    with pytest.raises(DataError, match="DataAnalyzer failed .*simulated failure"):
        analyze(demo_data, tmp_path / "work", progress=False)


def test_check_cases_accepts_real_world_quirks(demo_data_copy: Path) -> None:
    """uint8 images, float32 labels holding integers, 4D channels-last images, varying shapes."""
    image_path = demo_data_copy / "imagesTr" / "case_000.nii.gz"
    image = np.asanyarray(nib.load(str(image_path)).dataobj)
    _rewrite(image_path, np.clip(image / 4, 0, 255).astype(np.uint8))
    label_path = demo_data_copy / "labelsTr" / "case_001.nii.gz"
    _rewrite(label_path, np.asanyarray(nib.load(str(label_path)).dataobj).astype(np.float32))
    infos = check_cases(load_data_source(demo_data_copy / "input.yaml"), progress=False)
    assert len(infos) == 6
    assert len({info.shape for info in infos}) > 1
    assert all(info.spacing == (1.0, 1.0, 1.0) and info.channels == 1 for info in infos)

    for index in range(6):  # two channels in one 4D file per case
        path = demo_data_copy / "imagesTr" / f"case_{index:03d}.nii.gz"
        data = np.asanyarray(nib.load(str(path)).dataobj).astype(np.float32)
        _rewrite(path, np.stack([data, data], axis=-1))
    infos = check_cases(load_data_source(demo_data_copy), progress=False)
    assert {info.channels for info in infos} == {2}


def test_demo_dataset_is_deterministic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = make_demo_dataset(tmp_path / "a", cases=2, size=16, classes=3, seed=5, modality="CT")
    assert main(["demo-data", str(tmp_path / "b"), "--cases", "2", "--size", "16", "--classes", "3",
                 "--seed", "5", "--modality", "ct"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "b" / "input.yaml")
    for name in ("imagesTr/case_001.nii.gz", "labelsTr/case_001.nii.gz"):
        a = np.asanyarray(nib.load(str(first / name)).dataobj)
        b = np.asanyarray(nib.load(str(tmp_path / "b" / name)).dataobj)
        assert np.array_equal(a, b)
    label = np.asanyarray(nib.load(str(first / "labelsTr/case_000.nii.gz")).dataobj)
    assert set(np.unique(label)) == {0, 1, 2, 3}
    assert all(12 <= n <= 20 for n in label.shape)
    assert load_data_source(tmp_path / "b" / "input.yaml", num_fold=2).modality == "CT"


def test_hippocampus_subset() -> None:
    folder = _hippocampus()
    if folder is None:
        pytest.skip("Task04_Hippocampus not found under /work/shared/datasets or ../shared/datasets")
    # Real-data quirks: uint8 images, float32 labels, shapes varying case to case.
    source = load_data_source(folder)
    infos = check_cases(source, progress=False)
    assert len(infos) == len(source.training) > 0
    assert len({info.shape for info in infos}) > 1


def test_hippocampus_analyze(tmp_path: Path) -> None:
    folder = _hippocampus()
    if folder is None:
        pytest.skip("Task04_Hippocampus not found under /work/shared/datasets or ../shared/datasets")
    result = analyze(folder, tmp_path / "work", progress=False)
    stats = _assert_datastats(result.datastats, result.n_cases)
    assert stats["stats_summary"]["label_stats"]["labels"] == [0, 1, 2]
    assert analyze(folder, tmp_path / "work", progress=False).skipped


def test_a_full_disk_names_the_files_written_whole(demo_data: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills at datastats.yaml, the last file: the refusal's "kept" lists the files written before it (each
    whole), not "nothing"."""
    from host_faults import FullDisk

    import autotune.files
    from autotune.errors import HostWriteError

    monkeypatch.setattr(autotune.files, "open", FullDisk("datastats.yaml").open, raising=False)
    with pytest.raises(HostWriteError) as refused:
        analyze(demo_data, tmp_path / "work", num_fold=1, progress=False)
    line = str(refused.value)
    assert "\n" not in line and "kept: nothing" not in line, line
    for name in ("datalist.json", "data_src.yaml", "datastats_by_case.json"):
        assert str(tmp_path / "work" / name) in line, line
        assert (tmp_path / "work" / name).is_file()
    assert "datastats.yaml not written" in line and not (tmp_path / "work" / "datastats.yaml").exists()
