"""MONAI-format bundles the tests write: recognised, read through MONAI's ConfigParser, probed and estimated
with the template's own step, tuned, and written back into the template's own keys."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from monai_fixtures import TEST_VERSION

from autotune.errors import ConfigError


def test_a_monai_bundle_is_read_through_its_own_expressions(bundles: dict[str, Path]) -> None:
    from autotune.bundles.config import load_bundle_config

    seg = load_bundle_config(bundles["segresnet"])
    assert seg.format == "monai" and seg.monai_template == "segresnet" and seg.monai_template_version == TEST_VERSION
    assert seg.loss.args["softmax"] is True and seg.loss.args["to_onehot_y"] is True  # "$not @sigmoid"
    assert seg.optimizer.args["lr"] == 0.0002  # "@learning_rate"
    assert seg.network.args["in_channels"] == 1 and seg.bundle_root == str(bundles["segresnet"].resolve())
    dints = load_bundle_config(bundles["dints"])
    assert dints.num_images_per_batch == 2 and dints.num_sw_batch_size == 1  # null: train.py's 1 on the device
    assert dints.loss.args["sigmoid"] is False and dints.sw_overlap == 0.125
    assert dints.amp is True  # the template's; its loop autocasts on CUDA only


def test_a_changed_script_or_unknown_version_is_refused_in_one_line(bundles: dict[str, Path]) -> None:
    from autotune.bundles.config import load_bundle_config

    seg = bundles["segresnet"]
    (seg / "scripts" / "train.py").write_text("print('changed')\n")
    with pytest.raises(ConfigError) as info:
        load_bundle_config(seg)
    line = str(info.value)
    assert "\n" not in line and "segresnet" in line and "scripts/train.py differs" in line
    assert "autotune supports segresnet 21ed8e5, dints 21ed8e5" in line
    json_path = seg / "algo_object.json"
    json_path.write_text(json_path.read_text().replace("segresnet.scripts", "nnunet.scripts"))
    with pytest.raises(ConfigError, match="MONAI template 'nnunet' is not one autotune knows; it supports segresnet"):
        load_bundle_config(seg)


def test_a_missing_config_file_is_named(bundles: dict[str, Path]) -> None:
    from autotune.bundles.config import load_bundle_config

    (bundles["dints"] / "configs" / "network.yaml").unlink()
    with pytest.raises(ConfigError, match=r"configs/network\.yaml: missing; MONAI's dints test-0 bundle has it"):
        load_bundle_config(bundles["dints"])


def test_a_tampered_architecture_pickle_is_never_loaded(bundles: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from autotune.auto3dseg import recognise, versions
    from autotune.auto3dseg.view import load_arch_code

    root = bundles["dints"]
    version = recognise.identify(root)
    (root / "scripts" / "arch_code.pth").write_bytes(b"not the known pickle")
    loaded = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: loaded.append(a))
    with pytest.raises(ConfigError, match="arch_code.pth: differs from MONAI's dints architecture code"):
        load_arch_code(root, version.files["scripts/arch_code.pth"])
    assert loaded == [] and version in versions.KNOWN_VERSIONS.values()


@pytest.mark.parametrize("template", ["segresnet", "dints"])
def test_the_estimate_equals_the_cpu_probe_of_the_template_step(bundles: dict[str, Path], template: str) -> None:
    """The probe runs the template's network, loss, optimizer and loop for real; the estimator the same with fake
    tensors: on the CPU both count the same tracked bytes, at two batch sizes and both validation phases."""
    from autotune.probe.estimate import estimate
    from autotune.probe.runner import run_probe

    for n in (1, 3):
        probed = run_probe(bundles[template], num_patches_per_iter=n, num_sw_batch_size=2, device="cpu", timeout=300)
        assert probed["status"] == "ok", probed.get("error_tail")
        est = estimate(bundles[template], num_patches_per_iter=n, num_sw_batch_size=2, device="cpu")
        assert est["train_peak_bytes"] == probed["train_peak_bytes"]
        assert est["infer_peak_bytes"] == probed["infer_peak_bytes"]
    assert probed["loader_batch_patches"] == 3


@pytest.mark.slow
def test_tune_writes_into_the_templates_own_keys_and_monai_reads_them_back(bundles: dict[str, Path],
                                                                           tmp_path: Path) -> None:
    from monai.bundle import ConfigParser

    from autotune import tune, verify
    from autotune.bundles.config import load_bundle_config

    results = tune(list(bundles.values()), {"universal": {"range_num_images_per_batch": [1, 3],
                                                          "range_num_sw_batch_size": [1, 2]}},
                   device="cpu", memory_limit="4GiB", storage=f"sqlite:///{tmp_path}/s.db", progress=None)
    assert [r["status"] for r in results] == ["tuned", "tuned"]
    seg_result, dints_result = results
    for result, root, rule in ((seg_result, bundles["segresnet"], "sqrt"), (dints_result, bundles["dints"], "linear")):
        verdict = result["handoff"]  # the goodput rule against the template's stated batch, 1
        assert verdict["rule"] == "goodput" and verdict["reference_batch"] == 1
        assert verdict["handed"] == result["num_patches_per_iter"]
        recipe = yaml.safe_load((root / "autotune" / "tuning.yaml").read_text())["recipe"]
        assert recipe["reference"]["reference_batch"] == 1 and recipe["lr_scaling"] == rule
    seg = yaml.safe_load((bundles["segresnet"] / "configs" / "hyper_parameters.yaml").read_text())
    n = seg_result["num_patches_per_iter"]
    assert (seg["num_crops_per_image"], seg["batch_size"], seg["auto_scale_allowed"]) == (n, 1, False)  # crop mode ratio
    assert seg["sliding_inferrer"]["_target_"] == "SlidingWindowInfererAdapt"
    assert seg["sliding_inferrer"]["sw_batch_size"] == seg_result["num_sw_batch_size"]
    assert seg["ckpt_path"] == "$@bundle_root + '/model'" and seg["loss"]["softmax"] == "$not @sigmoid"
    assert "tuning" not in seg and (bundles["segresnet"] / "autotune" / "tuning.yaml").is_file()
    dints = yaml.safe_load((bundles["dints"] / "configs" / "hyper_parameters.yaml").read_text())["training"]
    assert dints["num_patches_per_iter"] == dints_result["num_patches_per_iter"] == dints["num_images_per_batch"]
    assert dints["auto_scale_allowed"] is False and dints["num_sw_batch_size"] == dints_result["num_sw_batch_size"]
    for root in bundles.values():  # MONAI's own parser reads every config back, the tuned values resolved
        parser = ConfigParser()
        parser.read_config(sorted(str(p) for p in (root / "configs").iterdir()))
        assert parser.get_parsed_content("ckpt_path").startswith(str(root.parent)) or "model" in parser["ckpt_path"]
    assert ConfigParser.load_config_file(str(bundles["dints"] / "configs" / "hyper_parameters.yaml"))[
        "training"]["num_patches_per_iter"] == dints_result["num_patches_per_iter"]
    again = load_bundle_config(bundles["segresnet"])
    assert again.num_patches_per_iter == n and again.plan.num_patches_per_iter == n
    report = verify(bundles["segresnet"], device="cpu", storage=f"sqlite:///{tmp_path}/s.db", retune=False,
                    progress=None)
    assert report["holds"] and report["measured_peak_bytes"] == report["estimated_peak_bytes"]
    assert yaml.safe_load((bundles["segresnet"] / "autotune" / "tuning.yaml").read_text())["method"] == "measured"


def test_tuned_values_land_in_the_templates_own_keys(bundles: dict[str, Path]) -> None:
    """The write-back alone (the slow tier runs it after a real tune): the templates' own keys, the
    expressions around them untouched, and MONAI's ConfigParser reads the values back."""
    from monai.bundle import ConfigParser

    from autotune.auto3dseg.writeback import update_bundle

    tuning = {"num_patches_per_iter": 3, "method": "measured"}
    update_bundle(bundles["segresnet"], {"num_patches_per_iter": 3, "num_images_per_batch": 3,
                                         "num_sw_batch_size": 2, "tuning": tuning})
    seg = yaml.safe_load((bundles["segresnet"] / "configs" / "hyper_parameters.yaml").read_text())
    assert (seg["num_crops_per_image"], seg["batch_size"], seg["auto_scale_allowed"]) == (3, 1, False)
    assert seg["sliding_inferrer"]["_target_"] == "SlidingWindowInfererAdapt"
    assert seg["sliding_inferrer"]["sw_batch_size"] == 2
    assert seg["ckpt_path"] == "$@bundle_root + '/model'" and "tuning" not in seg
    assert yaml.safe_load((bundles["segresnet"] / "autotune" / "tuning.yaml").read_text()) == tuning
    update_bundle(bundles["dints"], {"num_patches_per_iter": 2, "num_images_per_batch": 2, "num_sw_batch_size": 3})
    dints = yaml.safe_load((bundles["dints"] / "configs" / "hyper_parameters.yaml").read_text())["training"]
    assert (dints["num_patches_per_iter"], dints["num_images_per_batch"], dints["num_sw_batch_size"]) == (2, 2, 3)
    assert dints["auto_scale_allowed"] is False
    for root in bundles.values():
        parser = ConfigParser()
        parser.read_config(sorted(str(p) for p in (root / "configs").iterdir()))
        assert parser.get_parsed_content("bundle_root")
    assert ConfigParser.load_config_file(str(bundles["dints"] / "configs" / "hyper_parameters.yaml"))[
        "training"]["num_patches_per_iter"] == 2


def test_bundlegen_takes_monais_argument_name_and_tells_monais_templates_apart(tmp_path: Path, monai_work: Path) -> None:
    from autotune import BundleGen
    from autotune.auto3dseg import is_monai_templates
    from autotune.bundles.templates import default_templates_path
    from autotune.facade.bundlegen import BundleGen as OwnBundleGen
    from autotune.pipeline import AutotuneBundleGen

    (tmp_path / "segresnet" / "scripts").mkdir(parents=True)
    (tmp_path / "segresnet" / "scripts" / "algo.py").write_text("")
    assert is_monai_templates(tmp_path) and is_monai_templates("https://example.org/templates.tar.gz")
    assert not is_monai_templates(default_templates_path()) and not is_monai_templates(None)
    own = BundleGen(monai_work, algos="unet", templates_path_or_url=default_templates_path(),
                    data_stats_filename=monai_work / "datastats.yaml", data_src_cfg_name=monai_work / "data_src.yaml")
    assert type(own) is AutotuneBundleGen and isinstance(own, OwnBundleGen) and own.algos == ["unet"]
