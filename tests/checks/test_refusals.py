"""The hostile inputs named in the issue, each one line and exit code 2 from the command that meets it:
non-finite voxels at ``analyze``, a NaN learning rate at ``train``, ``estimate``, ``tune`` and ``verify``, a
file of nested aliases in under a second, out-of-range options; and the last line of defence, exit 70."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from cli_harness import alias_bomb, assert_refused_cleanly, inside, run_cli, snapshot

from autotune.bundles.config import CONFIG_RELPATH

CASE = Path("imagesTr") / "case_001.nii.gz"


def _bundle_with(good_work: Path, tmp_path: Path, old: str, new: str) -> Path:
    """A private copy of the good bundle whose config has ``old`` replaced by ``new``."""
    bundle = Path(shutil.copytree(good_work / "unet_0", tmp_path / "work" / "unet_0"))
    config = bundle / CONFIG_RELPATH
    text = config.read_text()
    assert old in text
    config.write_text(text.replace(old, new))
    return bundle


def _image(root: Path, change: object) -> Path:
    """Rewrite the demo case's image as float32 after ``change(data)``; returns the file."""
    path = root / CASE
    image = nib.load(str(path))
    data = np.asanyarray(image.dataobj).astype(np.float32)
    data = change(data)  # type: ignore[operator]
    nib.save(nib.Nifti1Image(data, image.affine), str(path))
    return path


def _nan_slab(data: np.ndarray) -> np.ndarray:
    data[:, :, :2] = np.nan
    data[0, 0, 5], data[1, 1, 6] = np.inf, -np.inf
    return data


@pytest.mark.parametrize(("change", "needle"), [
    pytest.param(_nan_slab, "non-finite voxel", id="nan-and-inf"),
    pytest.param(lambda d: np.full_like(d, 7.0), "the one value 7 in every voxel", id="blank"),
    pytest.param(lambda d: (d / d.max() * 3e38).astype(np.float32), "statistics of this case are not finite",
                 id="overflowing-statistics"),
    pytest.param(lambda d: d.astype(np.complex64), "not real numbers", id="complex"),
])
def test_analyze_refuses_images_it_cannot_train_on(change: object, needle: str, demo_data_copy: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = _image(demo_data_copy, change)
    work = demo_data_copy / "work"
    argv = ["analyze", "--input", str(demo_data_copy / "input.yaml"), "--work-dir", str(work), "--quiet"]
    outcome = run_cli(argv, capsys)
    assert_refused_cleanly(outcome, argv)
    assert str(path) in outcome.err and needle in outcome.err, outcome.err
    assert not (work / "datastats.yaml").exists()


def test_non_finite_voxels_are_counted(demo_data_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = np.asanyarray(nib.load(str(demo_data_copy / CASE)).dataobj)
    expected = data.shape[0] * data.shape[1] * 2 + 2  # the slab, and the two infinite voxels outside it
    _image(demo_data_copy, _nan_slab)
    argv = ["analyze", "--input", str(demo_data_copy / "input.yaml"), "--work-dir", str(demo_data_copy / "w"), "-q"]
    outcome = run_cli(argv, capsys)
    assert f"holds {expected} non-finite voxel(s) (NaN or infinite) of {data.size}" in outcome.err, outcome.err


@pytest.mark.parametrize("command", ["train", "estimate", "tune", "verify"])
@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_non_finite_learning_rate_is_refused(command: str, value: str, good_work: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    bundle = _bundle_with(good_work, tmp_path, "learning_rate: 0.05", f"learning_rate: {value}")
    argv = [command, str(bundle), "--device", "cpu"]
    before = snapshot(bundle)
    with inside(tmp_path / "work"):
        outcome = run_cli(argv, capsys)
    assert_refused_cleanly(outcome, argv)
    assert "key 'learning_rate'" in outcome.err and "must be a finite number above 0" in outcome.err, outcome.err
    assert str(bundle / CONFIG_RELPATH) in outcome.err
    assert snapshot(bundle) == before, "nothing trained, tuned or written"
    assert not (tmp_path / "work" / "studies").exists(), "no storage opened for a bundle that cannot load"


def test_nan_elsewhere_in_a_bundle_config_is_refused(good_work: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    bundle = _bundle_with(good_work, tmp_path, "weight_decay: 3.0e-05", "weight_decay: .nan")
    outcome = run_cli(["estimate", str(bundle), "--device", "cpu"], capsys)
    assert outcome.code == 2 and "key 'optimizer.args.weight_decay': got nan" in outcome.err, outcome.err


def _timed(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[float, object]:
    start = time.perf_counter()
    outcome = run_cli(argv, capsys)
    return time.perf_counter() - start, outcome


def test_alias_bomb_in_a_bundle_config_is_refused_in_under_a_second(good_work: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import autotune.probe.report  # noqa: F401 - the command's imports (torch) are not the refusal's time

    bundle = _bundle_with(good_work, tmp_path, "seed: 0\n", "seed: 0\n" + alias_bomb())
    assert 1500 < (bundle / CONFIG_RELPATH).stat().st_size < 4096, "a file of about 2 KB"
    argv = ["estimate", str(bundle), "--device", "cpu"]
    seconds, outcome = _timed(argv, capsys)
    assert_refused_cleanly(outcome, argv)  # type: ignore[arg-type]
    assert seconds < 1.0, seconds
    assert str(bundle / CONFIG_RELPATH) in outcome.err and "limit of 200000 values" in outcome.err  # type: ignore[attr-defined]


@pytest.mark.parametrize("text", [alias_bomb(), "unet: &loop [*loop]\n"], ids=["nested-aliases", "self-alias"])
def test_alias_overrides_are_refused_in_under_a_second(text: str, good_work: Path, demo_data: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text(text)
    work = Path(shutil.copytree(good_work, tmp_path / "work"))
    before = snapshot(work)
    argv = ["generate", "--input", str(demo_data / "input.yaml"), "--work-dir", str(work), "--algos", "unet",
            "--num-fold", "1", "--overrides", str(overrides), "-q"]
    seconds, outcome = _timed(argv, capsys)
    assert_refused_cleanly(outcome, argv)  # type: ignore[arg-type]
    assert seconds < 1.0, seconds
    assert str(overrides) in outcome.err and "refused" in outcome.err  # type: ignore[attr-defined]
    assert snapshot(work) == before


@pytest.mark.parametrize(("argv", "needle"), [
    (["dashboard", "--port", "70000"], "argument --port: got '70000'; must be a whole number from 1 to 65535"),
    (["dashboard", "--port", "-1"], "argument --port: got '-1'"),
    (["dashboard", "--port", "0"], "argument --port: got '0'"),
    (["dashboard", "--host", "no-such-host.invalid"], "argument --host: got 'no-such-host.invalid'; cannot be resolved"),
    (["dashboard", "--storage", "nosuchdialect://x"], "argument --storage"),
    (["estimate", "b", "--memory-limit", "9" * 400], "argument --memory-limit"),
    (["probe", "b", "--timeout", "nan"], "argument --timeout: got 'nan'; must be a finite number of seconds"),
    (["tune", "b", "--margin", "inf"], "argument --margin: got 'inf'"),
    (["train", "b", "--max-time", "9" * 60], "argument --max-time"),
    (["train", "b", "--device", "cuda:x"], "argument --device: got 'cuda:x'"),
    (["demo-data", "out", "--size", "100000"], "argument --size: got '100000'; must be a whole number from 16 to 512"),
    (["run", "--input", "i", "--work-dir", "w", "--folds", "0,x"], "argument --folds: got 'x'"),
])
def test_option_values_out_of_range(argv: list[str], needle: str, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    with inside(tmp_path):
        outcome = run_cli(argv, capsys)
    assert_refused_cleanly(outcome, argv)
    assert needle in outcome.err, outcome.err
    assert list(tmp_path.iterdir()) == [], "nothing written"


def test_dashboard_that_cannot_listen_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import optuna_dashboard

    def taken(*_args: object, **_kwargs: object) -> None:
        raise OSError(98, "Address already in use")

    from autotune.search.storage.study import open_storage

    monkeypatch.setattr(optuna_dashboard, "run_server", taken)
    open_storage(f"sqlite:///{tmp_path / 's.db'}")  # a storage tuning wrote: the dashboard creates none
    argv = ["dashboard", "--storage", f"sqlite:///{tmp_path / 's.db'}", "--port", "8765"]
    outcome = run_cli(argv, capsys)
    assert outcome.code == 2 and "--port 8765: cannot listen there (Address already in use)" in outcome.err


@pytest.mark.parametrize(("name", "value"), [
    ("AUTOTUNE_PRECISION", "half"), ("AUTOTUNE_STORAGE", "nosuchdialect://x"),
    ("AUTOTUNE_STORAGE_RETRY_SECONDS", "nan"), ("AUTOTUNE_TEMPLATES", "/no/such/folder"),
    ("AUTOTUNE_PROBE_EDGE", "maybe"), ("AUTOTUNE_PROBE_ISOLATION", "thread"),
])
def test_bad_environment_setting_is_named_before_any_work(name: str, value: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, value)
    argv = ["verify", str(tmp_path / "no_bundle")]
    outcome = run_cli(argv, capsys)
    assert_refused_cleanly(outcome, argv)
    assert outcome.err.startswith(f"autotune verify: error: {name}: "), outcome.err
    assert value in outcome.err


def test_a_bug_is_one_line_and_exit_70_with_the_traceback_in_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import autotune.commands.data as data_commands
    from autotune.cli import EXIT_CODES, EXIT_INTERNAL

    def broken(_args: object) -> int:
        raise KeyError("a bug")

    monkeypatch.setattr(data_commands, "analyze_command", broken)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    outcome = run_cli(["analyze", "--input", "x", "--work-dir", "w"], capsys)
    assert outcome.code == EXIT_INTERNAL == 70 and 70 in EXIT_CODES
    assert outcome.err.count("\n") == 1 and "Traceback" not in outcome.err, outcome.err
    assert outcome.err.startswith("autotune analyze: internal error"), outcome.err
    [written] = list(tmp_path.glob("autotune-analyze-*.traceback.txt"))
    assert str(written) in outcome.err
    assert "Traceback" in written.read_text() and "KeyError: 'a bug'" in written.read_text()


def test_docs_list_every_exit_code() -> None:
    """docs/cli.md's table of exit codes holds exactly the codes the CLI documents (``EXIT_CODES``), 70 included."""
    import re

    from autotune.cli import EXIT_CODES

    text = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    table = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    assert {int(code) for code in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)} == set(EXIT_CODES)
    assert "| 70 | internal error" in table
