"""A non-finite loss or gradient never reaches the weights: the step guard skips it, and after
``NONFINITE_PATIENCE`` in a row training stops with one line and exit code 5, keeping the last
finite checkpoint, from which ``--resume`` continues. The same with two DDP ranks."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from bundle_fixtures import copy_bundle
from forked_cli import start_cli

REPO = Path(__file__).resolve().parents[2]


def _nan_from(monkeypatch: pytest.MonkeyPatch, first: int) -> None:
    """Every training loss from the ``first``-th call on is NaN (the batch's loss, as a non-finite batch gives)."""
    import autotune.build as build

    built, calls = build.build_loss, [0]

    def build_loss(cfg: dict) -> object:
        loss_fn = built(cfg)

        def nan_after(logits, labels):  # noqa: ANN001, ANN202
            calls[0] += 1
            loss = loss_fn(logits, labels)
            return loss * float("nan") if calls[0] >= first else loss

        return nan_after

    monkeypatch.setattr(build, "build_loss", build_loss)


def _finite(state: dict) -> bool:
    import torch

    return all(bool(torch.isfinite(t).all()) for t in state.values() if torch.is_tensor(t) and t.is_floating_point())


def test_the_guard_skips_a_nonfinite_step_and_stops_after_patience() -> None:
    import torch

    from autotune.finite import NonFiniteSteps, StepGuard
    from autotune.step import train_step

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv3d(1, 2, 1), torch.nn.BatchNorm3d(2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    agreed: list[int] = []
    guard = StepGuard(model, agree=lambda flag: agreed.append(flag) or flag, patience=3)
    image, label = torch.randn(2, 1, 4, 4, 4), torch.randn(2, 2, 4, 4, 4)

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((logits - target) ** 2).mean()

    train_step(model, loss_fn, optimizer, image, label, guard=guard)
    assert guard.applied and agreed == [0]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = [optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    bad = image.clone()
    bad[0, 0, 0, 0, 0] = float("inf")  # one non-finite voxel: the loss, gradients and BatchNorm's statistics go nan
    for _ in range(2):
        loss = train_step(model, loss_fn, optimizer, bad, label, guard=guard)
        assert not math.isfinite(float(loss)) and not guard.applied
    assert guard.reason == "loss nan" and guard.in_a_row == 2 and agreed == [0, 1, 1]
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # weights and running statistics as they were
    assert all(torch.equal(m, optimizer.state[p]["momentum_buffer"]) for m, p in zip(momentum, model.parameters(),
                                                                                    strict=True))
    assert all(p.grad is None for p in model.parameters())
    train_step(model, loss_fn, optimizer, image, label, guard=guard)  # a finite step resets the count
    assert guard.applied and guard.in_a_row == 0 and guard.skipped == 2
    for _ in range(2):
        train_step(model, loss_fn, optimizer, bad, label, guard=guard)
    with pytest.raises(NonFiniteSteps, match="loss nan in 3 steps in a row"):
        train_step(model, loss_fn, optimizer, bad, label, guard=guard)
    assert _finite(model.state_dict())


def test_nonfinite_gradients_with_a_finite_loss_are_skipped() -> None:
    import torch

    from autotune.finite import StepGuard
    from autotune.step import train_step

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = StepGuard(model)
    weight = model.weight.detach().clone()

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(logits.abs() * 0.0).sum()  # finite (0), but its gradient is inf * 0: nan

    loss = train_step(model, loss_fn, optimizer, torch.ones(1, 2), torch.ones(1, 1), guard=guard)
    assert float(loss) == 0.0 and not guard.applied and guard.reason == "gradients nan (loss 0)"
    assert torch.equal(model.weight, weight)


def test_the_trace_names_the_module_where_it_first_went_nonfinite() -> None:
    import torch

    from autotune.finite import trace_nonfinite

    class Log(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.log(x)

    class Root(torch.nn.Module):  # sqrt(0) is finite, its gradient is not
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sqrt(x.clamp(min=0.0))

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return logits.mean()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv3d(1, 2, 1), torch.nn.BatchNorm3d(2), Log(), torch.nn.Conv3d(2, 1, 1))
    image = torch.randn(2, 1, 4, 4, 4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert trace_nonfinite(model, loss_fn, image, image) == "the forward output of 2 (Log)"  # log of negatives
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # running statistics kept
    image[0, 0, 0, 0, 0] = float("nan")
    assert trace_nonfinite(model, loss_fn, image, image) == "the input batch"
    model = torch.nn.Sequential(torch.nn.Conv3d(1, 2, 1), Root(), torch.nn.Conv3d(2, 1, 1))
    with torch.no_grad():
        model[0].weight.zero_()
        model[0].bias.zero_()
    # the first convolution's gradients break (inf * 0 in the root's backward); the second's stay finite
    assert trace_nonfinite(model, loss_fn, torch.ones(1, 1, 2, 2, 2), None) == "the backward pass, at the gradient of 0.bias"
    assert all(p.grad is None for p in model.parameters())


def test_a_nan_loss_stops_training_with_a_line_and_code_5_and_resume_continues(
        bundles: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from autotune.cli import main

    monkeypatch.setenv("AUTOTUNE_PRECISION", "fp32")
    bundle = copy_bundle(bundles["segresnet_0"], tmp_path / "b")
    out = bundle / "model_fold0"
    # 3 steps per epoch: step 1 applied, then nan from step 2 on: 2 skipped in epoch 1, the 5th in a row is
    # epoch 2's step 3. No validation before the stop (the two-rank test keeps a best.pt too).
    _nan_from(monkeypatch, 2)
    assert main(["train", str(bundle), "--device", "cpu", "--epochs", "2", "--val-every", "5", "-q"]) == 5
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("autotune ")]
    assert lines == [
        f"autotune train: diverged: loss nan in 5 steps in a row, none applied to the weights; stopped in epoch 2 "
        f"at step 3 of 3; first non-finite: the loss (precision fp32); kept: {out / 'last.pt'} (epoch 1); try a lower "
        f"learning_rate (now 0.0002) in {bundle / 'configs' / 'hyper_parameters.yaml'} and a fresh run "
        f"('autotune train {bundle} --epochs 2'), or check the data"]
    last = torch.load(out / "last.pt", map_location="cpu", weights_only=True)
    assert last["epoch"] == 1 and _finite(last["model"])
    assert {int(s["step"]) for s in last["optimizer"]["state"].values()} == {1}  # AdamW: one step applied, no more
    [row] = __import__("json").loads((out / "metrics.json").read_text())["rows"]
    assert row["nonfinite_steps"] == 2 and row["steps"] == 3 and math.isfinite(row["loss"])
    monkeypatch.undo()
    monkeypatch.setenv("AUTOTUNE_PRECISION", "fp32")
    assert main(["train", str(bundle), "--device", "cpu", "--epochs", "2", "--resume", "-q"]) == 0
    resumed = torch.load(out / "last.pt", map_location="cpu", weights_only=True)
    assert resumed["epoch"] == 2 and _finite(resumed["model"])
    assert {int(s["step"]) for s in resumed["optimizer"]["state"].values()} == {4}


def test_bf16_advice_names_fp32_first() -> None:
    from autotune.trainer.faults import diverged_error

    error = diverged_error("loss nan in 5 steps in a row", "bf16", "", "autotune train b --resume --epochs 4",
                           "autotune train b --epochs 4", 0.01, "b")
    assert error.exit_code == 5 and str(error) == (
        "loss nan in 5 steps in a row (precision bf16); kept: nothing; try fp32 ('autotune train b --epochs 4 "
        "--precision fp32'), or a lower learning_rate (now 0.01) in b/configs/hyper_parameters.yaml and a fresh "
        "run ('autotune train b --epochs 4')")


_NAN_HOOK = '''
import os
import autotune.build as _build
_built, _calls = _build.build_loss, [0]
def build_loss(cfg):
    loss_fn = _built(cfg)
    def nan_after(logits, labels):
        _calls[0] += 1
        loss = loss_fn(logits, labels)
        poisoned = os.environ.get("NAN_RANK") is not None and os.environ.get("RANK") == os.environ["NAN_RANK"]
        return loss * float("nan") if poisoned and _calls[0] >= int(os.environ["NAN_FROM"]) else loss
    return nan_after
_build.build_loss = build_loss
'''


def _run(argv: list[str], env: dict[str, str], logs: Path) -> tuple[int, str]:
    """``autotune ARGV`` forked with torch imported (``forked_cli``; the ranks it spawns are fresh interpreters,
    which load the hook): its exit code and stderr."""
    proc = start_cli(argv, logs.with_suffix(".out"), logs.with_suffix(".err"), env)
    _out, err = proc.communicate(timeout=600)
    return int(proc.returncode), err


@pytest.mark.slow
def test_two_ddp_ranks_agree_on_skips_and_on_the_stop(bundles: dict[str, Path], tmp_path: Path) -> None:
    """Only rank 1's loss goes nan: both ranks skip the same steps and stop at the same one, one line, exit 5."""
    import torch

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_NAN_HOOK)
    env = {**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{REPO}", "OMP_NUM_THREADS": "1",
           "AUTOTUNE_PRECISION": "fp32", "NAN_FROM": "2", "NAN_RANK": "1"}
    bundle = copy_bundle(bundles["segresnet_0"], tmp_path / "b")
    out = bundle / "model_fold0"
    argv = ["train", str(bundle), "--device", "cpu", "--nproc", "2", "-q", "--epochs", "3"]
    # 2 steps per rank and epoch: step 1 applied, then 1 skipped in epoch 1, 2 in epoch 2, the 5th is epoch 3's 2nd
    code, stderr = _run(argv, env, tmp_path / "diverged")
    assert code == 5, stderr[-2000:]
    [line] = [line for line in stderr.splitlines() if line.startswith("autotune ")]  # one line, not one per rank
    assert line.startswith("autotune train: diverged: gradients nan (loss ")  # rank 0's loss was finite
    assert ("in 5 steps in a row, none applied to the weights; stopped in epoch 3 at step 2 of 2 on each rank "
            f"(precision fp32); kept: {out / 'last.pt'} (epoch 2), {out / 'best.pt'} (epoch 1);") in line
    last = torch.load(out / "last.pt", map_location="cpu", weights_only=True)
    assert last["epoch"] == 2 and _finite(last["model"])
    assert _finite(torch.load(out / "best.pt", map_location="cpu", weights_only=True)["model"])
    assert {int(s["step"]) for s in last["optimizer"]["state"].values()} == {1}
    env.pop("NAN_RANK")
    code, stderr = _run([*argv, "--resume"], env, tmp_path / "resumed")
    assert code == 0, stderr[-2000:]
    final = torch.load(out / "last.pt", map_location="cpu", weights_only=True)
    assert final["epoch"] == 3 and _finite(final["model"])
    assert {int(s["step"]) for s in final["optimizer"]["state"].values()} == {3}
