"""MONAI's AutoRunner with its default algorithms, autotune in between (docs/monai-bundles.md, "With MONAI's
AutoRunner"), on the CPU: an isotropic dataset (SegResNet, DiNTS, SwinUNETR generated; MONAI skips SegResNet2D)
and a highly anisotropic one (SegResNet2D generated too).

AutoRunner generates every default template from MONAI's templates (``algos`` left out; inside
``autotune.auto3dseg.monai_generation``, which gives SwinUNETR's generation the memory autotune tunes for:
MONAI's own reads the GPUs, and there are none); autotune tunes every bundle of both work folders; then MONAI
trains through autotune's launcher (the command prefix) one bundle of each set, each with ``BundleAlgo.train``,
what AutoRunner's training step calls for each of its bundles (that step itself would stop at DiNTS, whose
``train.py`` needs CUDA; SwinUNETR's training through the launcher is ``test_monai_swinunetr.py``'s), and
AutoRunner ensembles what was trained. The networks are shrunk for the CPU as plain values in the generated
configs (the scripts stay MONAI's).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml
from monai_fixtures import SKIP_REASON, make_anisotropic_dataset, shared_templates

pytestmark = [
    pytest.mark.skipif(shared_templates() is None, reason=SKIP_REASON),
    pytest.mark.skipif(importlib.util.find_spec("fire") is None,
                       reason="MONAI's BundleGen imports the templates' algo.py, which needs fire: pip install autotune[auto3dseg]"),
]
LIMIT = "2GiB"
DEFAULT_ALGORITHMS = None  # AutoRunner's: every template in the templates folder
QUICK = {"num_epochs": 1, "num_epochs_per_validation": 1, "quick": True, "num_workers": 0, "cache_rate": 0}
#: plain values in the generated configs that make each network small: (file, keys, values) per template
SHRINK = {
    "segresnet": [("hyper_parameters.yaml", ("network",), {"init_filters": 8, "blocks_down": [1, 1, 1], "dsdepth": 2})],
    "segresnet2d": [("hyper_parameters.yaml", ("network",), {"init_filters": 8, "blocks_down": [1, 1]})],
    "dints": [("network.yaml", ("training_network", "dints_space"), {"channel_mul": 0.125})],
    "swinunetr": [("network.yaml", ("network",), {"feature_size": 12, "depths": [1, 1, 1, 1]})],
}


def _shrink(bundle: Path) -> None:
    for file, keys, values in SHRINK[bundle.name.rsplit("_", 1)[0]]:
        path = bundle / "configs" / file
        data = yaml.safe_load(path.read_text())
        node = data
        for key in keys:
            node = node[key]
        node.update(values)
        path.write_text(yaml.safe_dump(data, sort_keys=False))


def _generate(data: Path, work: Path) -> list[Path]:
    """``autotune analyze``, then AutoRunner's generation step alone, with its default algorithms."""
    from monai.apps.auto3dseg import AutoRunner

    import autotune
    from autotune.auto3dseg import monai_generation

    analysed = autotune.analyze(data, work, num_fold=2, progress=False)
    datalist = json.loads((work / "datalist.json").read_text())
    datalist["testing"] = [{"image": datalist["training"][0]["image"]}]  # one case for the ensemble to predict
    (work / "datalist.json").write_text(json.dumps(datalist))
    runner = AutoRunner(work_dir=str(work), input=str(analysed.data_src), analyze=False, algo_gen=True, train=False,
                        ensemble=False, templates_path_or_url=str(shared_templates()), algos=DEFAULT_ALGORITHMS)
    runner.set_num_fold(1)
    with monai_generation(memory_limit=LIMIT):  # SwinUNETR sizes its batch from the GPUs
        runner.run()
    from autotune.stages import find_bundles

    bundles = [Path(b) for b in find_bundles(work)]
    for bundle in bundles:
        _shrink(bundle)
    return bundles


def _train_on_the_cpu(work: Path, names: tuple[str, ...]) -> list[str]:
    """AutoRunner's training step for ``names`` (bundles whose train.py runs on a CPU): each one's ``BundleAlgo.train``
    with AutoRunner's training parameters and device settings (the launcher as the command prefix), as
    AutoRunner's step calls it for every bundle."""
    from monai.apps.auto3dseg import AutoRunner
    from monai.apps.auto3dseg.utils import import_bundle_algo_history
    from monai.utils.enums import AlgoKeys

    runner = AutoRunner(work_dir=str(work), input=str(work / "data_src.yaml"), analyze=False, algo_gen=False,
                        train=True, ensemble=False, templates_path_or_url=str(shared_templates()))
    runner.set_device_info(cmd_prefix=f"{sys.executable} -m autotune.launch --memory-limit {LIMIT} --device cpu --")
    runner.set_training_params(QUICK)
    trained = []
    for entry in import_bundle_algo_history(str(work), only_trained=False):
        if entry[AlgoKeys.ID] in names:
            entry[AlgoKeys.ALGO].train(runner.train_params, runner.device_setting)
            trained.append(entry[AlgoKeys.ID])
    return trained


@pytest.mark.slow
def test_autorunner_with_its_default_algorithms_and_autotune_in_between(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from monai.apps.auto3dseg import AutoRunner

    import autotune
    from autotune.data.synthetic import make_demo_dataset

    monkeypatch.chdir(tmp_path)  # MONAI's scripts write runner.log into the working folder
    monkeypatch.delenv("SEGRESNET2D_ALWAYS", raising=False)
    works = {"isotropic": tmp_path / "iso", "anisotropic": tmp_path / "aniso"}
    datasets = {"isotropic": make_demo_dataset(tmp_path / "iso_data", cases=6, size=32, classes=2, seed=0),
                "anisotropic": make_anisotropic_dataset(tmp_path / "aniso_data", cases=6)}
    generated = {kind: _generate(datasets[kind], works[kind]) for kind in works}
    assert sorted(b.name for b in generated["isotropic"]) == ["dints_0", "segresnet_0", "swinunetr_0"]
    assert sorted(b.name for b in generated["anisotropic"]) == ["dints_0", "segresnet2d_0", "segresnet_0",
                                                                 "swinunetr_0"]
    every = [str(b) for kind in works for b in generated[kind]]
    # at the least cost: one probe per bundle (TPE, one trial), and SwinUNETR by its estimate (its probe at the
    # 64^3 roi MONAI's rule gives it, the smallest its five downsamplings take, is the slowest on a CPU)
    swin = [b for b in every if Path(b).name == "swinunetr_0"]
    common = {"device": "cpu", "memory_limit": LIMIT, "precision": "fp32", "storage": f"sqlite:///{tmp_path}/s.db",
              "progress": None}
    specs = {"universal": {"num_trials": 1, "range_num_images_per_batch": [1, 2], "range_num_sw_batch_size": [1, 2],
                           "validation_devices": ["device"]},
             "swinunetr": {"range_num_images_per_batch": [1, 1], "range_num_sw_batch_size": [1, 1]}}
    results = autotune.tune([b for b in every if b not in swin], specs, strategy="tpe", **common)
    results += autotune.tune(swin, specs, strategy="estimate", **common)
    assert {r["bundle"]: r["status"] for r in results} == dict.fromkeys(every, "tuned"), [
        (r["bundle"], r["status"], r.get("reason")) for r in results]
    for bundle in every:  # the record beside the configs, auto-scaling off in the template's own keys
        assert yaml.safe_load((Path(bundle) / "autotune" / "tuning.yaml").read_text())["status"] == "tuned"
    # the isotropic set trains one bundle; the anisotropic one trains SegResNet2D and ensembles it
    trained = {"isotropic": _train_on_the_cpu(works["isotropic"], ("segresnet_0",)),
               "anisotropic": _train_on_the_cpu(works["anisotropic"], ("segresnet2d_0",))}
    assert trained == {"isotropic": ["segresnet_0"], "anisotropic": ["segresnet2d_0"]}
    handed = {r["bundle"]: r["num_patches_per_iter"] for r in results}
    for kind, names in trained.items():
        for name in names:
            record = json.loads((works[kind] / name / "autotune" / "launch.json").read_text())
            assert record["status"] == "ok" and record["within_limit"] and record["memory_limit"] == 2 * 1024**3
            config = yaml.safe_load((works[kind] / name / "configs" / "hyper_parameters.yaml").read_text())
            assert config["auto_scale_allowed"] is False  # trained with the tuned batch, not MONAI's formula
            assert config["batch_size"] * config["num_crops_per_image"] == handed[str(works[kind] / name)]
    ensemble = AutoRunner(work_dir=str(works["anisotropic"]), input=str(works["anisotropic"] / "data_src.yaml"),
                          analyze=False, algo_gen=False, train=False, ensemble=True,
                          templates_path_or_url=str(shared_templates()))
    ensemble.set_num_fold(1)
    ensemble.run()
    assert list((works["anisotropic"] / "ensemble_output").rglob("*.nii.gz")), "MONAI's ensemble wrote no prediction"


def test_monai_generation_lets_monais_own_bundlegen_generate_swinunetr_without_a_gpu(
        monai_work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MONAI's own BundleGen (what AutoRunner builds) inside ``monai_generation``: SwinUNETR generated, sized for
    the memory given; MONAI's ``generate`` put back on the way out."""
    import shutil

    from monai.apps.auto3dseg.bundle_gen import BundleGen

    from autotune.auto3dseg import monai_generation

    for name in ("datastats.yaml", "data_src.yaml", "datalist.json"):
        shutil.copy(monai_work / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    original = BundleGen.generate
    gen = BundleGen(algo_path=str(tmp_path), algos=["swinunetr"], templates_path_or_url=str(shared_templates()),
                    data_stats_filename=str(tmp_path / "datastats.yaml"), data_src_cfg_name=str(tmp_path / "data_src.yaml"))
    with monai_generation(memory_limit="16GiB"):
        assert BundleGen.generate is not original
        gen.generate(str(tmp_path), num_fold=1)
    assert BundleGen.generate is original
    hyper = yaml.safe_load((tmp_path / "swinunetr_0" / "configs" / "hyper_parameters.yaml").read_text())
    assert hyper["num_patches_per_iter"] >= 1 and hyper["roi_size"] == [64, 64, 64]
