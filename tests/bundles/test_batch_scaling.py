"""The batch handed to training: the training-set cap, the learning-rate rule and the
sample-counted schedule (README "Batch, learning rate and schedule")."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from bundle_fixtures import copy_bundle
from config_fixtures import bundle_config

from autotune.bundles.config import load_bundle_config
from autotune.bundles.model import BundleConfig
from autotune.bundles.scaling import (
    coverage_cap,
    plan_schedule,
    scaled_learning_rate,
    steps_per_epoch,
)
from autotune.errors import ConfigError
from autotune.stages import tune


@pytest.fixture(scope="module")
def bundles(demo_bundles: dict[str, Path]) -> dict[str, Path]:
    """The session's demo bundles (two folds): copied before a test changes one."""
    return demo_bundles


def _tune(bundle: Path, storage: str, batch: int, capture: list[str] | None = None) -> BundleConfig:
    """Tune with the estimator alone over the range [batch, batch] (an explicit range is searched as given)."""
    specs = {"universal": {"range_num_images_per_batch": [batch, batch]}}
    say = capture.append if capture is not None else None
    (result,) = tune([bundle], specs, device="cpu", memory_limit="2GiB", storage=storage,
                             strategy="estimate", progress=say)
    assert result["status"] == "tuned" and result["num_patches_per_iter"] == batch
    return load_bundle_config(bundle)


def test_coverage_cap_follows_nnunet_rule() -> None:
    # the shared hippocampus fold: 128 cases of 35.5 x 50 x 36 voxels, UNet patch 48 x 64 x 48
    cap = coverage_cap(128, [35.5, 50, 36], [48, 64, 48], reference_batch=2)
    assert cap.value == round(0.05 * 128 * 35.5 * 50 * 36 / (48 * 64 * 48)) == 3
    assert coverage_cap(1280, [35.5, 50, 36], [48, 64, 48], reference_batch=2).value == 28
    # never below nnU-Net's minimum of 2, nor below the template's own batch
    assert coverage_cap(4, [32, 32, 32], [32, 32, 32], reference_batch=1).value == 2
    assert coverage_cap(4, [32, 32, 32], [32, 32, 32], reference_batch=5).value == 5


def test_learning_rate_rules() -> None:
    assert scaled_learning_rate(0.01, 2, 8, "linear") == pytest.approx(0.04)
    assert scaled_learning_rate(2e-4, 2, 8, "sqrt") == pytest.approx(4e-4)
    assert scaled_learning_rate(0.2, 1, 9, "none") == pytest.approx(0.2)
    assert scaled_learning_rate(0.01, 4, 2, "linear") == pytest.approx(0.005)  # a smaller batch scales down
    with pytest.raises(ConfigError, match="lr_scaling"):
        scaled_learning_rate(0.01, 2, 4, "quadratic")


def test_steps_per_epoch_counts_forward_passes() -> None:
    assert steps_per_epoch(10, 2, 1, 2) == 5
    assert steps_per_epoch(10, 1, 2, 2) == 10  # 2 crops per image
    assert steps_per_epoch(10, 4, 1, 4) == 3  # a short last batch is one more step
    assert steps_per_epoch(10, 2, 1, 1) == 10  # DiNTS: each image its own step


def _builtin_scheduler(name: str, args: dict, optimizer: Any, total: int) -> Any:
    """MONAI's or PyTorch's own object for the schedule ``name``: what the closed form must equal."""
    import torch
    from monai.optimizers import WarmupCosineSchedule

    if name == "WarmupCosineSchedule":
        return WarmupCosineSchedule(optimizer, warmup_steps=int(round(args["warmup_fraction"] * total)), t_total=total)
    if name == "PolynomialLR":
        return torch.optim.lr_scheduler.PolynomialLR(optimizer, total_iters=total, **args)
    if name == "CosineAnnealingLR":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total, **args)
    return None


@pytest.mark.parametrize("name,args", [("WarmupCosineSchedule", {"warmup_fraction": 0.1}),
                                       ("PolynomialLR", {"power": 0.9}), ("CosineAnnealingLR", {}),
                                       ("none", {})])
def test_closed_form_schedule_equals_the_builtin(name: str, args: dict) -> None:
    import torch

    from autotune.build import build_lr_scheduler

    cfg = bundle_config(lr_scheduler={"name": name, "args": args})
    lrs: dict[str, list[float]] = {}
    for variant, ramp in (("builtin", None), ("closed", (0, 1.0)), ("ramped", (10, 0.25))):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.4)
        sched = _builtin_scheduler(name, args, opt, 50) if ramp is None else build_lr_scheduler(cfg, opt, 50, *ramp)
        lrs[variant] = []
        for _ in range(50):
            lrs[variant].append(opt.param_groups[0]["lr"])
            opt.step()
            if sched is not None:
                sched.step()
    assert lrs["closed"] == pytest.approx(lrs["builtin"], rel=1e-6, abs=1e-12)
    # past the ramp the scaled schedule is the template's, step for step
    assert lrs["ramped"][10:] == pytest.approx(lrs["builtin"][10:], rel=1e-6, abs=1e-12)
    if name in ("PolynomialLR", "none"):  # no warm-up of its own: the ramp starts at a quarter of the rate
        assert lrs["ramped"][0] == pytest.approx(0.25 * 0.4)
        assert lrs["ramped"][5] == pytest.approx(lrs["builtin"][5] * (0.25 + 0.75 * 5 / 10))


def test_a_refitted_schedule_follows_its_new_length() -> None:
    """A run re-planned to a time budget: the decay ends at the new total, the warm-up follows it, and the
    state a checkpoint keeps is plain data that puts the planned length back."""
    import torch

    from autotune.build import build_lr_scheduler
    from autotune.schedule import fitted_schedule_of

    cfg = bundle_config(lr_scheduler={"name": "WarmupCosineSchedule", "args": {"warmup_fraction": 0.1}})
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_lr_scheduler(cfg, opt, 1000)
    factor = fitted_schedule_of(sched)
    assert factor is not None and factor(50) == pytest.approx(0.5)  # half-way up a 100-step warm-up
    factor.refit(200)
    assert factor(10) == pytest.approx(0.5) and factor(200) == pytest.approx(0.0, abs=1e-12)
    state = sched.state_dict()
    assert state["lr_lambdas"][0]["total_steps"] == 200
    again = build_lr_scheduler(cfg, torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), 1000)
    again.load_state_dict(state)
    assert fitted_schedule_of(again).total_steps == 200


def test_doubling_the_batch_scales_lr_and_halves_steps(bundles: dict[str, Path], tmp_path: Path) -> None:
    """The README's rule: batch x2 -> lr x2 (linear) or x sqrt(2) (sqrt), and half the optimizer steps per
    epoch over the same samples; training runs exactly that many steps at that rate. UNet's bundle is
    given the linear rule (its template's is sqrt), SegResNet keeps its own sqrt."""
    from autotune.trainer.runner import train

    storage = f"sqlite:///{tmp_path / 's.db'}"
    for algo, rule, factor in (("unet", "linear", 2.0), ("segresnet", "sqrt", math.sqrt(2.0))):
        cfgs, steps = {}, {}
        scaling = {**load_bundle_config(bundles[f"{algo}_0"]).batch_scaling.model_dump(exclude_unset=True),
                   "lr_scaling": rule}
        for batch in (2, 4):
            bundle = copy_bundle(bundles[f"{algo}_0"], tmp_path / f"{algo}_{batch}", num_epochs=2,
                                 batch_scaling=scaling)
            cfg = cfgs[batch] = _tune(bundle, storage, batch)
            recipe = cfg.plan.recipe
            assert recipe["learning_rate"]["before"] == cfg.batch_scaling.reference_learning_rate
            assert recipe["learning_rate"]["after"] == cfg.learning_rate
            cases = recipe["schedule"]["train_cases"]
            assert recipe["schedule"]["steps_per_epoch"]["after"] == plan_schedule(cfg, cases, 1).steps_per_epoch
            if algo == "unet":  # run it: the trainer takes these steps at this rate
                summary = train(bundle, device="cpu", epochs=1, progress=False)
                row = json.loads(Path(summary["metrics_json"]).read_text())["rows"][0]
                steps[batch] = row["steps"]
                assert row["samples"] == recipe["schedule"]["samples_per_epoch"]
                assert row["steps"] == recipe["schedule"]["steps_per_epoch"]["after"]
        assert cfgs[4].learning_rate == pytest.approx(factor * cfgs[2].learning_rate)
        assert cfgs[2].learning_rate == pytest.approx(cfgs[2].batch_scaling.reference_learning_rate)
        s2 = cfgs[2].plan.recipe["schedule"]
        s4 = cfgs[4].plan.recipe["schedule"]
        assert s4["total_samples"] == s2["total_samples"]  # the schedule counts samples, not epochs
        assert s4["steps_per_epoch"]["after"] == math.ceil(s2["steps_per_epoch"]["after"] / 2)
        # a scaled-up rate ramps from the reference rate over one epoch of samples
        assert cfgs[4].lr_warmup_samples == s4["samples_per_epoch"]
        assert cfgs[4].lr_warmup_start_factor == pytest.approx(1 / factor)
        assert cfgs[2].lr_warmup_samples == 0
        if steps:
            assert steps[4] == math.ceil(steps[2] / 2)


def test_default_range_is_capped_and_explicit_range_warns(bundles: dict[str, Path], tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    capped = copy_bundle(bundles["unet_0"], tmp_path / "capped")
    (result,) = tune([capped], device="cpu", memory_limit="2GiB", storage=storage, strategy="estimate",
                             progress=None)
    batch = result["batch"]
    cap = batch["cap"]
    assert cap["applied"] and not cap["explicit_range"] and "nnU-Net" in cap["rule"]
    assert cap["value"] == 2  # a handful of tiny cases: nnU-Net's floor of 2
    assert batch["searched_range"] == [1, 2] and batch["handed_to_training"] == 2
    assert batch["predicted_largest_fit"] > 2 and "cap" in batch["reason"]
    assert load_bundle_config(capped).plan.batch["cap"]["value"] == 2

    lines: list[str] = []
    explicit = copy_bundle(bundles["unet_0"], tmp_path / "explicit")
    cfg = _tune(explicit, storage, 6, lines)
    warnings = [line for line in lines if "warning" in line]
    assert len(warnings) == 1 and "passes the training-set cap 2" in warnings[0]
    assert cfg.num_patches_per_iter == 6 and cfg.plan.batch["cap"]["applied"] is False
    assert cfg.learning_rate == pytest.approx(math.sqrt(3) * cfg.batch_scaling.reference_learning_rate)  # sqrt rule


def test_overridden_learning_rate_is_the_new_reference(demo_data: Path, tmp_path: Path) -> None:
    from autotune.bundles.templates import load_overrides
    from autotune.data.analyze import analyze
    from autotune.facade.bundlegen import BundleGen

    res = analyze(demo_data, tmp_path, num_fold=2, progress=False)
    overrides = {**load_overrides("tiny"), "learning_rate": 0.003}
    (bundle, *_) = BundleGen(tmp_path, algos="unet", data_stats_filename=res.datastats,
                             data_src_cfg_name=res.data_src).generate(tmp_path, num_fold=2, overrides=overrides)
    cfg = load_bundle_config(bundle["path"])
    assert cfg.batch_scaling.reference_learning_rate == 0.003
    assert cfg.batch_scaling.reference_batch == cfg.num_patches_per_iter == 2


def test_batch_report_says_why_the_handed_batch_differs() -> None:
    from autotune.search.handoff import batch_report

    capped = {"applied": True, "range": [1, 3], "template_range": [1, 64], "train_cases": 128}
    by_cap = batch_report({"num_patches_per_iter": 3, "max_num_patches_per_iter": 3}, capped, 90)
    # the estimator's N at the budget, past the template's range: what memory would hold
    assert by_cap["predicted_largest_fit"] == 90 and "training-set cap 3" in by_cap["reason"]
    assert by_cap["reason"].endswith("memory would hold about 90 (the estimator's N at the budget, not probed)")
    by_speed = batch_report({"num_patches_per_iter": 2, "max_num_patches_per_iter": 3}, capped, 40)
    assert by_speed["handed_to_training"] == 2 and "faster" in by_speed["reason"]
    open_range = {"applied": False, "range": [1, 64], "template_range": [1, 64]}
    by_memory = batch_report({"num_patches_per_iter": 9, "max_num_patches_per_iter": 9}, open_range, 9)
    assert by_memory["largest_fit_in_range"] == 9 and by_memory["reason"].startswith("memory")
