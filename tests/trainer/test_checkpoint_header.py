"""A checkpoint is read once into a typed ``Checkpoint``: every header field edited to a wrong type, a non-finite or
negative number, or any other value is either accepted as what the field must hold or refused in one line naming
the file, the key and what to do; never another exception. A few real files (a folder, garbage, bare weights,
truncated) are refused the same way; the lock of a model folder lets one holder in."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from autotune.errors import ConfigError, HostWriteError
from autotune.trainer.checkpoint import (
    RESUME_FIX,
    RunState,
    check_resumable,
    checkpoint_state,
    parse_checkpoint,
    read_checkpoint,
    rng_state,
    save_checkpoint,
)
from autotune.trainer.epoch import EpochProgress

WHERE = Path("/bundle/model_fold0/last.pt")
CFG = SimpleNamespace(algo="unet", network=SimpleNamespace(name="UNet"), fold=0)


def _valid() -> dict[str, Any]:
    """A checkpoint as a run writes it after epoch 3, stopped in epoch 4 after one batch."""
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    parts = {"model": model, "optimizer": optimizer, "scaler": None, "scheduler": None}
    state = RunState(epoch=3, best=0.5, best_epoch=2, stale=1)
    partial = {**EpochProgress(epoch=4, batches=1, loss_sum=0.7, rng=rng_state()).as_dict(), "rank_batches": [1]}
    return {**checkpoint_state(parts, state, 3, mode="fast", elapsed_s=12.5, total_steps=40, config=CFG, partial=partial),
            "memory_fallbacks": {"micro_batches": 2}}


VALID = _valid()
HEADER = ["mode", "epoch", "best_metric", "best_epoch", "stale_validations", "elapsed_s", "total_steps", "algo",
          "network", "fold", "model", "optimizer", "scaler", "scheduler", "rng", "partial", "memory_fallbacks"]
PARTIAL = [name for name in VALID["partial"] if name != "rng"]
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(),
                                                                                     max_size=2),
    st.sampled_from(["fast", "regular", "None", "", "\x00"]), st.just(torch.zeros(2)), st.just(float("nan")))


def _named_key(line: str) -> str:
    found = re.search(r"key '([^']+)'", line) or re.search(r"unknown key '([^']+)'", line)
    assert found, line
    return found.group(1)


def _refused_in_one_line(exc: ConfigError, *keys: str) -> None:
    line = str(exc)
    assert "\n" not in line and line.startswith(f"{WHERE}: ") and line.endswith(RESUME_FIX), line
    named = _named_key(line)
    assert named in keys or any(named.startswith(f"{k}.") or named.startswith(f"{k}[") for k in keys), (named, line)


def _holds(checkpoint: Any, field: str, value: Any) -> None:
    """An accepted value is one the field may hold."""
    held = getattr(checkpoint, field)
    if field == "mode":
        assert held in ("fast", "regular")
    elif field in ("epoch", "best_epoch", "stale_validations", "total_steps", "fold"):
        assert held is None or (type(held) is int and held >= 0)
    elif field in ("best_metric", "elapsed_s"):
        assert held is None or (math.isfinite(held) and held >= 0)
    elif field in ("algo", "network"):
        assert isinstance(held, str) and held.strip()
    elif field in ("model", "optimizer", "scaler", "scheduler", "memory_fallbacks"):
        assert held is None or hasattr(held, "keys")
    assert checkpoint.best_epoch <= checkpoint.epoch


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(HEADER), value=VALUES)
@example(field="mode", value=None)
@example(field="epoch", value=-1)
@example(field="best_metric", value=float("inf"))
@example(field="algo", value=3)
@example(field="model", value=torch.zeros(2))
def test_a_header_field_edited_is_accepted_or_refused_in_one_line(field: str, value: Any) -> None:
    try:
        checkpoint = parse_checkpoint({**VALID, field: value}, WHERE)
    except ConfigError as exc:
        _refused_in_one_line(exc, field, "best_epoch", "partial")
        return
    _holds(checkpoint, field, value)


@settings(max_examples=200, deadline=None)
@given(field=st.sampled_from(PARTIAL), value=VALUES)
@example(field="epoch", value=3)
@example(field="rank_batches", value=[-1])
def test_a_stopped_epochs_field_edited_is_accepted_or_refused_in_one_line(field: str, value: Any) -> None:
    try:
        checkpoint = parse_checkpoint({**VALID, "partial": {**VALID["partial"], field: value}}, WHERE)
    except ConfigError as exc:
        _refused_in_one_line(exc, f"partial.{field}", "partial.epoch")
        return
    assert checkpoint.partial is not None and checkpoint.partial.epoch == checkpoint.epoch + 1
    assert EpochProgress.from_dict(checkpoint.partial.as_dict()).epoch == 4  # what the run continues with


@settings(max_examples=60, deadline=None)
@given(field=st.sampled_from(HEADER))
def test_a_header_field_left_out_is_refused_or_has_its_default(field: str) -> None:
    data = {k: v for k, v in VALID.items() if k != field}
    try:
        parse_checkpoint(data, WHERE)
    except ConfigError as exc:
        assert f"key {field!r} is missing" in str(exc) and str(exc).endswith(RESUME_FIX)
        assert field in ("mode", "epoch", "algo", "network", "model", "optimizer")


def test_a_valid_checkpoint_reads_back_as_written(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "last.pt", VALID)
    for mmap in (False, True):
        checkpoint = read_checkpoint(tmp_path / "last.pt", mmap=mmap)
        assert (checkpoint.mode, checkpoint.epoch, checkpoint.best_metric, checkpoint.fold) == ("fast", 3, 0.5, 0)
        assert checkpoint.signature() == "unet UNet" and checkpoint.partial is not None
        assert torch.equal(checkpoint.model["weight"], VALID["model"]["weight"])


def _garbage(path: Path) -> None:
    path.write_bytes(b"not a checkpoint" * 8)


def _truncated(path: Path) -> None:
    save_checkpoint(path, VALID)
    path.write_bytes(path.read_bytes()[:200])


def _bare_weights(path: Path) -> None:
    torch.save(torch.nn.Linear(2, 2).state_dict(), path)


def _pickled_object(path: Path) -> None:
    torch.save({"mode": "fast", "epoch": SimpleNamespace(n=1)}, path)


def _wrong_mode(path: Path) -> None:
    torch.save({**VALID, "mode": None}, path)


def _a_folder(path: Path) -> None:
    path.mkdir()
    (path / "inside").write_text("x")


@pytest.mark.parametrize(("make", "needle"), [
    (_garbage, "unreadable checkpoint (UnpicklingError"), (_truncated, "unreadable checkpoint (RuntimeError"),
    (_bare_weights, "bare weights (a state_dict of 2 tensors) without a checkpoint's header"),
    (_pickled_object, "unreadable checkpoint (UnpicklingError: Unsupported global"),
    (_wrong_mode, "key 'mode': got None; must be 'fast' or 'regular'"),
    (_a_folder, "a folder, not a checkpoint; move it away"),
], ids=["garbage", "truncated", "bare-weights", "pickled-object", "mode-none", "folder"])
def test_a_file_that_is_no_checkpoint_is_refused_in_one_line(tmp_path: Path, make: Any, needle: str) -> None:
    path = tmp_path / "last.pt"
    make(path)
    for mmap in (False, True):
        with pytest.raises(ConfigError) as caught:
            read_checkpoint(path, mmap=mmap)
        line = str(caught.value)
        assert line.startswith(f"{path}: ") and needle in line and "\n" not in line and "--mode None" not in line
        assert "move it away" in line


@pytest.mark.parametrize(("change", "needle"), [
    ({"mode": "regular"}, "was trained in regular mode; resume with --mode regular"),
    ({"algo": "segresnet", "network": "SegResNet"}, "is a checkpoint of segresnet SegResNet, this bundle trains "
                                                    "unet UNet"),
    ({"fold": 2}, "was trained on fold 2, this bundle trains fold 0"),
])
def test_another_runs_checkpoint_is_refused(change: dict[str, Any], needle: str) -> None:
    checkpoint = parse_checkpoint({**VALID, **change}, WHERE)
    with pytest.raises(ConfigError, match=re.escape(needle)):
        check_resumable(checkpoint, WHERE, "fast", CFG)
    check_resumable(parse_checkpoint({**VALID, "fold": None}, WHERE), WHERE, "fast", CFG)  # before folds were kept


def test_a_held_lock_lets_no_second_holder_in_and_goes_with_its_holder(tmp_path: Path) -> None:
    from autotune.trainer.lock import LOCK_NAME, TrainingLock

    (tmp_path / "b").mkdir()
    folder, said = tmp_path / "b" / "model_fold0", []
    with TrainingLock(folder, "b", said.append) as held:
        assert json.loads(held.path.read_text())["pid"] == os.getpid()
        with pytest.raises(ConfigError) as caught:
            TrainingLock(folder, "b", said.append).acquire()  # another open file: flock refuses it here too
        assert str(caught.value).startswith("b: another 'autotune train' of this bundle is running (pid "
                                            f"{os.getpid()} on {socket.gethostname()}, started ")
        assert os.listdir(folder) == [LOCK_NAME]
    assert not folder.exists() and said == []  # made by the lock and left empty: removed with it
    dead = subprocess.Popen(["true"])
    dead.wait()
    folder.mkdir()
    (folder / LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    with TrainingLock(folder, "b", said.append):
        pass
    assert said == [f"taking over the training lock {folder / LOCK_NAME} of a run that ended without releasing it "
                    f"(pid {dead.pid} on {socket.gethostname()}; it is gone)"]
    assert os.listdir(folder) == []  # the folder was there before: kept


def test_a_lock_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    from autotune.trainer.lock import TrainingLock

    (tmp_path / "b").mkdir()
    (tmp_path / "b").chmod(0o500)
    try:
        if os.access(tmp_path / "b", os.W_OK):
            pytest.skip("running as a user who may write anywhere")
        with pytest.raises(HostWriteError, match="cannot write the training lock .*: permission denied"):
            TrainingLock(tmp_path / "b" / "model_fold0", "b", print).acquire()
    finally:
        (tmp_path / "b").chmod(0o700)
