"""The FakeTensorMode estimate against the probe's measured tracked peak, and the affine model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from probe_fixtures import ALGOS, shared_tiny_bundles

from autotune.errors import ConfigError, ProbeError
from autotune.probe.estimate import estimate, fit_memory_model
from autotune.probe.runner import resolve_request
from autotune.probe.trial import run_trial


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return shared_tiny_bundles(tmp_path_factory)


@pytest.mark.parametrize("algo", ALGOS)
def test_estimate_matches_measured_peak(bundles: dict[str, Path], algo: str) -> None:
    """run_trial is exactly what the probe's child runs; in-process here to keep the test quick. The
    infer phase is measured alone: it sets up gradients and optimizer state as after a training step,
    so it measures the same as after the train phase (the estimate runs both phases in turn)."""
    sizes = {"num_patches_per_iter": 1, "num_sw_batch_size": 2}
    train = run_trial(resolve_request(bundles[algo], phases=("train",), warmup_steps=1, measure_steps=1, **sizes))
    infer = run_trial(resolve_request(bundles[algo], phases=("infer",), warmup_steps=0, measure_steps=1, **sizes))
    assert train["status"] == "ok" and infer["status"] == "ok", (train["error_tail"], infer["error_tail"])
    est = estimate(bundles[algo], **sizes)
    assert est["measured"] is False and est["seconds"] > 0
    for phase, measured in (("train", train), ("infer", infer)):
        real, guess = measured[f"{phase}_peak_bytes"], est[f"{phase}_peak_bytes"]
        assert real > 0
        assert abs(guess - real) / real <= 0.05, (phase, guess, real)
    assert est["peak_bytes"] == max(est["train_peak_bytes"], est["infer_peak_bytes"])
    assert estimate(bundles[algo], phases=("infer",), **sizes)["infer_peak_bytes"] == est["infer_peak_bytes"]


def test_other_loss_and_optimizer(bundles: dict[str, Path]) -> None:
    """DiceFocal runs as is; Novograd reads ``if exp_avg_sq == 0`` (answered False, counted)."""
    from autotune.bundles.config import load_bundle_config

    config = load_bundle_config(bundles["unet"]).with_values(
        loss={"name": "DiceFocalLoss", "args": {"to_onehot_y": True, "softmax": True}},
        optimizer={"name": "Novograd", "args": {}})
    measured = run_trial(resolve_request(config, phases=("train",), warmup_steps=1, measure_steps=1))
    assert measured["status"] == "ok", measured["error_tail"]
    est = estimate(config, phases=("train",))
    assert est["guessed_values"] > 0
    assert abs(est["train_peak_bytes"] - measured["train_peak_bytes"]) / measured["train_peak_bytes"] <= 0.05


def test_estimate_leaves_no_patches_behind(bundles: dict[str, Path]) -> None:
    import monai.inferers.utils as sw_utils
    from monai.data.utils import compute_importance_map

    estimate(bundles["unet"], phases=("infer",))
    assert sw_utils.compute_importance_map is compute_importance_map
    assert not torch.is_autocast_enabled("cpu")


def test_fit_memory_model_predicts_a_third_point(bundles: dict[str, Path]) -> None:
    model = fit_memory_model(bundles["unet"], phase="train", n_values=(1, 2))
    assert model.slope > 0 and model.phase == "train" and len(model.points) == 2
    third = estimate(bundles["unet"], num_patches_per_iter=4, phases=("train",))["train_peak_bytes"]
    assert abs(model.predict(4) - third) / third <= 0.02
    infer = fit_memory_model(bundles["unet"], phase="infer")
    assert infer.cap is not None and infer.cap >= 1
    assert infer.max_fitting(1e15) == infer.cap


@pytest.mark.parametrize("validation_device", ["device", "cpu"])
def test_cuda_target_estimate(bundles: dict[str, Path], validation_device: str) -> None:
    est = estimate(bundles["segresnet"], device="cuda:0", validation_device=validation_device)
    assert est["semantics"] == ("cuda" if torch.cuda.is_available() else "cpu-emulating-cuda")
    assert est["train_peak_bytes"] > 0 and est["infer_peak_bytes"] > 0
    if validation_device == "cpu":  # the volume and the stitched output are not on the GPU
        on_device = estimate(bundles["segresnet"], device="cuda:0", phases=("infer",))
        assert est["infer_peak_bytes"] < on_device["infer_peak_bytes"]


def test_cuda_autocast_emulation_matches_cuda_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU-only build the CUDA estimate runs CPU autocast with CUDA's float32 list; compare the
    output dtypes with fake CUDA tensors under real CUDA autocast (forward only, no autograd)."""
    import torch.cuda.amp.common as amp_common
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autotune.probe.fake import CudaAutocastPolicy

    ops = {
        "conv3d": lambda x, w: F.conv3d(x, w, padding=1),
        "group_norm": lambda x, w: F.group_norm(x, 2),
        "instance_norm": lambda x, w: F.instance_norm(x),
        "batch_norm": lambda x, w: F.batch_norm(x, None, None, training=True),
        "layer_norm": lambda x, w: F.layer_norm(x, x.shape[-1:]),
        "softmax": lambda x, w: torch.softmax(x, 1),
        "log_softmax": lambda x, w: F.log_softmax(x, 1),
        "relu": lambda x, w: F.relu(x),
        "prelu": lambda x, w: F.prelu(x, torch.ones(1, device=x.device)),
        "trilinear": lambda x, w: F.interpolate(x, scale_factor=2, mode="trilinear"),
        "sum": lambda x, w: torch.sum(x, [2, 3, 4]),
        "pow": lambda x, w: x**2,
        "exp": lambda x, w: x.exp(),
        "cat": lambda x, w: torch.cat([x, x.float()], 1),
        "mul": lambda x, w: x * x,
        "mean": lambda x, w: x.mean(),
        "max_pool3d": lambda x, w: F.max_pool3d(x, 2),
        "cross_entropy": lambda x, w: F.cross_entropy(
            x, torch.zeros((x.shape[0], *x.shape[2:]), dtype=torch.long, device=x.device)),
    }

    def dtypes(device: str) -> dict[str, torch.dtype]:
        x = torch.randn(2, 4, 6, 6, 6, device=device).half()
        w = torch.randn(4, 4, 3, 3, 3, device=device)
        with torch.autocast(device, dtype=torch.float16):
            return {name: op(x, w).dtype for name, op in ops.items()}

    with FakeTensorMode(), CudaAutocastPolicy():
        emulated = dtypes("cpu")
    if not torch.cuda.is_available():
        monkeypatch.setattr(amp_common, "amp_definitely_not_available", lambda: False)
    with FakeTensorMode():
        cuda = dtypes("cuda")
    assert emulated == cuda


def test_estimate_bad_arguments(bundles: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ProbeError, match="num_patches_per_iter"):
        estimate(bundles["unet"], num_patches_per_iter=0)
    with pytest.raises(ProbeError, match="device"):
        estimate(bundles["unet"], device="tpu")
    with pytest.raises(ProbeError, match="phase"):
        estimate(bundles["unet"], phases=("validate",))
    with pytest.raises(ProbeError, match="n_values"):
        fit_memory_model(bundles["unet"], n_values=(2, 2))
    with pytest.raises(ConfigError):
        estimate(tmp_path / "missing")
