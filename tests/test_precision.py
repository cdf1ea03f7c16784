"""Mixed precision by capability (``autotune.precision``): bf16 only where the CPU runs it natively,
fp16 + GradScaler on CUDA, an override both ways, and one precision from probe to training."""

from __future__ import annotations

from pathlib import Path

import pytest
from bundle_fixtures import copy_bundle
from config_fixtures import bundle_config

from autotune.errors import SpecError
from autotune.precision import CPU_BF16_ENV, PRECISION_ENV, for_bundle, resolve_precision

# the least a tuning block holds (autotune.bundles.plan.TuningPlan)
PLAN = {"num_patches_per_iter": 1, "num_sw_batch_size": 1, "memory_limit": 2**30}
MiB = 1024**2


@pytest.fixture()
def emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU without native bfloat16, whatever this machine is; nothing forced."""
    monkeypatch.setenv(CPU_BF16_ENV, "emulated")
    monkeypatch.delenv(PRECISION_ENV, raising=False)


@pytest.fixture()
def native(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CPU_BF16_ENV, "native")
    monkeypatch.delenv(PRECISION_ENV, raising=False)


def test_amp_means_bf16_only_on_a_cpu_that_runs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PRECISION_ENV, raising=False)
    monkeypatch.setenv(CPU_BF16_ENV, "emulated")
    p = resolve_precision(True, "cpu")
    assert p.name == "fp32" and not p.autocast and "no native bfloat16" in p.reason
    monkeypatch.setenv(CPU_BF16_ENV, "native")
    assert resolve_precision(True, "cpu").name == "bf16"
    assert resolve_precision(False, "cpu").name == "fp32"
    assert resolve_precision(True, "cuda:1").name == "fp16"
    assert resolve_precision(False, "cuda").name == "fp32"


def test_a_template_not_shown_to_train_in_bf16_on_the_cpu_keeps_fp32(native: None,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.bundles.templates import load_template
    from autotune.precision import for_config

    assert load_template("unet")["training"]["cpu_bf16"] is False
    assert all("cpu_bf16" not in load_template(algo)["training"] for algo in ("segresnet", "dints"))
    unet = bundle_config(amp=True, cpu_bf16=False)
    chosen = for_config(unet, "cpu")
    assert chosen.name == "fp32" and "cpu_bf16: false" in chosen.reason
    assert for_config(bundle_config(amp=True), "cpu").name == "bf16"  # a template that does not say
    assert for_config(unet, "cuda:0").name == "fp16"  # a CPU rule: CUDA keeps fp16 + GradScaler
    monkeypatch.setenv(PRECISION_ENV, "bf16")
    assert for_config(unet, "cpu").name == "bf16"  # forced


def test_cpu_autocast_keeps_cudas_float32_list() -> None:
    import torch

    from autotune.autocast import autocast

    conv, norm = torch.nn.Conv3d(2, 4, 1), torch.nn.GroupNorm(2, 4)
    x = torch.randn(1, 2, 4, 4, 4)
    with autocast("cpu", torch.bfloat16):
        y = conv(x)
        assert y.dtype == torch.bfloat16  # convolutions stay in the low precision
        assert torch.softmax(y, 1).dtype == y.sum().dtype == torch.exp(y).dtype == torch.float32
        assert norm(y).dtype == torch.bfloat16  # normalization and interpolation stay in bf16 on the CPU
        assert torch.nn.functional.interpolate(y, scale_factor=2, mode="trilinear").dtype == torch.bfloat16
        assert y.sum(dtype=torch.bfloat16).dtype == torch.bfloat16  # an explicit dtype is kept
    with torch.autocast("cpu", dtype=torch.bfloat16):  # PyTorch's own CPU autocast, for contrast
        assert torch.softmax(conv(x), 1).dtype == torch.bfloat16
    with autocast("cpu", None):
        assert torch.softmax(conv(x), 1).dtype == torch.float32


def test_the_override_forces_either_way_and_bad_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CPU_BF16_ENV, "emulated")
    monkeypatch.setenv(PRECISION_ENV, "bf16")
    forced = resolve_precision(False, "cpu")
    assert forced.name == "bf16" and forced.forced and PRECISION_ENV in forced.reason
    monkeypatch.setenv(PRECISION_ENV, "FP32")
    assert resolve_precision(True, "cuda:0").name == "fp32"
    monkeypatch.setenv(PRECISION_ENV, "auto")
    assert resolve_precision(True, "cpu").name == "fp32" and not resolve_precision(True, "cpu").forced
    monkeypatch.setenv(PRECISION_ENV, "fp16")
    with pytest.raises(SpecError, match="fp16 on the CPU"):
        resolve_precision(True, "cpu")
    assert resolve_precision(True, "cuda").name == "fp16"
    monkeypatch.setenv(PRECISION_ENV, "half")
    with pytest.raises(SpecError, match=PRECISION_ENV):
        resolve_precision(True, "cpu")
    monkeypatch.delenv(PRECISION_ENV)
    monkeypatch.setenv(CPU_BF16_ENV, "maybe")
    with pytest.raises(SpecError, match=CPU_BF16_ENV):
        resolve_precision(True, "cpu")


def test_a_yes_from_onednn_is_confirmed_by_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune import precision

    monkeypatch.delenv(CPU_BF16_ENV, raising=False)
    monkeypatch.setattr(precision, "_onednn_says_bf16", lambda: True)
    monkeypatch.setattr(precision, "_bf16_ratio", lambda: 80.0)  # emulated: ~100x slower
    precision._detected.cache_clear()
    try:
        native, how = precision.cpu_bf16_native()
        assert not native and "80x slower" in how
        precision._detected.cache_clear()
        monkeypatch.setattr(precision, "_bf16_ratio", lambda: 0.6)
        assert precision.cpu_bf16_native()[0]
        precision._detected.cache_clear()
        monkeypatch.setattr(precision, "_onednn_says_bf16", lambda: False)
        monkeypatch.setattr(precision, "_bf16_ratio", lambda: pytest.fail("no timing after a no"))
        assert precision.cpu_bf16_native() == (False, "oneDNN bf16 check: no")
    finally:
        precision._detected.cache_clear()


def test_the_real_check_answers_here_and_the_timing_is_a_ratio() -> None:
    from autotune import precision

    native, how = precision._detected.__wrapped__()  # uncached, whatever the environment says
    assert isinstance(native, bool) and "oneDNN" in how
    assert precision._bf16_ratio(reps=1) > 0


def test_training_keeps_the_tuned_precision_and_warns_when_this_machine_differs(emulated: None) -> None:
    chosen, warning = for_bundle(_tuned_in("bf16", "cpu"), "cpu")
    assert chosen.name == "bf16" and "as tuned" in chosen.reason
    assert warning is not None and "tuned in bf16" in warning and "fp32" in warning
    assert for_bundle(_tuned_in("fp32", "cpu"), "cpu") == (for_bundle(_tuned_in("fp32", "cpu"), "cpu")[0], None)
    # tuned on another kind of device: decided here, no tuned memory to keep
    assert for_bundle(_tuned_in("fp16", "cuda:0"), "cpu")[0].name == "fp32"
    assert for_bundle(bundle_config(amp=True), "cpu")[0].name == "fp32"


def _tuned_in(precision: str, device: str) -> object:
    """A config with ``amp: true`` tuned in ``precision`` on ``device``."""
    return bundle_config(amp=True, tuning={**PLAN, "precision": precision, "device": device})


def test_forcing_another_precision_than_the_tuned_one_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PRECISION_ENV, "fp32")
    chosen, warning = for_bundle(_tuned_in("bf16", "cpu"), "cpu")
    assert chosen.name == "fp32" and chosen.forced
    assert warning is not None and "memory figures do not hold" in warning


def test_the_precision_is_part_of_the_tuning_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from config_fixtures import bundle_config

    from autotune.search.storage.study import make_key

    cfg = bundle_config(amp=True)
    info = {"device": "cpu", "device_name": "cpu", "device_total_memory": 8 * 1024**3}
    monkeypatch.delenv(PRECISION_ENV, raising=False)
    monkeypatch.setenv(CPU_BF16_ENV, "native")
    bf16 = make_key(cfg, info, 1024**3, "fast")
    monkeypatch.setenv(CPU_BF16_ENV, "emulated")
    fp32 = make_key(cfg, info, 1024**3, "fast")
    assert (bf16.precision, fp32.precision) == ("bf16", "fp32")
    assert bf16.study_name != fp32.study_name  # a study measured in bf16 never answers for an fp32 machine


def test_no_native_bf16_means_fp32_from_estimate_and_probe_to_tuning_and_training(
        emulated: None, demo_bundles_one_fold: dict[str, Path], tmp_path: Path) -> None:
    import optuna

    from autotune.bundles.config import load_bundle_config
    from autotune.probe.estimate import estimate
    from autotune.probe.runner import run_probe
    from autotune.stages import tune
    from autotune.trainer.runner import train

    bundle = copy_bundle(demo_bundles_one_fold["unet_0"], tmp_path / "unet_0")
    assert load_bundle_config(bundle).amp is True  # the template asks for mixed precision
    assert estimate(bundle, num_patches_per_iter=1, phases=("train",))["precision"] == "fp32"
    probe = run_probe(bundle, num_patches_per_iter=1, num_sw_batch_size=1)
    assert probe["status"] == "ok" and probe["precision"] == "fp32"
    lines: list[str] = []
    storage = f"sqlite:///{tmp_path / 's.db'}"
    [result] = tune([bundle], device="cpu", memory_limit=40 * MiB, storage=storage, progress=lines.append,
                            specs={"universal": {"range_num_images_per_batch": [1, 4],
                                                 "range_num_sw_batch_size": [1, 2]}})
    assert result["status"] == "tuned" and result["precision"] == "fp32"
    assert [line for line in lines if line.startswith("precision ")] == [
        resolve_precision(True, "cpu").line()]  # said once, with the reason
    plan = load_bundle_config(bundle).plan
    assert plan.precision == "fp32" and plan.key["precision"] == "fp32"
    study = optuna.load_study(study_name=result["study_name"], storage=storage)
    assert {t.user_attrs.get("precision") for t in study.trials} == {"fp32"}  # every probe and estimate
    summary = train(bundle, device="cpu", epochs=1, val_every=1, progress=False)
    assert summary["precision"] == "fp32" and summary["precision_reason"] == "as tuned (tuning.precision)"


def test_cli_precision_flag_reaches_the_estimate_and_a_bad_variable_is_one_line(
        emulated: None, demo_bundles_one_fold: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from autotune.cli import main

    bundle = copy_bundle(demo_bundles_one_fold["unet_0"], tmp_path / "unet_0")
    monkeypatch.setenv(PRECISION_ENV, "auto")  # main() sets it from --precision; restored after the test
    assert main(["estimate", str(bundle), "--precision", "bf16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["estimate"]["precision"] == "bf16"
    monkeypatch.setenv(PRECISION_ENV, "half")
    assert main(["estimate", str(bundle), "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and PRECISION_ENV in err[0]
