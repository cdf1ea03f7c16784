"""CUDA tests: probe, estimate, tune, train and infer on a real GPU (skipped where none is visible).

Run on a GPU machine with ``python -m pytest -q -n 0 -m cuda tests/test_cuda.py`` (one process: the tests
measure the GPU's memory; ``benchmarks/gpu_run.sh`` does, with ``PYTEST=1``). Tiny bundles keep each test to seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from probe_fixtures import make_tiny_bundles

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible"),
]

# The bound the estimate keeps against max_memory_allocated (the tensor bytes the allocator
# handed out): what the first GPU run measured on full-size templates, with headroom.
ESTIMATE_BOUND = 0.10


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_tiny_bundles(tmp_path_factory.mktemp("cuda_bundles"))


@pytest.mark.parametrize("algo", ["segresnet", "dints", "unet"])
def test_probe_reports_allocator_and_nvml_peaks(bundles: dict[str, Path], algo: str) -> None:
    from autotune.probe.runner import run_probe

    res = run_probe(bundles[algo], num_patches_per_iter=2, num_sw_batch_size=2, device="cuda:0", timeout=240)
    assert res["status"] == "ok", res.get("error_tail")
    for phase in ("train", "infer"):
        allocated = res[f"{phase}_cuda_max_memory_allocated"]
        reserved = res[f"{phase}_cuda_max_memory_reserved"]
        assert 0 < allocated <= reserved == res[f"{phase}_peak_bytes"]
        assert res[f"{phase}_nvml_used_bytes"] is None or res[f"{phase}_nvml_used_bytes"] >= reserved
    assert res["device_name"] == torch.cuda.get_device_name(0)


@pytest.mark.parametrize("algo", ["segresnet", "dints", "unet"])
def test_estimate_within_bound_of_max_memory_allocated(bundles: dict[str, Path], algo: str) -> None:
    from autotune.probe.estimate import estimate
    from autotune.probe.runner import run_probe

    res = run_probe(bundles[algo], num_patches_per_iter=3, num_sw_batch_size=3, device="cuda:0", timeout=240)
    est = estimate(bundles[algo], num_patches_per_iter=3, num_sw_batch_size=3, device="cuda:0")
    assert res["status"] == "ok"
    for phase in ("train", "infer"):
        measured = res[f"{phase}_cuda_max_memory_allocated"]
        assert abs(est[f"{phase}_peak_bytes"] / measured - 1) <= ESTIMATE_BOUND, (phase, est[f"{phase}_peak_bytes"],
                                                                                  measured)


def test_memory_limit_caps_the_probe(bundles: dict[str, Path]) -> None:
    from autotune.probe.runner import run_probe

    ok = run_probe(bundles["unet"], num_patches_per_iter=4, device="cuda:0", phases=("train",), timeout=240)
    limit = ok["train_cuda_max_memory_reserved"] // 3
    capped = run_probe(bundles["unet"], num_patches_per_iter=4, device="cuda:0", phases=("train",),
                       memory_limit=limit, timeout=240)
    assert capped["status"] == "oom"


def test_tune_on_cuda_records_cuda_peaks_in_the_study(bundles: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    import optuna

    from autotune.stages import tune

    bundle = tmp_path / "unet_0"
    shutil.copytree(bundles["unet"], bundle)
    storage = f"sqlite:///{tmp_path}/s.db"
    [result] = tune([bundle], device="cuda:0", memory_limit="2GiB", storage=storage,
                            specs={"universal": {"range_num_images_per_batch": [1, 8],
                                                 "range_num_sw_batch_size": [1, 4]}})
    assert result["status"] == "tuned"
    assert result["peak_bytes"] <= result["budget_bytes"]
    assert result["allowances"]["source"]
    trials = [t for name in (result["study_name"], result["infer_study_name"])
              for t in optuna.load_study(study_name=name, storage=storage).trials]
    attrs = [t.user_attrs for t in trials if t.user_attrs.get("kind", "probe") == "probe"]
    assert any(a.get("train_cuda_max_memory_reserved") for a in attrs)
    assert any(a.get("infer_cuda_max_memory_allocated") for a in attrs)


def test_train_and_infer_on_cuda_under_a_limit(bundles: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    import nibabel as nib

    from autotune.trainer.infer import infer
    from autotune.trainer.runner import train

    bundle = tmp_path / "segresnet_0"
    shutil.copytree(bundles["segresnet"], bundle)
    limit = 2 * 1024**3
    summary = train(bundle, device="cuda:0", epochs=2, val_every=1, progress=False, memory_limit=limit)
    assert summary["epochs_run"] == 2
    assert 0 < summary["train_peak_bytes"] <= limit
    assert 0 < summary["val_peak_bytes"] <= limit
    rows = json.loads((Path(summary["model_dir"]) / "metrics.json").read_text())["rows"]
    assert all(r["train_peak_bytes"] for r in rows)
    image = bundles["segresnet"].parent.parent / "data" / "imagesTr" / "case_000.nii.gz"
    [pred] = infer(bundle, [str(image)], tmp_path / "pred", device="cuda:0", progress=False)
    assert nib.load(pred).shape == nib.load(image).shape[:3]
