"""MONAI's official SwinUNETR template (``<repo>/../shared/monai``, 21ed8e5): generated through ``autotune.BundleGen``
on a host without a GPU, recognised, probed, estimated, tuned, written back into its own keys, read back by MONAI,
and its own ``train.py`` run through the launcher on the CPU.

The bundle is MONAI's as generated, shrunk for the CPU by plain values in its ``hyper_parameters.yaml`` and ``network.yaml`` (roi
64x32x32, the least SwinUNETR trains on: each side a multiple of 32 and more than one element at its bottleneck;
``feature_size`` 12, one block per stage): the scripts stay MONAI's, so it is still version 21ed8e5.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from monai_fixtures import SKIP_REASON, run_launcher, shared_templates

pytestmark = [
    pytest.mark.skipif(shared_templates() is None, reason=SKIP_REASON),
    pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("fire", "einops")),
                       reason="MONAI's SwinUNETR needs fire (BundleGen) and einops: pip install autotune[auto3dseg]"),
]
GIB = 1024**3
ROI = [64, 32, 32]
GENERATION_MEMORY = "12GiB"  # what autotune hands the template's auto_scale here (this host has no GPU)


def _monai_auto_scale(memory_gib: float, classes: int) -> int:
    """SwinUNETR's ``auto_scale`` formula (its algo.py), for the patches per step it generates."""
    mem = max(1.0, memory_gib - 1.0)
    bs2 = 2 * (6.0 + 14.0 * (classes - 2) / 103)
    bs9 = 2 * (24.0 + 50.0 * (classes - 2) / 103)
    return max(int(2 + 7 * (mem - bs2) / (bs9 - bs2)), 1)


@pytest.fixture(scope="module")
def generated(demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``autotune analyze``, then MONAI's BundleGen through ``autotune.BundleGen`` on this CPU-only host, shrunk."""
    import autotune

    work = tmp_path_factory.mktemp("monai_swinunetr")
    analysed = autotune.analyze(demo_data, work, num_fold=2, progress=False)
    gen = autotune.BundleGen(algo_path=str(work), algos="swinunetr", data_stats_filename=analysed.datastats,
                             data_src_cfg_name=analysed.data_src, templates_path_or_url=str(shared_templates()))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(work)
        (path,) = gen.generate(work, num_fold=1, device="cpu", memory_limit=GENERATION_MEMORY)
    root = Path(path)
    hyper = root / "configs" / "hyper_parameters.yaml"
    data = yaml.safe_load(hyper.read_text())
    data.update(roi_size=ROI, roi_size_valid=ROI)
    hyper.write_text(yaml.safe_dump(data, sort_keys=False))
    network = root / "configs" / "network.yaml"
    data = yaml.safe_load(network.read_text())
    data["network"].update(feature_size=12, depths=[1, 1, 1, 1])
    network.write_text(yaml.safe_dump(data, sort_keys=False))
    return root


@pytest.fixture()
def bundle(generated: Path, tmp_path: Path) -> Path:
    """A private copy (its configs point at the shared datalist; its bundle_root, where train.py writes, at it)."""
    root = Path(shutil.copytree(generated, tmp_path / generated.name))
    hyper = root / "configs" / "hyper_parameters.yaml"
    hyper.write_text(yaml.safe_dump({**yaml.safe_load(hyper.read_text()), "bundle_root": str(root)}, sort_keys=False))
    return root


def test_it_generates_without_a_gpu_sized_for_the_memory_autotune_tunes_for(generated: Path) -> None:
    """The bundle exists at all because autotune hands ``auto_scale`` the memory: MONAI alone fails here."""
    import torch

    from autotune.auto3dseg import identify, load_view

    assert identify(generated).label == "swinunetr 21ed8e5"
    view = load_view(generated)
    n = _monai_auto_scale(12.0, view["output_classes"])
    assert n != _monai_auto_scale(16.0, view["output_classes"])  # the limit, not the 16 GiB fallback, sized it
    assert view["num_patches_per_iter"] == n and view["num_crops_per_image"] == 2 * n
    assert yaml.safe_load((generated / "configs" / "hyper_parameters.yaml").read_text())["num_sw_batch_size"] == (
        "$@num_patches_per_iter")  # the template's expression, resolved by MONAI
    assert view["tuning_supported"] and view["loader_label_dtype"] == "uint8"
    assert view["network"]["name"] == "SwinUNETR" and view["network"]["args"]["feature_size"] == 12
    assert view["batch_scaling"]["reference_batch"] == n and view["batch_scaling"]["lr_scaling"] == "sqrt"
    assert view["num_sw_batch_size"] == n
    if torch.cuda.device_count() == 0:  # MONAI's own generation, without autotune's memory: min() of no GPUs
        algo = sys.modules[next(m for m in sys.modules if m.endswith("swinunetr.scripts.algo"))]
        with pytest.raises(ValueError, match="empty"):
            algo.auto_scale(3, 10)


def test_generation_memory_follows_the_target_the_limit_then_the_device() -> None:
    from autotune.auto3dseg.templates.swinunetr import (
        DEFAULT_GENERATION_MEMORY,
        generation_memory,
        visible_gpu_memory,
    )

    assert generation_memory({"memory_limit": "8GiB", "device": "cpu"}) == 8 * GIB
    assert generation_memory({"target_memory": "24GiB", "memory_limit": "8GiB"}) == 24 * GIB
    assert generation_memory({"target_gpu": "a100-80gb"}, lambda name: {"a100-80gb": 80 * GIB}[name]) == 80 * GIB
    assert generation_memory({"device": "cpu"}) == DEFAULT_GENERATION_MEMORY

    class Algo:  # a BundleAlgo of this module, as MONAI's BundleGen holds one
        name = "swinunetr"

    module = sys.modules[__name__]
    module.get_mem_from_visible_gpus = lambda: []  # type: ignore[attr-defined]
    original = module.get_mem_from_visible_gpus  # type: ignore[attr-defined]
    with visible_gpu_memory([Algo()], 5 * GIB):
        assert module.get_mem_from_visible_gpus() == [5 * GIB]  # type: ignore[attr-defined]
    assert module.get_mem_from_visible_gpus is original  # type: ignore[attr-defined]


def test_written_back_values_land_in_its_own_keys_and_monai_reads_them_back(bundle: Path) -> None:
    """The write-back alone (the slow tier runs it after a real tune): top-level keys, plain values (the sw batch
    no longer tied to num_patches_per_iter by the template's expression), auto_scale off, provenance beside."""
    from monai.bundle import ConfigParser

    from autotune.auto3dseg import load_view, update_bundle
    from autotune.families import family_of

    family = family_of(bundle)
    key_table = family.tunable_keys(family.load_config(bundle))  # the template's, read before the write-back
    tuning = {"num_patches_per_iter": 3, "method": "measured"}
    view = update_bundle(bundle, {"num_patches_per_iter": 3, "num_images_per_batch": 3, "num_crops_per_image": 2,
                                  "num_sw_batch_size": 5, "sw_input_on_cpu": True, "learning_rate": 0.0008,
                                  "tuning": tuning})
    raw = yaml.safe_load((bundle / "configs" / "hyper_parameters.yaml").read_text())
    assert (raw["num_patches_per_iter"], raw["num_images_per_batch"], raw["num_crops_per_image"]) == (3, 3, 2)
    assert (raw["num_sw_batch_size"], raw["sw_input_on_cpu"], raw["learning_rate"]) == (5, True, 0.0008)
    assert raw["auto_scale_allowed"] is False and "tuning" not in raw
    assert raw["ckpt_path"] == "$@bundle_root + '/model_fold' + str(@fold)"  # MONAI's expressions stay
    parser = ConfigParser()
    parser.read_config(sorted(str(p) for p in (bundle / "configs").iterdir()))
    assert parser.get_parsed_content("num_sw_batch_size") == 5 and parser.get_parsed_content("num_patches_per_iter") == 3
    assert yaml.safe_load((bundle / "autotune" / "tuning.yaml").read_text()) == tuning
    assert view["tuning"] == tuning and view["num_sw_batch_size"] == 5 and view["sw_input_on_cpu"] is True
    for name, keys in key_table.items():  # the family's key table names these keys
        assert all(key in raw for key in keys), (name, keys)
    update_bundle(bundle, {"num_patches_per_iter": 2})  # the sw batch is written as it stands, never re-tied
    assert yaml.safe_load((bundle / "configs" / "hyper_parameters.yaml").read_text())["num_sw_batch_size"] == 5
    assert load_view(bundle)["num_sw_batch_size"] == 5


@pytest.mark.slow
def test_tuned_values_land_in_its_own_keys_and_monai_reads_them_back(bundle: Path, tmp_path: Path) -> None:
    """Tuned (estimates), written into the template's top-level keys with plain values (the sw batch no longer
    tied to num_patches_per_iter), auto_scale off, provenance beside; MONAI's ConfigParser resolves them."""
    from monai.bundle import ConfigParser

    from autotune import tune
    from autotune.bundles.config import load_bundle_config

    (result,) = tune([str(bundle)], {"universal": {"range_num_images_per_batch": [1, 2],
                                                   "range_num_sw_batch_size": [1, 3]}}, device="cpu",
                     memory_limit="2GiB", strategy="estimate", handoff="largest",
                     storage=f"sqlite:///{tmp_path}/s.db", progress=None)
    assert result["status"] == "tuned"
    n, sw = result["num_patches_per_iter"], result["num_sw_batch_size"]
    raw = yaml.safe_load((bundle / "configs" / "hyper_parameters.yaml").read_text())
    assert raw["num_patches_per_iter"] == n and raw["auto_scale_allowed"] is False
    assert raw["num_sw_batch_size"] == sw and isinstance(raw["num_sw_batch_size"], int)
    assert raw["num_images_per_batch"] * raw["num_crops_per_image"] % n == 0
    assert raw["ckpt_path"] == "$@bundle_root + '/model_fold' + str(@fold)" and "tuning" not in raw
    assert raw["sw_input_on_cpu"] is result["sw_input_on_cpu"]
    parser = ConfigParser()
    parser.read_config(sorted(str(p) for p in (bundle / "configs").iterdir()))
    assert parser.get_parsed_content("num_sw_batch_size") == sw and parser.get_parsed_content("num_patches_per_iter") == n
    assert parser.get_parsed_content("auto_scale_allowed") is False
    tuning = yaml.safe_load((bundle / "autotune" / "tuning.yaml").read_text())
    assert tuning["num_patches_per_iter"] == n and tuning["recipe"]["reference"]["reference_batch"] == 1
    again = load_bundle_config(bundle)
    assert again.num_patches_per_iter == n and again.plan.num_patches_per_iter == n
    # the reference survives the write-back
    assert again.batch_scaling.model_dump(exclude_unset=True) == tuning["recipe"]["reference"]


@pytest.mark.slow
def test_the_estimate_equals_the_cpu_probe_and_train_py_runs_through_the_launcher_as_probed(bundle: Path,
                                                                                          tmp_path: Path) -> None:
    """The probe runs train.py's step (SwinUNETR, DiceCELoss, AdamW, uint8 labels) for real; the estimator the same
    with fake tensors: on the CPU both count the same tracked bytes, training and validation. Then MONAI's own
    train.py (hard-coded cuda) for one short epoch on the CPU under the limit, through the launcher, at that
    written-back batch: its training peak against the probe's."""
    from autotune.auto3dseg import load_view, update_bundle
    from autotune.probe.estimate import estimate
    from autotune.probe.runner import run_probe

    # one patch per loader batch: the template's RandRotate90d turns this test's non-cubic roi, and MONAI's collate
    # cannot stack two crops of different shapes (MONAI generates cubes)
    update_bundle(bundle, {"num_patches_per_iter": 1, "num_images_per_batch": 1, "num_crops_per_image": 1,
                           "num_sw_batch_size": 2})
    probed = run_probe(bundle, num_patches_per_iter=1, num_sw_batch_size=2, device="cpu", timeout=300)
    assert probed["status"] == "ok", probed.get("error_tail")
    est = estimate(bundle, num_patches_per_iter=1, num_sw_batch_size=2, device="cpu")
    assert est["train_peak_bytes"] == probed["train_peak_bytes"]
    assert est["infer_peak_bytes"] == probed["infer_peak_bytes"]
    cases = json.loads(Path(load_view(bundle)["datalist"]).read_text())["training"]
    small = [next(c for c in cases if c["fold"] == 0), *[c for c in cases if c["fold"] != 0][:2]]
    (tmp_path / "small.json").write_text(json.dumps({"training": small}))  # two steps (the second holds AdamW's
    # state, as the probe's steady step does), one case to validate
    config = ",".join(sorted(str(p) for p in (bundle / "configs").iterdir()))
    code, err = run_launcher(  # python -m autotune.launch, forked with torch and MONAI imported
        ["--memory-limit", "2GiB", "--device", "cpu", "--peak-json", str(tmp_path / "peak.json"), "--",
         str(bundle / "scripts" / "train.py"), "run", f"--config_file={config}", "--num_epochs=1",
         "--num_epochs_per_validation=1", "--use_pretrain=False", "--num_workers=1", "--num_workers_validation=0",
         "--num_cache_workers=1", f"--data_list_file_path={tmp_path / 'small.json'}"], tmp_path, timeout=600)
    assert code == 0, err[-3000:]
    record = json.loads((tmp_path / "peak.json").read_text())
    assert record["status"] == "ok" and record["within_limit"] and record["cpu_context"].startswith("swinunetr")
    assert (bundle / "model_fold0" / "best_metric_model.pt").is_file()  # trained, validated, saved
    assert abs(record["train_peak_bytes"] - probed["train_peak_bytes"]) / probed["train_peak_bytes"] < 0.02
