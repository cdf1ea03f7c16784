"""Host faults during training and inference: a full disk (injected at the write path, and on a real
small tmpfs where one can be mounted), too little room before a run starts. Each ends with one line
and exit code 4, keeps what was written, and the command the line names continues."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import namedtuple
from collections.abc import Iterator
from pathlib import Path

import pytest
from host_faults import FullDisk

from autotune import files

Usage = namedtuple("Usage", "total used free")


def _error_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("autotune ")]


def _epochs(bundle: Path) -> list[int]:
    import json

    return [r["epoch"] for r in json.loads((bundle / "model_fold0" / "metrics.json").read_text())["rows"]]


def _no_temps(folder: Path) -> bool:
    return not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def _names_what_is_on_disk(line: str, out: Path) -> bool:
    """The line's ``kept:`` part gives each checkpoint's epoch as the file on disk holds it."""
    import torch

    return all(f"{out / name} (epoch {torch.load(out / name, weights_only=True)['epoch']})" in line
               for name in ("last.pt", "best.pt") if (out / name).is_file())


def _train(bundle: Path, *extra: str) -> int:
    from autotune.cli import main

    return main(["train", str(bundle), "--device", "cpu", "--epochs", "3", "--val-every", "1", "--quiet", *extra])


def test_a_full_disk_at_epoch_2_keeps_epoch_1_and_resume_finishes(
        bundle: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    out = bundle / "model_fold0"
    monkeypatch.setattr(files, "open", FullDisk("last.pt", allow=1).open, raising=False)
    assert _train(bundle) == 4
    [line] = _error_lines(capsys)
    assert line.startswith(f"autotune train: error: cannot write the checkpoint {out / 'last.pt'}: no space left")
    assert "needs about 5." in line and "MiB" in line and "free there" in line
    assert f"kept: {out / 'last.pt'} (epoch 1)" in line and _names_what_is_on_disk(line, out)
    assert line.endswith(f"free space, then run 'autotune train {bundle} --resume --epochs 3'")
    assert torch.load(out / "last.pt", weights_only=True)["epoch"] == 1 and _no_temps(out)
    monkeypatch.undo()  # space is freed
    assert _train(bundle, "--resume") == 0
    assert torch.load(out / "last.pt", weights_only=True)["epoch"] == 3 and _epochs(bundle) == [1, 2, 3]


def test_a_full_disk_at_the_first_checkpoint_says_nothing_is_kept(
        bundle: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    out = bundle / "model_fold0"
    monkeypatch.setattr(files, "open", FullDisk(".pt").open, raising=False)
    assert _train(bundle) == 4
    [line] = _error_lines(capsys)
    assert "cannot write the checkpoint" in line and "kept: nothing;" in line
    assert line.endswith(f"free space, then run 'autotune train {bundle} --epochs 3'")  # nothing to resume from
    assert not out.exists()  # nothing was written: the folder the run's lock made goes with it
    monkeypatch.undo()
    assert _train(bundle) == 0 and _epochs(bundle) == [1, 2, 3]


def test_a_full_disk_during_inference_says_which_predictions_were_written(
        bundle: Path, small_demo_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import nibabel as nib

    from autotune.cli import main
    from autotune.trainer.runner import train

    train(bundle, device="cpu", epochs=1, progress=False)
    images = [str(small_demo_data / "imagesTr" / f"case_00{i}.nii.gz") for i in range(3)]
    out = tmp_path / "pred"
    argv = ["infer", str(bundle), "--images", *images, "--output", str(out), "--device", "cpu", "-q"]
    monkeypatch.setattr(files, "open", FullDisk("_seg.nii.gz", allow=1).open, raising=False)
    assert main(argv) == 4
    [line] = _error_lines(capsys)
    assert line.startswith(f"autotune infer: error: cannot write the prediction {out / 'case_001_seg.nii.gz'}")
    assert f"kept: 1 of 3 predictions in {out} (the last: case_000_seg.nii.gz)" in line
    assert "run the same command again" in line and "--images only the 2 not written" in line
    assert [p.name for p in out.iterdir()] == ["case_000_seg.nii.gz"]
    assert nib.load(out / "case_000_seg.nii.gz").shape == nib.load(images[0]).shape
    monkeypatch.undo()
    assert main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == [f"case_00{i}_seg.nii.gz" for i in range(3)]


def test_too_little_room_for_the_checkpoints_is_refused_before_training(
        bundle: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(files.shutil, "disk_usage", lambda path: Usage(10**9, 10**9, 8 * 2**20))
    assert _train(bundle) == 4
    [line] = _error_lines(capsys)
    assert "cannot write the checkpoints (best.pt, last.pt and the next last.pt while it is written)" in line
    assert "not enough free space for a run (needs about 16." in line and "8.00 MiB free there" in line
    assert "nothing trained" in line and f"then run 'autotune train {bundle} --epochs 3'" in line
    assert not (bundle / "model_fold0" / "metrics.json").exists()


def test_too_little_room_for_the_disk_cache_is_refused_before_training(
        bundle: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.bundles.config import update_bundle_config

    update_bundle_config(bundle, {"persistent_cache": True})
    cache = bundle / "cache"

    def usage(path: str) -> Usage:
        return Usage(10**12, 0, 100 * 2**10 if Path(path).resolve().is_relative_to(cache.resolve()) else 10**12)

    monkeypatch.setattr(files.shutil, "disk_usage", usage)
    assert _train(bundle) == 4
    [line] = _error_lines(capsys)
    assert f"cannot write the disk cache (PersistentDataset) in {cache}" in line and "100.00 KiB free there" in line
    assert "fast_training.cache_dir" in line and not list(cache.rglob("*.pt"))


def test_the_checkpoint_size_is_known_before_the_first_step(bundle: Path, tmp_path: Path) -> None:
    import torch

    from autotune import build
    from autotune.bundles.config import load_bundle_config
    from autotune.trainer.checkpoint import RunState, checkpoint_state, save_checkpoint
    from autotune.trainer.room import checkpoint_bytes

    cfg = load_bundle_config(bundle)
    model = build.build_network(cfg)
    optimizer = build.build_optimizer(cfg, model.parameters())
    estimate = checkpoint_bytes(model, optimizer)  # before any step: the optimizer's state is still empty
    model(torch.zeros(1, cfg.input_channels, *cfg.roi_size)).sum().backward()
    optimizer.step()
    parts = {"model": model, "optimizer": optimizer, "scaler": None, "scheduler": None}
    save_checkpoint(tmp_path / "last.pt", checkpoint_state(parts, RunState(), 1, mode="fast", elapsed_s=0.0,
                                                           total_steps=1, config=cfg))
    actual = (tmp_path / "last.pt").stat().st_size
    assert actual <= estimate <= 1.1 * actual, (estimate, actual)


@pytest.fixture()
def small_tmpfs(bundle: Path) -> Iterator[Path]:
    """``bundle/model_fold0`` on a 24 MiB tmpfs of its own (skips where mounting is not permitted)."""
    folder = bundle / "model_fold0"
    folder.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(folder)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


def test_a_real_tmpfs_that_fills_after_epoch_1(small_tmpfs: Path, bundle: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from autotune.trainer.monitor import MetricsLog

    filler = small_tmpfs / "filler.bin"
    add = MetricsLog.add

    def add_then_fill(self: MetricsLog, row: dict, extra: dict | None = None) -> None:
        add(self, row, extra)
        if row["epoch"] == 1:  # another program takes the space: half a checkpoint stays free
            free = shutil.disk_usage(small_tmpfs).free
            with open(filler, "wb") as handle:
                handle.write(b"\0" * (free - (small_tmpfs / "last.pt").stat().st_size // 2))

    monkeypatch.setattr(MetricsLog, "add", add_then_fill)
    assert _train(bundle) == 4
    [line] = _error_lines(capsys)
    assert "no space left on the device" in line and f"kept: {small_tmpfs / 'last.pt'} (epoch 1)" in line
    assert _names_what_is_on_disk(line, small_tmpfs)  # a best.pt whose write failed is not claimed
    assert torch.load(small_tmpfs / "last.pt", weights_only=True)["epoch"] == 1 and _no_temps(small_tmpfs)
    monkeypatch.undo()
    os.unlink(filler)  # space is freed
    assert _train(bundle, "--resume") == 0 and _epochs(bundle) == [1, 2, 3]


def test_a_real_tmpfs_too_small_for_a_run_is_refused(small_tmpfs: Path, bundle: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    with open(small_tmpfs / "filler.bin", "wb") as handle:  # 12 MiB left: two checkpoints, not three
        handle.write(b"\0" * (12 * 2**20))
    assert _train(bundle) == 4
    [line] = _error_lines(capsys)
    assert "not enough free space for a run" in line and not list(small_tmpfs.glob("*.pt"))


def test_a_full_disk_while_the_disk_cache_fills_is_one_line(
        bundle: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import errno

    import monai.data.dataset

    from autotune.bundles.config import update_bundle_config

    update_bundle_config(bundle, {"persistent_cache": True})
    move = monai.data.dataset.shutil.move

    def move_then_fill(source: str, dest: str) -> object:  # MONAI moves each cached item into the cache folder
        if len(list((bundle / "cache").rglob("*.pt"))) >= 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), dest)
        return move(source, dest)

    monkeypatch.setattr(monai.data.dataset.shutil, "move", move_then_fill)
    assert _train(bundle) == 4  # raised in the loader's thread, reported by the training loop
    [line] = _error_lines(capsys)
    assert f"cannot write the disk cache (PersistentDataset) in {bundle / 'cache'}: no space left" in line
    assert "kept: nothing" in line
    monkeypatch.undo()
    assert _train(bundle) == 0 and _epochs(bundle) == [1, 2, 3]
