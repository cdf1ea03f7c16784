"""Templates, rendering, BundleGen and the one builder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from autotune.bundles.config import load_bundle_config
from autotune.bundles.templates import list_templates, load_overrides, load_template
from autotune.cli import main
from autotune.data.analyze import analyze
from autotune.errors import ConfigError
from autotune.facade.bundlegen import BundleGen

ALGOS = ("segresnet", "dints", "unet")


@pytest.fixture(scope="module")
def work(demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("work")
    result = analyze(demo_data, work, num_fold=2, progress=False)
    BundleGen(work, data_stats_filename=result.datastats, data_src_cfg_name=result.data_src).generate(
        work, num_fold=2, overrides=load_overrides("tiny")
    )
    return work


def test_templates_are_plain_data_with_versions() -> None:
    assert set(ALGOS) <= set(list_templates())
    root = Path(load_template("dints")["path"]).parents[1]
    for algo in ALGOS:
        text = (root / algo / "template.yaml").read_text()
        assert "$" not in text, f"{algo}: templates hold no expressions"
        template = load_template(algo)
        assert isinstance(template["version"], int)
        for key in ("num_images_per_batch", "num_crops_per_image", "num_patches_per_iter", "num_sw_batch_size",
                    "sw_input_on_cpu", "roi_size", "resample_resolution", "amp", "learning_rate", "num_epochs",
                    "cache_rate"):
            assert key in template["training"], (algo, key)
        assert template["tuning"]["supported"] is True


def test_six_bundles_with_filled_values(work: Path) -> None:
    stats = yaml.safe_load((work / "datastats.yaml").read_text())
    spacing = stats["stats_summary"]["image_stats"]["spacing"]["median"]
    for algo in ALGOS:
        for fold in (0, 1):
            bundle = work / f"{algo}_{fold}"
            cfg = load_bundle_config(bundle)
            meta = json.loads((bundle / "bundle.json").read_text())
            assert meta["template"] == algo and meta["fold"] == fold
            assert meta["datastats_hash"] == stats["autotune"]["content_hash"]
            assert cfg.fold == fold and cfg.algo == algo
            assert cfg.roi_size == [32, 32, 32]  # the tiny preset
            assert cfg.resample_resolution == pytest.approx(spacing)
            assert cfg.input_channels == 1 and cfg.output_classes == 3
            assert cfg.intensity_normalization.model_dump(exclude_unset=True) == {"mode": "zscore"}  # MRI
            assert Path(cfg.datalist).is_file()
            assert all(v >= r for v, r in zip(cfg.infer_volume_shape, cfg.roi_size, strict=True))


def test_auto_roi_is_a_multiple_of_the_network_divisor(work: Path, tmp_path: Path) -> None:
    out = tmp_path / "auto"
    BundleGen(work, data_stats_filename=work / "datastats.yaml", data_src_cfg_name=work / "data_src.yaml").generate(
        out, num_fold=1
    )
    divisors = {"segresnet": 8, "dints": 16, "unet": None}  # UNet's: its strides, fitted to the volume
    for algo, divisor in divisors.items():
        cfg = load_bundle_config(out / f"{algo}_0")
        divisor = divisor or 2 ** len(cfg.network.args["strides"])
        assert all(v % divisor == 0 and v >= 32 for v in cfg.roi_size), (algo, cfg.roi_size)


def test_ct_clips_to_foreground_percentiles(work: Path, tmp_path: Path) -> None:
    src = yaml.safe_load((work / "data_src.yaml").read_text())
    src["modality"] = "CT"
    (tmp_path / "ct.yaml").write_text(yaml.safe_dump(src))
    BundleGen(work, algos="unet", data_stats_filename=work / "datastats.yaml",
              data_src_cfg_name=tmp_path / "ct.yaml").generate(tmp_path / "ct", num_fold=1)
    cfg = load_bundle_config(tmp_path / "ct" / "unet_0")
    fg = yaml.safe_load((work / "datastats.yaml").read_text())["stats_summary"]["image_foreground_stats"]["intensity"]
    assert cfg.intensity_normalization.mode == "clip"
    assert cfg.intensity_normalization.a_min == pytest.approx(fg["percentile_00_5"])
    assert cfg.intensity_normalization.a_max == pytest.approx(fg["percentile_99_5"])


def test_every_network_builds_and_runs_forward(work: Path) -> None:
    import torch

    from autotune.build import build_loss, build_network, build_optimizer, build_transforms

    for algo in ALGOS:
        cfg = load_bundle_config(work / f"{algo}_0")
        net = build_network(cfg)
        build_optimizer(cfg, net.parameters())
        x = torch.randn(1, cfg.input_channels, *cfg.roi_size)
        with torch.no_grad():
            y = net(x)
        assert tuple(y.shape) == (1, cfg.output_classes, *cfg.roi_size)
        loss = build_loss(cfg)(y, torch.zeros(1, 1, *cfg.roi_size))
        assert torch.isfinite(loss)
        # the deterministic transforms load and resample a real case
        item = json.loads(Path(cfg.datalist).read_text())["training"][0]
        data = build_transforms(cfg, "val")({"image": item["image"], "label": item["label"]})
        assert data["image"].shape[0] == cfg.input_channels


def test_unknown_algorithm_lists_valid_ones(work: Path) -> None:
    with pytest.raises(ConfigError, match="valid: .*segresnet"):
        BundleGen(work, algos="segresnett")


def test_regenerate_is_safe_and_keeps_training_outputs(work: Path, tmp_path: Path) -> None:
    out = tmp_path / "regen"
    gen = BundleGen(work, algos=["unet"], data_stats_filename=work / "datastats.yaml",
                    data_src_cfg_name=work / "data_src.yaml")
    gen.generate(out, num_fold=1, overrides={"num_epochs": 7})
    marker = out / "unet_0" / "model_fold0" / "keep.txt"
    marker.parent.mkdir(parents=True)
    marker.write_text("trained")
    gen.generate(out, num_fold=1, overrides={"num_epochs": 9})
    assert load_bundle_config(out / "unet_0").num_epochs == 9
    assert marker.read_text() == "trained"
    assert not list(out.glob(".*")), "no temp folders left behind"
    assert [b["identifier"] for b in gen.get_bundles()] == ["unet_0"]


def test_overrides_scope_to_an_algorithm(work: Path, tmp_path: Path) -> None:
    BundleGen(work, algos="segresnet,unet", data_stats_filename=work / "datastats.yaml",
              data_src_cfg_name=work / "data_src.yaml").generate(
        tmp_path / "o", num_fold=1, overrides={"roi_size": [32, 32, 32], "unet": {"learning_rate": 0.5}})
    assert load_bundle_config(tmp_path / "o" / "unet_0").learning_rate == 0.5
    assert load_bundle_config(tmp_path / "o" / "segresnet_0").learning_rate != 0.5


@pytest.mark.parametrize(
    "argv_extra, needle",
    [
        (["--algos", "segresnet,vnet"], "vnet"),
        (["--num-fold", "0"], "--num-fold"),
        (["--num-fold", "9"], "folds"),
        (["--overrides", "nonexistent_preset"], "nonexistent_preset"),
    ],
    ids=["unknown-algo", "zero-folds", "too-many-folds", "unknown-preset"],
)
def test_generate_bad_arguments_exit_2(demo_data: Path, tmp_path: Path, capsys, argv_extra, needle) -> None:
    code = main(["generate", "--input", str(demo_data), "--work-dir", str(tmp_path / "w"), "--quiet", *argv_extra])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err


def test_roi_not_matching_network_is_refused(work: Path, tmp_path: Path) -> None:
    gen = BundleGen(work, algos="dints", data_stats_filename=work / "datastats.yaml",
                    data_src_cfg_name=work / "data_src.yaml")
    with pytest.raises(ConfigError, match="multiple of 16"):
        gen.generate(tmp_path / "bad", num_fold=1, overrides={"roi_size": [40, 40, 40]})


def test_corrupt_bundle_config_names_the_key(work: Path, tmp_path: Path) -> None:
    import shutil

    bundle = Path(shutil.copytree(work / "unet_0", tmp_path / "unet_0"))
    path = bundle / "configs" / "hyper_parameters.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["num_patches_per_iter"] = 0
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match="num_patches_per_iter"):
        load_bundle_config(bundle)
    path.write_text("algo: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_bundle_config(bundle)


@pytest.mark.parametrize(("overrides", "line"), [
    ({"num_patches_per_iterr": 2}, "key 'num_patches_per_iterr' is not a key of any template of dints, unet; did you "
                                   "mean 'num_patches_per_iter'?"),
    ({"dints": {"learning_rat": 0.1}}, "overrides: dints: key 'learning_rat' is not a key of the dints template; did "
                                       "you mean 'learning_rate'?"),
    ({"fast_training": {"cach": False}}, "key 'fast_training.cach' is not a key of any template of dints, unet; did "
                                         "you mean 'fast_training.cache'?"),
    ({"network": {"topology": {"num_blocks": 2}}}, "key 'network.topology' is taken by dints only (unet has no such "
                                                   "key), and a top-level override applies to every algorithm "
                                                   "generated; give it under its name (dints: {network: {topology: "
                                                   "...}})"),
], ids=["top-level", "in-a-scope", "nested", "only-some-templates"])
def test_an_override_key_no_template_knows_is_refused(work: Path, tmp_path: Path, overrides: dict, line: str) -> None:
    gen = BundleGen(work, algos="dints,unet", data_stats_filename=work / "datastats.yaml",
                    data_src_cfg_name=work / "data_src.yaml")
    with pytest.raises(ConfigError) as refused:
        gen.generate(tmp_path / "out", num_fold=1, overrides={**load_overrides("tiny"), **overrides})
    assert line in str(refused.value) and "\n" not in str(refused.value)
    assert not (tmp_path / "out").exists()


def test_keys_the_templates_know_are_taken(work: Path, tmp_path: Path) -> None:
    """The tiny preset, a key every template reads (``cpu_bf16``, stated in one), one under the scope that knows
    it, and the constructor's open ``args``."""
    BundleGen(work, algos="dints,unet", data_stats_filename=work / "datastats.yaml",
              data_src_cfg_name=work / "data_src.yaml").generate(
        tmp_path / "out", num_fold=1, overrides={**load_overrides("tiny"), "cpu_bf16": True, "sw_overlap": 0.25,
                                                 "dints": {"network": {"topology": {"num_blocks": 2}}},
                                                 "unet": {"network": {"args": {"dropout": 0.1}}}})
    assert load_bundle_config(tmp_path / "out" / "unet_0").network.args["dropout"] == 0.1
    assert load_bundle_config(tmp_path / "out" / "dints_0").sw_overlap == 0.25


def test_a_resample_override_recomputes_the_sizes_measured_at_it(work: Path, tmp_path: Path) -> None:
    """Halving the spacing doubles the voxels of the volume the sliding window runs over; it is not the volume
    computed at the template's spacing."""
    gen = BundleGen(work, algos="unet", data_stats_filename=work / "datastats.yaml",
                    data_src_cfg_name=work / "data_src.yaml")
    plain = load_bundle_config(work / "unet_0")
    assert all(v > r for v, r in zip(plain.infer_volume_shape, plain.roi_size, strict=True)), plain
    fine = [v / 2 for v in plain.resample_resolution]
    gen.generate(tmp_path / "fine", num_fold=1, overrides={**load_overrides("tiny"), "resample_resolution": fine})
    at_fine = load_bundle_config(tmp_path / "fine" / "unet_0").infer_volume_shape
    assert all(2 * p - 2 <= f <= 2 * p for f, p in zip(at_fine, plain.infer_volume_shape, strict=True)), at_fine
