"""The one write path: atomic (temp, fsync, rename, fsync the folder), nothing left on failure,
and a host's refusal (full disk, quota, read-only, permission) as one line naming what and where."""

from __future__ import annotations

import errno
import os
from collections import namedtuple
from pathlib import Path

import pytest
from host_faults import FullDisk

from autotune import files
from autotune.errors import HostWriteError

Usage = namedtuple("Usage", "total used free")


def _temps(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_a_write_is_fsynced_file_and_folder_then_renamed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    path = files.atomic_write_json(tmp_path / "sub" / "a.json", {"n": 1})
    assert path.read_text() == '{\n  "n": 1\n}\n'
    assert len(synced) == 2 and synced[0].startswith(str(tmp_path / "sub" / ".a.json."))  # the temp file's bytes
    assert synced[1] == str(tmp_path / "sub")  # then the folder, after the rename
    assert _temps(tmp_path / "sub") == []


def test_a_full_disk_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "metrics.json"
    files.atomic_write_text(target, "old")
    monkeypatch.setattr(files, "open", FullDisk("metrics.json").open, raising=False)
    monkeypatch.setattr(files.shutil, "disk_usage", lambda path: Usage(100, 100, 12345))
    with pytest.raises(HostWriteError) as caught:
        files.atomic_write_text(target, "new" * 1000, what="the metrics")
    line = str(caught.value)
    assert caught.value.exit_code == 4 and "\n" not in line
    assert line.startswith(f"cannot write the metrics {target}: no space left on the device")
    assert "needs about 2.93 KiB" in line and "12.06 KiB free there" in line and "kept: nothing" in line
    assert target.read_text() == "old" and _temps(tmp_path) == []


def test_other_failures_pass_through_and_still_clean_up(tmp_path: Path) -> None:
    def broken(handle: object) -> None:
        raise ValueError("not serialisable")

    def interrupted(handle: object) -> None:
        raise KeyboardInterrupt

    with pytest.raises(ValueError, match="not serialisable"):
        files.atomic_write(tmp_path / "x.bin", broken)
    with pytest.raises(KeyboardInterrupt):
        files.atomic_write(tmp_path / "x.bin", interrupted)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("code", "words"), [(errno.EDQUOT, "quota"), (errno.EROFS, "read-only"),
                                             (errno.EACCES, "permission denied")])
def test_each_host_refusal_is_named(tmp_path: Path, code: int, words: str) -> None:
    def refused(handle: object) -> None:
        raise OSError(code, os.strerror(code))

    with pytest.raises(HostWriteError, match=words):
        files.atomic_write(tmp_path / "x.bin", refused)
    assert _temps(tmp_path) == []


def test_a_folder_that_cannot_be_made_is_a_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def makedirs(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(os, "mkdir", makedirs)
    with pytest.raises(HostWriteError, match="read-only"):
        files.atomic_write_bytes(tmp_path / "new" / "y.bin", b"123")


def test_outputs_get_the_usual_permissions(tmp_path: Path) -> None:
    mask = os.umask(0o022)
    try:
        path = files.atomic_write_bytes(tmp_path / "pred.bin", b"1")
    finally:
        os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o644  # readable by the group, as a plain open() makes it


def test_torch_save_on_a_full_disk_is_named_not_torchs_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    state = {"weight": torch.zeros(1000)}
    files.atomic_save_torch(tmp_path / "last.pt", state)
    monkeypatch.setattr(files, "open", FullDisk("last.pt").open, raising=False)
    with pytest.raises(HostWriteError) as caught:
        files.atomic_save_torch(tmp_path / "last.pt", {"weight": torch.ones(1000)})
    assert "cannot write the checkpoint" in str(caught.value) and "needs about 3.91 KiB" in str(caught.value)
    assert files.host_refusal(caught.value.__cause__).errno == errno.ENOSPC  # what torch raised is kept as the cause
    monkeypatch.undo()
    assert torch.equal(torch.load(tmp_path / "last.pt", weights_only=True)["weight"], torch.zeros(1000))
    assert _temps(tmp_path) == []


def test_torchs_writer_error_on_a_nearly_full_disk_counts_as_full(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 2574336 vs 2574228")
    assert files.host_refusal(error, (tmp_path,)) is None  # plenty of room here: not a full disk
    monkeypatch.setattr(files.shutil, "disk_usage", lambda path: Usage(100, 100, 4096))
    assert files.host_refusal(error, (tmp_path,)).errno == errno.ENOSPC
    assert files.host_refusal(RuntimeError("shape mismatch"), (tmp_path,)) is None


def test_a_folder_in_the_files_place_is_one_line_and_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "last.pt").mkdir()
    (tmp_path / "last.pt" / "inside").write_text("kept")
    (tmp_path / "afile").write_text("kept")
    for target, reason in ((tmp_path / "last.pt", "a folder is in its place"),
                           (tmp_path / "afile" / "x.json", f"{tmp_path / 'afile'} is a file, not a folder")):
        with pytest.raises(HostWriteError) as caught:
            files.atomic_write_text(target, "new", what="the checkpoint")
        assert str(caught.value) == (f"cannot write the checkpoint {target}: {reason}; kept: nothing; move it away "
                                     "(or write elsewhere), then run the same command again")
    assert (tmp_path / "last.pt" / "inside").read_text() == "kept" and (tmp_path / "afile").read_text() == "kept"
    assert _temps(tmp_path) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["afile", "last.pt"]


def test_a_folder_that_takes_the_files_place_meanwhile_is_one_line(tmp_path: Path) -> None:
    target = tmp_path / "last.pt"

    def meanwhile(handle: object) -> None:
        target.mkdir()  # after the check, before the rename

    with pytest.raises(HostWriteError, match="a folder is in its place; kept: nothing; move it away"):
        files.atomic_write(target, meanwhile, what="the checkpoint")
    assert _temps(tmp_path) == [] and target.is_dir()
