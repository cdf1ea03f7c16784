"""A fifth MONAI template, added in this one file: its ``MonaiTemplate`` subclass, its template folder (written
here) and one ``register`` call. MONAI's ``BundleGen`` generates its bundle through autotune's ``BundleGen``,
``tune`` tunes it with the fake probe (``AUTOTUNE_FAKE_PROBE``) and writes the result back into its own keys; no
module of autotune names it. A template autotune does not tune is refused in one line."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from autotune.auto3dseg.templates import ConfigReader, MonaiTemplate
from autotune.bundles.model import BundleConfig
from autotune.errors import ConfigError

NAME = "faketemplate"
FAKE = "sleep=0,base=64MiB,patch=32MiB,window=16MiB"
LIMIT = "300MiB"  # budget 270 MiB: 6 patches and every sw batch of the range fit

# the template folder MONAI's BundleGen copies: its configs (filled by its algo.py) and its scripts
HYPER_PARAMETERS = {
    "bundle_root": None, "data_file_base_dir": None, "data_list_file_path": None, "fold": 0,
    "input_channels": 1, "output_classes": 3, "roi_size": [32, 32, 32], "learning_rate": 0.0001, "amp": True,
    "softmax": True, "num_epochs": 2, "auto_scale_allowed": True, "batch": {"patches": 2, "images": 2, "crops": 1},
    "sw_batch": "$@batch#patches", "validate_on_cpu": False,
    "network": {"_target_": "BasicUNet", "spatial_dims": 3, "in_channels": "@input_channels",
                "out_channels": "@output_classes", "features": [4, 4, 8, 8, 16, 4]},
    "loss": {"_target_": "DiceCELoss", "to_onehot_y": True, "softmax": True},
    "optimizer": {"_target_": "torch.optim.AdamW", "lr": "@learning_rate"},
}
ALGO_PY = '''"""A fake template's algo: fills the data paths and the fold, as MONAI's templates do."""
import os

import yaml
from monai.apps.auto3dseg import BundleAlgo


class FaketemplateAlgo(BundleAlgo):
    def fill_template_config(self, data_stats_filename, output_path, **kwargs):
        with open(self.data_list_file) as handle:
            source = yaml.safe_load(handle)
        path = os.path.join(output_path, "configs", "hyper_parameters.yaml")
        with open(path) as handle:
            config = yaml.safe_load(handle)
        config.update(bundle_root=output_path, data_file_base_dir=source["dataroot"],
                      data_list_file_path=source["datalist"], fold=int(kwargs.get("fold", 0)))
        with open(path, "w") as handle:
            yaml.safe_dump(config, handle, sort_keys=False)
        return {}
'''


class FakeTemplate(MonaiTemplate):
    """A template of its own layout: the loader batch under ``batch#``, the sliding window's batch ``sw_batch``."""

    name: ClassVar[str] = NAME
    keys: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "num_patches_per_iter": ("batch#patches", "batch#images", "batch#crops", "auto_scale_allowed"),
        "num_sw_batch_size": ("sw_batch",), "validation_device": ("validate_on_cpu",)}

    def view_values(self, reader: ConfigReader) -> dict[str, Any]:
        get = reader.get
        roi = reader.xyz(get("roi_size"), "roi_size")
        return {
            "batch_source": f"batch#patches {get('batch#patches')} per optimizer step", "roi_size": roi,
            "roi_size_valid": roi, "input_channels": int(get("input_channels")),
            "output_classes": int(get("output_classes")), "num_patches_per_iter": int(get("batch#patches")),
            "num_images_per_batch": int(get("batch#images")), "num_crops_per_image": int(get("batch#crops")),
            "num_sw_batch_size": int(get("sw_batch")), "sw_input_on_cpu": bool(get("validate_on_cpu")),
            "sw_overlap": 0.25, "amp": bool(get("amp")), "learning_rate": float(get("learning_rate")),
            "resample_resolution": [1.0, 1.0, 1.0], "num_epochs": int(get("num_epochs")),
            "sigmoid": not get("softmax"), "seed": 0, "auto_scale_allowed": bool(get("auto_scale_allowed")),
            "fold": int(get("fold")), "datalist": str(get("data_list_file_path")),
            "dataroot": str(get("data_file_base_dir")), "network": reader.section("network"),
            "loss": reader.section("loss"), "optimizer": reader.section("optimizer")}

    def updates(self, view: Mapping[str, Any], updates: Mapping[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if "num_patches_per_iter" in updates:
            out.update({"batch#patches": int(updates["num_patches_per_iter"]), "auto_scale_allowed": False,
                        "batch#images": int(updates.get("num_images_per_batch", updates["num_patches_per_iter"])),
                        "batch#crops": int(updates.get("num_crops_per_image", 1))})
        if "num_sw_batch_size" in updates:
            out["sw_batch"] = int(updates["num_sw_batch_size"])
        if "sw_input_on_cpu" in updates:
            out["validate_on_cpu"] = bool(updates["sw_input_on_cpu"])
        return out

    def build(self, parser: Any, config: BundleConfig) -> tuple[Any, Any, Any, Any]:
        return (parser.get_parsed_content("network"), parser.get_parsed_content("loss"),
                parser.get_parsed_content("optimizer", instantiate=False), None)

    def training_loop(self, model: Any, loss_fn: Any, optimizer: Any, accuracy: Any, batch: Any,
                      num_patches_per_iter: int, amp_dtype: Any, config: BundleConfig) -> Iterator[None]:
        from autotune.auto3dseg.templates.dints import train_py_loop

        return train_py_loop(model, loss_fn, optimizer, batch, num_patches_per_iter, amp_dtype)

    def validate(self, model: Any, volume: Any, label: Any, config: BundleConfig, sw_batch_size: int,
                 device: Any, amp_dtype: Any, accuracy: Any, score: bool) -> Any:
        from autotune.auto3dseg.validation import validate_dints

        return validate_dints(model, volume, label, config, sw_batch_size, device, amp_dtype, score=score)


@pytest.fixture()
def fake_template(tmp_path: Path) -> Iterator[Path]:
    """The fake template's folder (a templates folder of one), the template registered while the test runs."""
    from autotune.auto3dseg.templates import register, unregister

    folder = tmp_path / "templates" / NAME
    (folder / "configs").mkdir(parents=True)
    (folder / "scripts").mkdir()
    (folder / "configs" / "hyper_parameters.yaml").write_text(yaml.safe_dump(HYPER_PARAMETERS, sort_keys=False))
    (folder / "scripts" / "__init__.py").write_text("")
    (folder / "scripts" / "algo.py").write_text(ALGO_PY)
    (folder / "scripts" / "train.py").write_text('"""not run by the test"""\n')
    register(FakeTemplate())
    try:
        yield folder.parent
    finally:
        unregister(NAME)


def _known(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """The generated bundle's scripts as a known version of the fake template (recognised by their hashes)."""
    from autotune.auto3dseg import recognise, versions

    configs = tuple(sorted(p.name for p in (root / "configs").iterdir()))
    monkeypatch.setitem(versions.KNOWN_VERSIONS, (NAME, "test-0"),
                        versions.TemplateVersion(NAME, "test-0", configs, recognise.script_hashes(root)))


def test_a_fifth_template_in_one_file_is_generated_tuned_and_written_back(
        fake_template: Path, monai_work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune import BundleGen, tune
    from autotune.bundles.config import load_bundle_config
    from autotune.families import family_of

    gen = BundleGen(tmp_path / "work", algos=NAME, templates_path_or_url=fake_template,
                    data_stats_filename=monai_work / "datastats.yaml", data_src_cfg_name=monai_work / "data_src.yaml")
    [bundle] = [Path(p) for p in gen.generate(tmp_path / "work", num_fold=1)]
    assert bundle.name == f"{NAME}_0" and (bundle / "scripts" / "algo.py").is_file()
    _known(monkeypatch, bundle)
    family = family_of(bundle)
    view = load_bundle_config(bundle)
    assert family.name == "monai" and view.monai_template == NAME and view.tuning_supported
    assert (view.num_patches_per_iter, view.num_sw_batch_size) == (2, 2)  # "$@batch#patches" resolved
    assert family.tunable_keys(view)["num_sw_batch_size"] == ("sw_batch",)
    monkeypatch.setenv("AUTOTUNE_FAKE_PROBE", FAKE)
    [result] = tune([bundle], {"universal": {"range_num_images_per_batch": [1, 8], "range_num_sw_batch_size": [1, 4]}},
                    device="cpu", memory_limit=LIMIT, margin=0.1, handoff="largest", progress=None,
                    storage=f"sqlite:///{tmp_path / 's.db'}")
    assert result["status"] == "tuned" and result["num_patches_per_iter"] == 6
    written = yaml.safe_load((bundle / "configs" / "hyper_parameters.yaml").read_text())
    assert written["batch"]["patches"] == 6 and written["auto_scale_allowed"] is False
    assert written["sw_batch"] == result["num_sw_batch_size"]
    assert written["network"]["in_channels"] == "@input_channels"  # MONAI's references stay as they are
    again = load_bundle_config(bundle)
    assert again.num_patches_per_iter == 6 and again.plan.num_patches_per_iter == 6


def test_a_template_autotune_does_not_tune_is_refused_in_one_line(bundles: dict[str, Path]) -> None:
    """Not run as another template: the builder, the loop and the write-back refuse it by name, in one line."""
    from autotune.auto3dseg.build import build_model_loss_optimizer
    from autotune.auto3dseg.templates import template_named
    from autotune.auto3dseg.workload import MonaiWorkload
    from autotune.auto3dseg.writeback import template_updates
    from autotune.bundles.config import load_bundle_config

    config = load_bundle_config(bundles["dints"]).with_values(monai_template="nosuchtemplate")
    for attempt in (lambda: template_named("nosuchtemplate"), lambda: build_model_loss_optimizer(config, "cpu"),
                    lambda: MonaiWorkload(config, None, None), lambda: template_updates(config.view, {}, {})):
        with pytest.raises(ConfigError, match="autotune does not tune MONAI's nosuchtemplate template") as refused:
            attempt()
        assert "\n" not in str(refused.value) and "segresnet" in str(refused.value)


def test_a_template_is_registered_once() -> None:
    from autotune.auto3dseg.templates import find_template, register

    with pytest.raises(ValueError, match="registered already"):
        register(type(find_template("dints"))())


_NAMES = {"segresnet", "segresnet2d", "dints", "swinunetr", "unet"}
# the registries: MONAI's templates (one module each) and the calibration's own templates
_REGISTRIES = ("auto3dseg/templates/", "families/own.py")


def _names_compared_or_keyed(tree: Any) -> list[int]:
    """Lines where a template's name is compared, is a dict key, or is in a literal table of names."""
    import ast

    from name_scan import lines_telling_apart

    return lines_telling_apart(tree, lambda node: (isinstance(node, ast.Constant) and node.value in _NAMES) or (
        isinstance(node, (ast.Name, ast.Attribute)) and getattr(node, "id", getattr(node, "attr", "")) == "NAME"))


def test_no_template_is_told_apart_by_name_outside_the_registries() -> None:
    """No name compared and no table keyed by one outside the registries (``autotune.auto3dseg.templates``,
    ``autotune.families.own``); no ``"module:function"`` string for importlib in MONAI's templates' package."""
    import ast
    import re

    package = Path(__file__).resolve().parents[2] / "autotune"
    target = re.compile(r"^autotune(\.\w+)+:\w+$")
    found = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package).as_posix()
        tree = ast.parse(path.read_text())
        strings = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                   and target.match(n.value) and where.startswith("auto3dseg/")]
        named = [] if where.startswith(_REGISTRIES) else _names_compared_or_keyed(tree)
        found += [f"{where}:{line}" for line in sorted({*strings, *named})]
    assert found == []
