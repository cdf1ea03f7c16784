"""Per-GPU calibration of the CUDA allowances: the fit, the file lookup, and where it is used."""

from __future__ import annotations

import json
import random
from pathlib import Path

import optuna
import pytest

from autotune.errors import ConfigError
from autotune.probe.allowances import allowance_for, default_allowance, is_calibrated
from autotune.probe.calibration import (
    calibration_filename,
    calibration_record,
    find_calibration,
    fit_allowance,
    same_gpu,
    write_calibration,
)

MiB = 1024**2
H100 = "NVIDIA H100 80GB HBM3"


def _points(slack: float, workspace: int, jitter: int = 0, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    points = []
    for estimate in (40 * MiB, 300 * MiB, 2100 * MiB, 9000 * MiB, 31000 * MiB):
        reserved = int(estimate * (1 + slack) + workspace + rng.randint(0, jitter))
        points.append({"estimate_bytes": estimate, "reserved_bytes": reserved, "context_bytes": 500 * MiB + estimate % 7})
    return points


def test_fit_recovers_an_exact_allowance() -> None:
    fit = fit_allowance(_points(0.08, 96 * MiB))
    assert fit["allocator_slack_fraction"] == pytest.approx(0.08, abs=1e-4)
    assert fit["cudnn_workspace_bytes"] == 96 * MiB
    assert fit["context_bytes"] == 501 * MiB  # the largest context, rounded up to a MiB
    assert 0 <= fit["max_over_prediction"] < 0.01


def test_fit_covers_every_point_and_stays_tight() -> None:
    points = _points(0.05, 200 * MiB, jitter=64 * MiB, seed=3)
    fit = fit_allowance(points)
    for p in points:
        predicted = p["estimate_bytes"] * (1 + fit["allocator_slack_fraction"]) + fit["cudnn_workspace_bytes"]
        assert predicted >= p["reserved_bytes"]
    # tight: a covering allowance no more generous than the true one plus the jitter
    assert fit["max_over_prediction"] < 0.05 + 2 * 64 * MiB / (40 * MiB) + 0.01
    assert fit["allocator_slack_fraction"] <= 0.05 + 64 / 31000 + 1e-3


def test_fit_prefers_a_workspace_for_a_constant_offset() -> None:
    points = [{"estimate_bytes": e, "reserved_bytes": e + 128 * MiB} for e in (10 * MiB, 1000 * MiB, 5000 * MiB)]
    fit = fit_allowance(points)
    assert fit["allocator_slack_fraction"] == 0.0
    assert fit["cudnn_workspace_bytes"] == 128 * MiB
    assert fit["context_bytes"] == 0


def test_fit_needs_a_point() -> None:
    with pytest.raises(ValueError, match="no measured point"):
        fit_allowance([{"estimate_bytes": 0, "reserved_bytes": 5}])


@pytest.mark.parametrize(("a", "b", "same"), [
    (H100, "NVIDIA H100 80GB", True),          # the catalogue's name for the driver's
    (H100, "nvidia  h100 80gb hbm3", True),
    (H100, "H100 80GB HBM3", True),
    (H100, "NVIDIA H100 NVL", False),
    (H100, "NVIDIA H100 80GB HBM3e", False),
    ("NVIDIA A100 80GB PCIe", "NVIDIA A100 40GB", False),
    ("", H100, False),
])
def test_gpu_names(a: str, b: str, same: bool) -> None:
    assert same_gpu(a, b) is same


def _write(folder: Path, name: str, slack: float = 0.07) -> Path:
    fit = {"context_bytes": 480 * MiB, "cudnn_workspace_bytes": 64 * MiB, "allocator_slack_fraction": slack,
           "max_over_prediction": 0.02, "points": 5}
    record = calibration_record({"name": name, "total_memory": 80 * 1024 * MiB, "driver": "580.1", "torch": "2.11.0",
                                 "cuda": "13.0", "cudnn": 91000}, fit, [], "test")
    return write_calibration(folder, record)


def test_find_calibration_matches_names_and_refuses_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = _write(tmp_path, H100)
    assert path.name == calibration_filename(H100) == "nvidia-h100-80gb-hbm3.json"
    found = find_calibration("NVIDIA H100 80GB", dirs=[tmp_path])
    assert found is not None and found.path == path and found.version == 1
    assert found.allowance.allocator_slack_fraction == 0.07
    assert find_calibration(None, dirs=[tmp_path]) is None
    # a broken file that names no GPU may be this GPU's: refused, naming it (sorted before the good one)
    broken = tmp_path / "a-broken.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError, match=r"a-broken\.json: not JSON"):
        find_calibration(H100, dirs=[tmp_path])
    broken.unlink()
    # a malformed file for this GPU: refused naming the file and the key, never skipped
    negative = tmp_path / "a-negative.json"
    negative.write_text(json.dumps({"gpu_name": H100, "allowance": {
        "context_bytes": -1, "cudnn_workspace_bytes": 0, "allocator_slack_fraction": 0}}))
    with pytest.raises(ConfigError, match=r"a-negative\.json: key 'allowance\.context_bytes': got -1"):
        find_calibration("NVIDIA H100 80GB", dirs=[tmp_path])
    # ... for another GPU: passed over, with a warning that names it and the key
    negative.write_text(negative.read_text().replace(H100, "NVIDIA A100 80GB"))
    capsys.readouterr()
    assert find_calibration(H100, dirs=[tmp_path]).path == path
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: {negative}: key 'allowance.context_bytes'")
    assert "NVIDIA A100 80GB" in err[0] and "not used" in err[0]
    # a good file for another GPU in a user's folder: said once, not used
    other = _write(tmp_path / "more", "NVIDIA A100 80GB")
    assert find_calibration(H100, dirs=[tmp_path / "more"]) is None
    assert find_calibration(H100, dirs=[tmp_path / "more"]) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"note: calibration {other} is not used: it is for NVIDIA A100 80GB, not {H100}"]


def test_first_folder_wins(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    user, shipped = tmp_path / "user", tmp_path / "shipped"
    first = _write(user, H100, slack=0.01)
    shadowed = _write(shipped, H100, slack=0.2)
    (shipped / "zz-broken.json").write_text(json.dumps({"gpu_name": H100}))  # shadowed: not read
    assert find_calibration(H100, dirs=[user, shipped]).allowance.allocator_slack_fraction == 0.01
    err = capsys.readouterr().err
    assert f"note: calibration {shadowed} is not used: {first} comes first" in err
    assert f"calibration {shipped / 'zz-broken.json'} is not used" in err


def test_allowance_for_uses_a_calibration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, H100)
    monkeypatch.setenv("AUTOTUNE_CALIBRATION_DIR", str(tmp_path))
    calibrated = allowance_for("cuda:0", gpu_name=H100)
    assert is_calibrated(calibrated)
    assert (calibrated.context_bytes, calibrated.cudnn_workspace_bytes) == (480 * MiB, 64 * MiB)
    # the provenance names the file used, with its folder (a user's), and the versions it was measured with
    assert str(tmp_path / "nvidia-h100-80gb-hbm3.json") in calibrated.source and "torch 2.11.0" in calibrated.source
    assert allowance_for("cuda:0", gpu_name="Some Other GPU") == default_allowance()
    assert not is_calibrated(default_allowance())
    assert allowance_for("cpu", gpu_name=H100).context_bytes == 0


def test_plan_for_a_catalogue_gpu_records_its_calibration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.search.driver.targets import resolve_target

    _write(tmp_path, H100)
    monkeypatch.setenv("AUTOTUNE_CALIBRATION_DIR", str(tmp_path))
    target = resolve_target("estimate", "h100-80gb", None, "cpu")
    assert target["allowances"]["source"].startswith("calibration")
    assert target["allowances"]["context_bytes"] == 480 * MiB
    other = resolve_target("estimate", "a100-80gb", None, "cpu")
    assert other["allowances"]["source"] == default_allowance().source


def test_cuda_peaks_reach_the_study(tmp_path: Path) -> None:
    """The keys as the probe's child writes them on CUDA are copied onto the trial."""
    from autotune.probe.trial import phase_key
    from autotune.search.strategies.evaluate import Evaluator
    from autotune.search.strategies.outcome import distributions
    from autotune.search.strategies.space import AlgoSpec

    cuda_fields = {phase_key(p, f): 1000 + i for i, (p, f) in enumerate(
        (p, f) for p in ("train", "infer") for f in ("cuda_max_memory_reserved", "cuda_max_memory_allocated",
                                                     "nvml_used_bytes", "cuda_memory_reserved_now"))}

    class Prober:
        measured = True

        def probe(self, point: dict, phases: tuple) -> dict:
            return {"status": "ok", "peak_bytes": 5000, "train_peak_bytes": 5000, "samples_per_s": 1.0,
                    "nvml_baseline_used_bytes": 7, **cuda_fields}

        def memory_model(self, phase: str, point: dict) -> None:
            return None

    spec = AlgoSpec(num_trials=5, patches_range=(1, 4), sw_range=(1, 4), validation_devices=("device",))
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/s.db")
    study = optuna.create_study(storage=storage, study_name="s")
    Evaluator(study, Prober(), 10**9, distributions(spec, ("device",)), storage=storage).evaluate(
        {"num_patches_per_iter": 2}, ("train",))
    attrs = study.trials[0].user_attrs
    for key in ("train_cuda_max_memory_reserved", "train_cuda_max_memory_allocated", "infer_cuda_max_memory_reserved",
                "infer_cuda_max_memory_allocated", "train_nvml_used_bytes", "nvml_baseline_used_bytes"):
        assert attrs.get(key) is not None, key
    assert attrs["train_cuda_max_memory_reserved"] == cuda_fields["train_cuda_max_memory_reserved"]


def test_budget_arithmetic_is_one_formula_and_its_inverse() -> None:
    from autotune.probe.allowances import (
        CudaAllowance,
        allocator_budget,
        allowance_from_record,
        apply_allowance,
        tensor_budget,
    )

    a = CudaAllowance(context_bytes=300 << 20, cudnn_workspace_bytes=100 << 20, allocator_slack_fraction=0.2)
    budget = allocator_budget(8 << 30, 0.1, a)
    assert budget == int((8 << 30) * 0.9) - (300 << 20)
    raw = tensor_budget(budget, a)
    # the largest raw peak whose allowance-adjusted bytes stay within the budget: equal at the edge
    assert abs(apply_allowance(raw, a, include_context=False) - budget) <= 1
    assert apply_allowance(raw + 4096, a, include_context=False) > budget
    scale, offset = a.affine()
    assert int(raw * scale + offset) <= budget
    # a record's allowances win on CUDA; the CPU has none whatever a record says
    rec = {"allowances": {"context_bytes": 1, "cudnn_workspace_bytes": 2, "allocator_slack_fraction": 0.5}}
    assert allowance_from_record(rec, "cuda:0").cudnn_workspace_bytes == 2
    assert allowance_from_record(rec, "cpu").allocator_slack_fraction == 0.0
