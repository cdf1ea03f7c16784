"""Training to a wall-clock budget: the plan from the first batches, the plans at epoch ends, the cadence,
and a real run whose schedule its --max-time sets (the lr decays to the planned end; the record says so)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.trainer.budget import FIRST_FIT_BATCHES, VALIDATIONS, TimeFit, schedule_set_by


def _fit(budget: float = 100.0, batches: int = 10, **kwargs) -> TimeFit:
    return TimeFit(budget_s=budget, batches_per_epoch=batches, planned_epochs=300, val_every=5, **kwargs)


def test_who_sets_the_schedule() -> None:
    assert schedule_set_by(5, None) == "epochs" and schedule_set_by(5, 60.0) == "epochs"
    assert schedule_set_by(None, 60.0) == "max_time" and schedule_set_by(None, None) == "config"


def test_the_first_plan_comes_from_the_timed_batches_after_the_first() -> None:
    """1 s per batch after a slow first batch, 10 batches per epoch, 100 s: 10 s of training and 1 s of
    assumed validation per epoch; the epoch in progress finishes in 5 s and the last validation takes 1 s,
    so 1 + (100 - 5 - 5 - 1) // 11 = 9."""
    fit = _fit()
    assert fit.batch_done(0.0, 0.0, 1, 1) is None  # the first batch (one-off set-up) starts the clock
    plans = [fit.batch_done(float(k), float(k), 1, k + 1) for k in range(1, FIRST_FIT_BATCHES + 1)]
    assert plans[:-1] == [None] * (FIRST_FIT_BATCHES - 1)
    assert plans[-1] == 1 + (100 - FIRST_FIT_BATCHES - (10 - FIRST_FIT_BATCHES - 1) - 1) // 11
    assert fit.planned_epochs == plans[-1] and fit.refits[0]["after"] == "first batches"
    assert fit.batch_done(9.0, 9.0, 1, 9) is None  # planned once; epoch ends plan from here on
    resumed = _fit()  # a run resumed in epoch 7 plans from there
    for k in range(FIRST_FIT_BATCHES + 1):
        planned = resumed.batch_done(float(k), float(k), 7, k + 1)
    assert planned == plans[-1] + 6  # the same time left, counted from epoch 7


def test_epoch_ends_plan_again_from_the_timed_epochs() -> None:
    """After the first epoch, an epoch costs the time between epoch ends (validation and checkpoints
    included); one whole validation is kept for the last epoch."""
    fit = _fit(budget=100.0)
    # only epoch 1 timed: its 30 s of training, validation assumed 10 % of it (3 s) every 5 epochs
    assert fit.epoch_done(1, 30.0, elapsed=35.0) == 1 + int((65 - 3) // (30 + 3 / 5))
    fit.validated(4.0)
    assert fit.epoch_done(2, 10.0, elapsed=49.0) == 2 + int((51 - 4) // 14)  # 14 s from one end to the next
    assert fit.epoch_done(3, 10.0, elapsed=59.0) == 3 + int((41 - 4) // 12)  # (59 - 35) / 2
    assert fit.epoch_done(5, 10.0, elapsed=95.0) == 5  # nothing more fits: this epoch is the last


def test_the_cadence_spreads_validations_and_caps_their_share() -> None:
    fit = _fit(budget=1000.0, batches=1)
    fit.epoch_done(1, 1.0, elapsed=1.0)
    assert fit.val_every == max(1, round(fit.planned_epochs / VALIDATIONS))
    fit.validated(5.0)  # validation costs 5 epochs' training: at most a tenth of the time -> every 50
    fit.epoch_done(2, 1.0, elapsed=10.0)
    assert fit.val_every >= 50
    fixed = _fit(budget=1000.0, batches=1, fixed_val_every=True)
    fixed.epoch_done(1, 1.0, elapsed=1.0)
    assert fixed.val_every == 5  # --val-every given: kept


class _Ticks:
    """A virtual clock: one second per reading, so the run's plan depends on its code, not on the machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_a_run_to_a_time_budget_fits_its_schedule(bundle: Path, bundles: dict[str, Path], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A real run with --max-time and no --epochs, on a virtual clock: it plans from its timed batches and
    epochs (the record says max_time set the schedule), validates its last epoch, ends within the budget,
    and its learning rate comes down the schedule's decay to near its end at the planned last epoch
    (warm-up cosine: 0 at the end; planned for the bundle's 300 epochs it would still be near its peak).
    With --epochs the epoch count sets the schedule and --max-time only stops."""
    from bundle_fixtures import copy_bundle

    from autotune.trainer.runner import TrainingRun, train

    monkeypatch.setattr(TrainingRun, "clock", staticmethod(_Ticks()))
    summary = train(bundle, device="cpu", max_time=20.0, progress=False)
    schedule = summary["schedule"]
    assert schedule["set_by"] == "max_time" and schedule["refits"] and schedule["planned_epochs"] >= 3
    rows = json.loads(Path(summary["metrics_json"]).read_text())["rows"]
    assert summary["stopped"] == "max_time" and rows[-1]["epoch"] == schedule["planned_epochs"]
    assert rows[-1]["mean_dice"] is not None and rows[-1]["elapsed_s"] <= 20.0
    peak = max(r["lr"] for r in rows)
    assert rows[-1]["lr"] <= 0.1 * peak
    assert all(r["planned_epochs"] >= r["epoch"] for r in rows)
    for key in ("h2d_s", "compute_s", "data_wait_s", "train_s"):
        assert all(r[key] >= 0 for r in rows)
    assert sum(r["compute_s"] for r in rows) > 0
    fixed = train(copy_bundle(bundles["segresnet_0"], tmp_path / "fixed"), device="cpu", epochs=2, max_time=1e6,
                  progress=False)
    assert fixed["schedule"]["set_by"] == "epochs" and fixed["schedule"]["planned_epochs"] == 2
    assert fixed["epochs_run"] == 2


def test_the_scalers_skipped_steps_are_counted_on_the_device() -> None:
    """fp16's GradScaler skips a step whose gradient overflowed and lowers its scale: counted, the first
    step included (before it the scaler holds no scale tensor yet), and a good step is not."""
    import torch

    from autotune.trainer.epoch import _scale_of, count_scaler_skip

    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    counter = torch.zeros((), dtype=torch.int64)
    for value in (float("inf"), 1.0, float("nan"), 1.0):
        before = _scale_of(scaler)
        optimizer.zero_grad()
        scaler.scale((weight * value).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
        count_scaler_skip(scaler, before, counter)
    assert int(counter) == 2
