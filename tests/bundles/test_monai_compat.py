"""Code written for MONAI's Auto3DSeg runs on autotune bundles: get_history, Algo, ensembles, overrides."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml
from bundle_fixtures import oblique_copy

from autotune.errors import ConfigError

TRAIN_PARAMS = {"num_epochs": 1, "num_epochs_per_validation": 1, "num_warmup_epochs": 1, "progress": False}


@pytest.fixture(scope="module")
def analysed(demo_data: Path, tmp_path_factory: pytest.TempPathFactory):
    from autotune import analyze

    return analyze(demo_data, tmp_path_factory.mktemp("monai_work"), num_fold=1, progress=False)


def _gen(analysed, algos: str):
    from autotune import BundleGen

    return BundleGen(analysed.datastats.parent, algos=algos, data_stats_filename=analysed.datastats,
                     data_src_cfg_name=analysed.data_src)


def test_generate_takes_overrides_as_the_cli_does(analysed, tmp_path: Path) -> None:
    from autotune.bundles.config import load_bundle_config

    gen = _gen(analysed, "segresnet")
    gen.generate(tmp_path / "preset", num_fold=1, overrides="tiny")
    cfg = load_bundle_config(tmp_path / "preset" / "segresnet_0")
    assert cfg.roi_size == [32, 32, 32] and cfg.network.args["init_filters"] == 8
    custom = tmp_path / "mine.yaml"
    custom.write_text(yaml.safe_dump({"num_epochs": 3, "segresnet": {"learning_rate": 0.25}}))
    gen.generate(tmp_path / "file", num_fold=1, overrides=str(custom))
    cfg = load_bundle_config(tmp_path / "file" / "segresnet_0")
    assert cfg.num_epochs == 3 and cfg.learning_rate == 0.25
    with pytest.raises(ConfigError, match="unknown overrides preset 'tinyy'.*valid: tiny"):
        gen.generate(tmp_path / "bad", num_fold=1, overrides="tinyy")
    with pytest.raises(ConfigError, match="overrides must be a preset name"):
        gen.generate(tmp_path / "bad", num_fold=1, overrides=["tiny"])


def test_train_and_predict_params_are_checked(analysed, tmp_path: Path) -> None:
    from autotune.facade.algo import ensemble_passed_keys
    from autotune.facade.algo_params import PredictOptions, parse_predict_params, parse_train_params

    gen = _gen(analysed, "segresnet,unet")
    gen.generate(tmp_path, num_fold=1, overrides="tiny")
    history = {h["identifier"]: h["algo_instance"] for h in gen.get_history()}
    segresnet = history["segresnet_0"]
    with pytest.raises(ConfigError, match=r"unknown key 'num_epoch'; known keys: .*num_epochs, "):
        segresnet.train({"num_epoch": 1})
    with pytest.raises(ConfigError, match="'num_patches_per_iter' is set by the tuner.*autotune tune"):
        segresnet.train({"num_patches_per_iter": 64})
    with pytest.raises(ConfigError, match=r"\['learning_rate'\] must be a positive number"):
        segresnet.train({"learning_rate": -1})
    with pytest.warns(UserWarning, match="num_warmup_epochs.*'PolynomialLR' has no warm-up"):
        run = parse_train_params(history["unet_0"]._config(), {"num_warmup_epochs": 1})
    assert run.updates == {}
    with pytest.raises(ConfigError, match="no validation Dice recorded.*autotune train"):
        segresnet.get_score()
    with pytest.raises(ConfigError, match="checkpoint not found"):
        segresnet.predict([str(tmp_path / "x.nii.gz")])
    with pytest.raises(ConfigError, match="unknown key 'network#init_filters'; known keys: checkpoint, device, output"):
        segresnet.predict([], {"network#init_filters": 8})
    # what MONAI's EnsembleRunner passes on to every predict (its own and SaveImage's arguments) is not an error
    passed = {"rank": 0, "n_best": 2, "output_dir": "x", "output_postfix": "ens", "separate_folder": False}
    assert parse_predict_params(passed, ignored=ensemble_passed_keys()) == PredictOptions()
    run = parse_train_params(segresnet._config(), {"num_epochs": 4, "num_warmup_epochs": 1, "device": "cpu"})
    assert run.updates["num_epochs"] == 4 and run.device == "cpu"
    assert run.updates["lr_scheduler"]["args"]["warmup_fraction"] == pytest.approx(0.25)
    assert parse_train_params(segresnet._config(), {"memory_limit": "2GiB"}).memory_limit == 2 * 1024**3
    with pytest.raises(ConfigError, match="memory_limit.*not a size"):
        parse_train_params(segresnet._config(), {"memory_limit": "lots"})
    assert not (tmp_path / "segresnet_0" / "configs" / "hyper_parameters_train.yaml").exists()


def test_train_runs_the_runner_with_the_tuned_memory_limit(analysed, tmp_path: Path, monkeypatch) -> None:
    """What reaches ``autotune.trainer.runner.train`` (replaced here: the CUDA path runs without a GPU)."""
    from autotune.bundles.config import update_bundle_config

    gen = _gen(analysed, "segresnet")
    gen.generate(tmp_path, num_fold=1, overrides="tiny")
    update_bundle_config(tmp_path / "segresnet_0", {"tuning": {"memory_limit": 3 * 1024**3, "device": "cuda:0",
                                                                   "num_patches_per_iter": 1, "num_sw_batch_size": 1}})
    calls: list[dict] = []
    monkeypatch.setattr("autotune.trainer.runner.train", lambda bundle, **kw: calls.append({"bundle": bundle, **kw}))
    algo = gen.get_history()[0]["algo_instance"]
    algo.train({"device": "cuda:0", "learning_rate": 0.01}, device_setting={"n_devices": 2})
    algo.train({"device": "cpu"})
    algo.train({"device": "cuda:0", "memory_limit": "1GiB"})
    assert [c["memory_limit"] for c in calls] == [3 * 1024**3, None, 1024**3]
    assert [c["nproc"] for c in calls] == [2, 1, 1]
    assert calls[0]["bundle"].endswith("configs/hyper_parameters_train.yaml") and calls[0]["mode"] == "fast"
    assert Path(calls[1]["bundle"]) == tmp_path / "segresnet_0"  # no config change: the generated config
    assert not (tmp_path / "segresnet_0" / "configs" / "hyper_parameters_train.yaml").exists()


def test_monai_flow_trains_scores_and_ensembles(analysed, demo_data: Path, tmp_path: Path) -> None:
    """MONAI's hello-world flow, with autotune's BundleGen: generate, train, score, AlgoEnsembleBestN, predict."""
    import nibabel as nib
    from monai.apps.auto3dseg import (
        AlgoEnsembleBestN,
        AlgoEnsembleBuilder,
        BundleAlgo,
        import_bundle_algo_history,
    )
    from monai.auto3dseg.algo_gen import Algo
    from monai.utils.enums import AlgoKeys

    from autotune.bundles.config import load_bundle_config

    gen = _gen(analysed, "segresnet,dints")
    gen.generate(tmp_path, num_fold=1, overrides="tiny")
    history = gen.get_history()
    assert [h[AlgoKeys.ID] for h in history] == ["segresnet_0", "dints_0"]
    assert all(set(h) == {str(k) for k in AlgoKeys} and not h[AlgoKeys.IS_TRAINED] for h in history)
    for h in history:
        algo = h[AlgoKeys.ALGO]
        assert isinstance(algo, Algo) and Path(algo.get_output_path()) == tmp_path / h[AlgoKeys.ID]
        summary = algo.train(TRAIN_PARAMS)
        assert summary["epochs_run"] == 1 and summary["mode"] == "fast"
        score = algo.get_score()
        assert 0.0 <= score <= 1.0
        assert h[AlgoKeys.IS_TRAINED] and h[AlgoKeys.SCORE] == score
        # the params went to a config of their own; the generated one is untouched
        trained = load_bundle_config(Path(algo.get_output_path()) / "configs" / "hyper_parameters_train.yaml")
        assert trained.num_epochs == 1 and trained.lr_scheduler.args["warmup_fraction"] == 1.0
        assert load_bundle_config(algo.get_output_path()).num_epochs == 4
    assert gen.get_history() is history
    # what MONAI's EnsembleRunner reads back from the work folder in a later process
    restored = {h[AlgoKeys.ID]: h for h in import_bundle_algo_history(str(tmp_path), only_trained=True)}
    assert set(restored) == {"segresnet_0", "dints_0"}
    assert restored["dints_0"][AlgoKeys.SCORE] == history[1][AlgoKeys.SCORE]
    assert restored["dints_0"][AlgoKeys.ALGO].get_output_path() == history[1][AlgoKeys.ALGO].get_output_path()

    image = oblique_copy(demo_data / "imagesTr" / "case_001.nii.gz", tmp_path / "oblique.nii.gz")
    reference = nib.load(image)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        builder = AlgoEnsembleBuilder(history, str(analysed.data_src))
        builder.set_ensemble_method(AlgoEnsembleBestN(n_best=2))
        ensemble = builder.get_ensemble()
        preds = ensemble({"infer_files": [{"image": str(image)}], "mode": "mean", "sigmoid": False})
    assert not [w for w in caught if "infer.py" in str(w.message) or "directory" in str(w.message)]
    assert sorted(a[AlgoKeys.ID] for a in ensemble.get_algo_ensemble()) == ["dints_0", "segresnet_0"]
    assert len(preds) == 1
    label = np.asarray(preds[0])
    assert label.shape == (1, *reference.shape)
    assert set(np.unique(label).tolist()) <= {0, 1, 2}
    np.testing.assert_allclose(np.asarray(preds[0].affine), reference.affine, atol=1e-5)

    # predict alone: probabilities in the input geometry; MONAI's own BundleAlgo loads scripts/infer.py
    prob = history[0][AlgoKeys.ALGO].predict([str(image)])[0]
    assert tuple(prob.shape) == (3, *reference.shape)
    np.testing.assert_allclose(np.asarray(prob).sum(axis=0), 1.0, atol=1e-3)
    monai_algo = BundleAlgo()
    monai_algo.output_path = history[0][AlgoKeys.ALGO].get_output_path()
    plain_case = demo_data / "imagesTr" / "case_000.nii.gz"  # on the training grid: nothing is resampled
    label_only = monai_algo.predict([str(plain_case)], {"output": "label", "device": "cpu"})[0]
    prob = history[0][AlgoKeys.ALGO].predict(str(plain_case))[0]
    assert tuple(label_only.shape) == (1, *nib.load(plain_case).shape)
    np.testing.assert_array_equal(np.asarray(label_only)[0], np.asarray(prob).argmax(axis=0))
