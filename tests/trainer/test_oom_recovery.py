"""Out of memory costs speed, never the run: a training pass that runs out of memory is repeated in micro-batches
(the same step), validation steps down its window batch and then to the CPU, and only an OOM at one patch ends the
run (exit 3). The CPU tracker's limit (``--memory-limit``) stands in for the card."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from bundle_fixtures import copy_bundle

from autotune.tunables import ValidationDevice


def _record_losses(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, int]]:
    """Every applied training pass's (loss, micro-batches), in order (a pass that ran out of memory is not one)."""
    import autotune.step as step

    train_step, seen = step.train_step, []

    def recorded(*args: Any, **kwargs: Any) -> Any:
        loss = train_step(*args, **kwargs)
        seen.append((float(loss), int(args[8] if len(args) > 8 else kwargs.get("micro_batches", 1))))
        return loss

    monkeypatch.setattr(step, "train_step", recorded)
    return seen


@pytest.fixture(scope="module")
def reference(demo_bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The tiny UNet (2 patches per pass, fp32) trained 2 epochs under a limit it never meets: its per-pass losses,
    weights and peaks."""
    from autotune.trainer.runner import train

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AUTOTUNE_PRECISION", "fp32")
        losses = _record_losses(patch)
        bundle = copy_bundle(demo_bundles["unet_0"], tmp_path_factory.mktemp("oom_reference") / "unet_0")
        summary = train(bundle, device="cpu", epochs=2, val_every=1, progress=False, memory_limit="1GiB")
    assert summary["memory_fallbacks"] == [] and summary["micro_batches"] == 1
    rows = json.loads((bundle / "model_fold0" / "metrics.json").read_text())["rows"]
    return {"summary": summary, "losses": losses, "bundle": bundle, "peak": summary["train_peak_bytes"], "rows": rows}


def _weights(bundle: Path) -> dict[str, Any]:
    import torch

    return torch.load(bundle / "model_fold0" / "last.pt", map_location="cpu", weights_only=True)["model"]


def test_a_split_of_two_trains_the_same_steps_as_the_unsplit_run(
        reference: dict[str, Any], demo_bundles: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from autotune.trainer.runner import train

    monkeypatch.setenv("AUTOTUNE_PRECISION", "fp32")
    losses = _record_losses(monkeypatch)
    bundle = copy_bundle(demo_bundles["unet_0"], tmp_path / "unet_0")
    # 90% of the unsplit peak: a 2-patch pass with the optimizer's state does not fit, one patch at a time does
    summary = train(bundle, device="cpu", epochs=2, val_every=1, progress=False,
                    memory_limit=int(0.9 * reference["peak"]))
    assert summary["micro_batches"] == 2 and summary["epochs_run"] == 2
    [event] = [e for e in summary["memory_fallbacks"] if e["phase"] == "training"]
    assert event["peak_bytes"] > summary["memory_limit"] and "split into 2 micro-batches" in event["done"]
    assert "memory: out of memory in training pass of 2 patches" in capsys.readouterr().err
    assert [k for _, k in losses][-1] == 2  # the last passes ran split
    expected = [loss for loss, _ in reference["losses"]]
    assert len(losses) == len(expected)
    for (loss, _), want in zip(losses, expected, strict=True):
        assert abs(loss - want) <= 1e-5 * abs(want), (loss, want)
    for name, tensor in _weights(reference["bundle"]).items():
        torch.testing.assert_close(_weights(bundle)[name], tensor, rtol=1e-5, atol=1e-6)
    rows = json.loads((bundle / "model_fold0" / "metrics.json").read_text())["rows"]
    assert [r["micro_batches"] for r in rows][-1] == 2 and rows[-1]["validation_device"] == "device"
    assert "micro_batches" in (bundle / "model_fold0" / "metrics.csv").read_text().splitlines()[0]


def test_a_first_pass_that_runs_out_in_its_backward_trains_in_micro_batches_of_one(
        reference: dict[str, Any], demo_bundles: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Under a limit between the peaks of one and of two patches per pass, the first 2-patch pass runs out of
    memory in its backward pass, before any pass fit in the process. What that pass left held (its graph, queued
    in autograd's engine) is released, so micro-batches of one patch fit: the run ends with exit 0, the same
    steps as the unsplit run."""
    import torch

    from autotune.cli import main
    from autotune.trainer.runner import train

    monkeypatch.setenv("AUTOTUNE_PRECISION", "fp32")
    one = copy_bundle(demo_bundles["unet_0"], tmp_path / "one", num_patches_per_iter=1)  # the same loader batch
    one_peak = train(one, device="cpu", epochs=2, val_every=1, progress=False, memory_limit="1GiB")["train_peak_bytes"]
    two_peak = reference["peak"]
    assert one_peak < two_peak
    limit = (one_peak + two_peak) // 2
    losses = _record_losses(monkeypatch)
    bundle = copy_bundle(demo_bundles["unet_0"], tmp_path / "unet_0")
    capsys.readouterr()
    code = main(["train", str(bundle), "--device", "cpu", "--epochs", "2", "--val-every", "1", "--quiet",
                 "--memory-limit", str(limit)])
    assert code == 0, capsys.readouterr().err[-2000:]
    summary = json.loads((bundle / "model_fold0" / "train_summary.json").read_text())
    [event] = [e for e in summary["memory_fallbacks"] if e["phase"] == "training"]  # one step-down, no restart
    assert (event["epoch"], event["step"]) == (1, 1) and event["peak_bytes"] > limit == event["limit_bytes"]
    assert event["done"].startswith("split into 2 micro-batches of up to 1 patch")
    assert summary["micro_batches"] == 2 and summary["epochs_run"] == 2
    assert "memory: out of memory in training pass of 2 patches (epoch 1, step 1" in capsys.readouterr().err
    expected = [loss for loss, _ in reference["losses"]]
    assert [k for _, k in losses] == [2] * len(expected)  # every pass applied, split (the failed one is not one)
    for (loss, _), want in zip(losses, expected, strict=True):
        assert abs(loss - want) <= 1e-5 * abs(want), (loss, want)
    for name, tensor in _weights(reference["bundle"]).items():
        torch.testing.assert_close(_weights(bundle)[name], tensor, rtol=1e-5, atol=1e-6)
    rows = json.loads((bundle / "model_fold0" / "metrics.json").read_text())["rows"]
    assert [r["micro_batches"] for r in rows] == [2, 2]
    assert [r["steps"] for r in rows] == [r["steps"] for r in reference["rows"]]
    assert all(r["train_peak_bytes"] <= limit for r in rows)


def test_release_memory_frees_what_a_failed_backward_pass_left_queued() -> None:
    """A backward pass that runs out of memory leaves the nodes autograd's engine had made ready in its queue,
    holding the forward pass's activations; ``release_memory`` drops them (the tracker is back at its start)."""
    import gc

    import torch

    from autotune.probe.tracker import MemoryTracker, tensors_of
    from autotune.trainer.fallback import release_memory

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv3d(1, 4, 3, padding=1), torch.nn.PReLU(), torch.nn.Conv3d(4, 2, 3, padding=1))
    image = torch.randn(2, 1, 12, 12, 12)
    tracker = MemoryTracker("cpu")
    tracker.track([*tensors_of(net), image])
    start, failed = tracker.current_bytes, False
    with tracker:
        logits = net(image)
        loss = logits.square().mean() + logits.abs().mean()  # two branches: one waits in the queue
        # the first gradient of logits' size runs out: the other branch is still queued then
        tracker.limit_bytes = tracker.current_bytes + logits.untyped_storage().nbytes() // 2
        try:
            loss.backward()
        except torch.OutOfMemoryError:
            failed = True
    logits = loss = None
    net.zero_grad(set_to_none=True)
    gc.collect()
    assert failed
    release_memory("cpu")
    assert tracker.current_bytes == start


def _fake_parts(micro_batches: int = 1) -> SimpleNamespace:
    from autotune.trainer.fallback import MemoryFallbacks

    fallbacks = MemoryFallbacks(4, ValidationDevice.DEVICE, "cpu", 1 << 20, say=lambda line: None)
    fallbacks.micro_batches = micro_batches
    recipe = SimpleNamespace(optimizer=SimpleNamespace(zero_grad=lambda set_to_none: None, state={"w": {}}))
    memory = SimpleNamespace(failed_peak=lambda: 2 << 20)
    return SimpleNamespace(fallbacks=fallbacks, recipe=recipe, guard=None, ctx=SimpleNamespace(device="cpu"),
                           memory=memory)


@pytest.mark.parametrize(("patches", "fits_at", "tried"), [(8, 4, [1, 2, 4]), (3, 3, [1, 2, 3]), (1, 1, [1])])
def test_the_splits_tried_under_a_fake_oom(monkeypatch: pytest.MonkeyPatch, patches: int, fits_at: int,
                                           tried: list[int]) -> None:
    import torch

    import autotune.trainer.epoch as epoch

    seen: list[int] = []

    def step(parts: Any, image: Any, label: Any, micro_batches: int) -> Any:
        seen.append(micro_batches)
        if micro_batches < fits_at:
            raise torch.OutOfMemoryError("fake")
        return torch.zeros(())

    monkeypatch.setattr(epoch, "_guarded_step", step)
    parts = _fake_parts()
    epoch._fitted_pass(parts, torch.zeros(patches, 1), torch.zeros(patches, 1), epoch.EpochProgress(1, passes=1))
    assert seen == tried
    assert parts.fallbacks.micro_batches == fits_at
    assert [e["done"].split(" micro")[0] for e in parts.fallbacks.events] == [f"split into {k}" for k in tried[1:]]
    seen.clear()  # the next pass starts split: no OOM paid twice
    epoch._fitted_pass(parts, torch.zeros(patches, 1), torch.zeros(patches, 1), epoch.EpochProgress(1, passes=2))
    assert seen == [fits_at]


def test_an_oom_at_one_patch_ends_with_what_was_tried_and_a_fitted_split_restarts_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    import autotune.trainer.epoch as epoch
    from autotune.trainer.fallback import RestartRun, StepDownsExhausted

    def never(parts: Any, image: Any, label: Any, micro_batches: int) -> Any:
        raise torch.OutOfMemoryError("fake")

    monkeypatch.setattr(epoch, "_guarded_step", never)
    parts = _fake_parts()
    with pytest.raises(StepDownsExhausted, match="the 4-patch pass whole, then in 2 micro-batches, then in 4"):
        epoch._fitted_pass(parts, torch.zeros(4, 1), torch.zeros(4, 1), epoch.EpochProgress(1, passes=1))
    parts = _fake_parts(micro_batches=2)
    parts.fallbacks.fitted_size = 2  # micro-batches of 2 patches trained here: failing now, it restarts the run
    with pytest.raises(RestartRun):
        epoch._fitted_pass(parts, torch.zeros(4, 1), torch.zeros(4, 1), epoch.EpochProgress(1, passes=3))
    parts.fallbacks.restarted, parts.fallbacks.micro_batches = True, 2  # the restarted run steps down instead
    parts.fallbacks.fitted_size = 2
    with pytest.raises(StepDownsExhausted):
        epoch._fitted_pass(parts, torch.zeros(4, 1), torch.zeros(4, 1), epoch.EpochProgress(1, passes=1))
    assert [e["done"].split(" ")[0] for e in parts.fallbacks.events] == ["restart", "split"]


def test_validation_steps_down_to_sw_batch_1_then_to_the_cpu_with_the_same_dice(
        reference: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    import autotune.step as step
    from autotune.bundles.config import load_bundle_config
    from autotune.trainer.ddp import DistContext
    from autotune.trainer.fallback import MemoryFallbacks
    from autotune.trainer.infer import evaluate, load_model
    from autotune.trainer.setup import setup_data

    cfg = load_bundle_config(reference["bundle"])
    ctx = DistContext(device="cpu")
    data = setup_data(cfg, ctx, "fast", 1, None, False)
    model = load_model(cfg, reference["bundle"] / "model_fold0" / "last.pt", "cpu")
    predict, score, scores, calls = step.sliding_window_predict, step.score_case, [], []
    monkeypatch.setattr(step, "score_case", lambda *a: scores.append(score(*a).clone()) or scores[-1])
    expected = evaluate(model, data.val_loader, cfg, "cpu", None, ctx)
    reference_scores, scores[:] = list(scores), []
    # the run's device stands in for a GPU: a window batch above 1, or the volume off the CPU, runs out of memory
    fallbacks = MemoryFallbacks(4, ValidationDevice.DEVICE, "cuda:0", 1 << 20, say=lambda line: None)

    def fake(model: Any, image: Any, roi_size: Any, sw_batch_size: int, device: Any, **kwargs: Any) -> Any:
        cpu = fallbacks.validation_device is ValidationDevice.CPU
        calls.append((sw_batch_size, cpu))
        if sw_batch_size > 1 or not cpu:
            raise torch.OutOfMemoryError("fake")
        return predict(model, image, roi_size, sw_batch_size, device, **kwargs)

    monkeypatch.setattr(step, "sliding_window_predict", fake)
    got = evaluate(model, data.val_loader, cfg, "cpu", None, ctx, fallbacks=fallbacks, epoch=3)
    assert calls[:4] == [(4, False), (2, False), (1, False), (1, True)] and calls[4:] == [(1, True)] * (len(calls) - 4)
    assert [e["done"] for e in fallbacks.events] == [
        "sliding-window batch down to 2", "sliding-window batch down to 1",
        "validation volume moved to the CPU (windows still on the device)"]
    assert fallbacks.in_force() == {"micro_batches": 1, "sw_batch": 1, "validation_device": "cpu"}
    assert len(scores) == len(reference_scores) >= 1
    for case, want in zip(scores, reference_scores, strict=True):
        torch.testing.assert_close(case, want, equal_nan=True)
    assert got == expected
    with pytest.raises(MemoryError, match="sliding-window batch 1 and the volume on the CPU"):
        fallbacks.validation_oom(None, 3, 1)


def test_an_oom_at_one_patch_exits_3_in_one_line_keeping_last_pt(
        reference: dict[str, Any], demo_bundles: dict[str, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from autotune.cli import main

    bundle = copy_bundle(demo_bundles["unet_0"], tmp_path / "unet_0")
    assert main(["train", str(bundle), "--device", "cpu", "--epochs", "1", "--quiet", "--memory-limit", "1GiB"]) == 0
    last = bundle / "model_fold0" / "last.pt"
    before = hashlib.sha256(last.read_bytes()).hexdigest()
    capsys.readouterr()
    low = str(int(0.5 * reference["peak"]))  # one patch at a time does not fit either
    code = main(["train", str(bundle), "--device", "cpu", "--epochs", "2", "--resume", "--quiet", "--memory-limit", low])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3
    assert len([line for line in err if "error" in line]) == 1
    assert "out of memory in training of epoch 2" in err[-1] and "last.pt holds epoch 1" in err[-1]
    assert "tried the 2-patch pass whole, then in 2 micro-batches, the last of one patch each" in err[-1]
    assert [line for line in err if line.startswith("memory:")] != []  # the step-down it tried, said as it happened
    assert hashlib.sha256(last.read_bytes()).hexdigest() == before
    assert torch.load(last, weights_only=True)["epoch"] == 1


def _oom_when(monkeypatch: pytest.MonkeyPatch, fails: Any) -> list[tuple[float, int]]:
    """Record the applied passes (``_record_losses``); a call of the training step for which
    ``fails(call number from 1, micro-batches)`` is true runs out of memory before it computes anything."""
    import torch

    import autotune.step as step

    seen = _record_losses(monkeypatch)
    recorded, calls = step.train_step, [0]

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if fails(calls[0], int(args[8] if len(args) > 8 else kwargs.get("micro_batches", 1))):
            raise torch.OutOfMemoryError("fake: out of memory")
        return recorded(*args, **kwargs)

    monkeypatch.setattr(step, "train_step", failing)
    return seen


def test_a_fitted_split_that_fails_again_restarts_once_inside_its_batch_and_resume_keeps_the_split(
        demo_bundles: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from autotune.trainer.runner import train

    monkeypatch.setenv("AUTOTUNE_PRECISION", "fp32")
    # a loader batch of 4 images in passes of 2: a restart at the batch's second pass continues inside the batch
    reference = copy_bundle(demo_bundles["unet_0"], tmp_path / "reference", num_images_per_batch=4)
    with pytest.MonkeyPatch.context() as patch:
        expected = _record_losses(patch)
        train(reference, device="cpu", epochs=2, progress=False)
    bundle = copy_bundle(demo_bundles["unet_0"], tmp_path / "unet_0", num_images_per_batch=4)
    capsys.readouterr()
    # the first pass fails whole (split 2 fits it, and the next pass beside the optimizer's state); epoch 2's second
    # pass fails in 2: a split that had fit, so the run restarts once, inside that batch
    seen = _oom_when(monkeypatch, lambda call, micro: micro == 1 or call == 5)
    summary = train(bundle, device="cpu", epochs=2, progress=False)
    err = capsys.readouterr().err
    assert [e["done"].split(" ")[0] for e in summary["memory_fallbacks"]] == ["split", "restart"]
    assert summary["micro_batches"] == 2 and "memory: restarting once from" in err and "pass 2 of its batch" in err
    assert len(seen) == len(expected)  # no pass lost or trained twice across the restart
    for (loss, micro), (want, _) in zip(seen, expected, strict=True):
        assert micro == 2 and abs(loss - want) <= 1e-5 * abs(want), (loss, want)
    for name, tensor in _weights(reference).items():
        torch.testing.assert_close(_weights(bundle)[name], tensor, rtol=1e-5, atol=1e-6)
    seen.clear()
    monkeypatch.undo()
    seen = _record_losses(monkeypatch)
    resumed = train(bundle, device="cpu", epochs=3, resume=True, progress=False)
    assert resumed["micro_batches"] == 2 and {micro for _, micro in seen} == {2}
    assert len(resumed["memory_fallbacks"]) == 2  # the first run's record, kept
    rows = json.loads((bundle / "model_fold0" / "metrics.json").read_text())["rows"]
    assert [r["micro_batches"] for r in rows] == [2, 2, 2]


_RANK_HOOK = '''
import json, os
import autotune.step as _step
import autotune.trainer.runner as _runner
_train_step, _micro = _step.train_step, []
def train_step(*args, **kwargs):
    loss = _train_step(*args, **kwargs)
    _micro.append(int(args[8] if len(args) > 8 else kwargs.get("micro_batches", 1)))
    return loss
_step.train_step = train_step
_finish = _runner.TrainingRun._finish
def _dump(self, *args, **kwargs):
    import torch
    torch.save(self.recipe.model.state_dict(), os.path.join(os.environ["RANK_DUMP"], f"rank{self.ctx.rank}.pt"))
    with open(os.path.join(os.environ["RANK_DUMP"], f"rank{self.ctx.rank}.json"), "w") as handle:
        json.dump(_micro, handle)
    return _finish(self, *args, **kwargs)
_runner.TrainingRun._finish = _dump
'''


@pytest.mark.slow
def test_two_ddp_ranks_split_together_and_hold_the_same_weights(
        reference: dict[str, Any], demo_bundles: dict[str, Path], tmp_path: Path) -> None:
    """Two gloo ranks under a limit where a 2-patch pass (with DDP's gradient buckets) does not fit and a split
    does: both split, the gradients are synchronised on the last micro-batch, and the ranks' weights stay equal."""
    import os

    import torch
    from forked_cli import start_cli

    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(_RANK_HOOK)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'hook'}{os.pathsep}{repo}", "OMP_NUM_THREADS": "1",
           "AUTOTUNE_PRECISION": "fp32", "RANK_DUMP": str(tmp_path)}
    bundle = copy_bundle(demo_bundles["unet_0"], tmp_path / "unet_0")
    # between the split's peak under DDP (0.95x the one process's unsplit peak) and the unsplit one's (1.15x)
    limit = str(int(1.05 * reference["peak"]))
    # the launcher forked with torch imported (``forked_cli``); the ranks it spawns are fresh interpreters (the hook)
    proc = start_cli(["train", str(bundle), "--device", "cpu", "--nproc", "2", "--epochs", "2", "-q", "--memory-limit",
                      limit], tmp_path / "train.out", tmp_path / "train.err", env)
    _out, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-2000:]
    summary = json.loads((bundle / "model_fold0" / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["micro_batches"] == 2
    assert "memory: out of memory in training pass of 2 patches" in stderr
    micro = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert micro[0] == micro[1] and micro[0][-1] == 2  # the ranks stepped down at the same pass
    rank0, rank1 = (torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in (0, 1))
    assert all(torch.equal(rank0[name], rank1[name]) for name in rank0)


def test_a_split_step_syncs_gradients_on_its_last_micro_batch_only() -> None:
    import contextlib

    import torch

    from autotune.step import micro_batch_sizes, train_step

    class Wrapped(torch.nn.Module):
        """Stands in for DistributedDataParallel: counts the micro-batches run outside ``no_sync``."""

        def __init__(self) -> None:
            super().__init__()
            self.inner, self.synced, self.unsynced, self.sync = torch.nn.Linear(3, 1), [], [], True

        @contextlib.contextmanager
        def no_sync(self):  # noqa: ANN202
            self.sync = False
            yield
            self.sync = True

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            (self.synced if self.sync else self.unsynced).append(int(x.shape[0]))
            return self.inner(x)

    torch.manual_seed(0)
    model = Wrapped()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    images, labels = torch.randn(5, 3), torch.randn(5, 1)
    whole = torch.nn.functional.mse_loss(model.inner(images), labels).item()
    loss = train_step(model, torch.nn.functional.mse_loss, optimizer, images, labels, micro_batches=3)
    assert model.unsynced == [2, 2] and model.synced == [1]  # the gradient sync rides on the last micro-batch
    assert abs(float(loss) - whole) <= 1e-6 and micro_batch_sizes(5, 3) == [2, 2, 1]


def test_a_split_says_where_it_is_not_exact() -> None:
    import torch

    from autotune.bundles.model import Section
    from autotune.trainer.fallback import MemoryFallbacks, batch_reducing_parts

    per_sample = torch.nn.Sequential(torch.nn.Conv3d(1, 2, 1), torch.nn.InstanceNorm3d(2), torch.nn.GroupNorm(1, 2))
    assert batch_reducing_parts(Section(name="DiceCELoss", args={}), per_sample) == []
    pooled = torch.nn.Sequential(torch.nn.Conv3d(1, 2, 1), torch.nn.BatchNorm3d(2))
    parts = batch_reducing_parts(Section(name="DiceLoss", args={"batch": True}), pooled)
    assert parts == ["BatchNorm3d", "DiceLoss with batch: true"]
    assert batch_reducing_parts(Section(name="DiceLoss", batch=True), per_sample) == ["DiceLoss with batch: true"]
    lines: list[str] = []
    fallbacks = MemoryFallbacks(1, ValidationDevice.DEVICE, "cpu", 1 << 20, say=lines.append,
                                exact_note=", ".join(parts))
    event = fallbacks.training_oom(4, 3 << 20, 1, 1)
    assert "not exact here: BatchNorm3d, DiceLoss with batch: true reduce over the batch" in event["done"]
    assert lines == [f"memory: out of memory in training pass of 4 patches (epoch 1, step 1, peak 3.00 MiB under "
                     f"1.00 MiB): {event['done']}"]
