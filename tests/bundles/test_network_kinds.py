"""A fifth template of autotune's own with a network of its own, added in this one file: its network's kind
(``NetworkKind``: the builder, the roi divisor and what DistributedDataParallel needs to know) registered here and
its ``template.yaml`` written here. It is generated, checked against its roi divisor, built, wrapped by DDP as its
kind says and trained one epoch, with no file of ``autotune/`` edited and no module of it naming the network."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from name_scan import lines_telling_apart

from autotune.bundles.network import NetworkKind, network_named, register_network, unregister_network
from autotune.errors import ConfigError

NAME = "TinyNet"  # the network's name in the template's ``network`` section
ALGO = "tinynet"  # the template's name
REPO = Path(__file__).resolve().parents[2]


def build_tiny(section: Any, in_channels: int, out_channels: int) -> Any:
    """A network halving the patch once and restoring it, with one layer no step uses (as DiNTS's inactive paths)."""
    import torch

    width = int(section.args.get("width", 4))

    class TinyNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.down = torch.nn.Conv3d(in_channels, width, 3, stride=2, padding=1)
            self.up = torch.nn.ConvTranspose3d(width, out_channels, 2, stride=2)
            self.spare = torch.nn.Conv3d(width, width, 1)  # never in ``forward``: DDP must look for it

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.up(torch.relu(self.down(x)))

    return TinyNet()


TINY = NetworkKind(NAME, build_tiny, roi_divisor=lambda section: 2, ddp_find_unused_parameters=True)


def tiny_template() -> dict[str, Any]:
    """The template: the shipped UNet's recipe and training keys, with the tiny network."""
    template = yaml.safe_load((REPO / "algorithm_templates" / "unet" / "template.yaml").read_text())
    template.update(name=ALGO, description="a tiny network of its own", network={"name": NAME, "args": {"width": 4}})
    template["roi"] = {"divisor": 2, "min": [16, 16, 16], "max": [32, 32, 32]}
    return template


@pytest.fixture()
def tiny_templates(tmp_path: Path) -> Iterator[Path]:
    """A templates folder holding the tiny template, its network registered while the test runs."""
    folder = tmp_path / "templates" / ALGO
    folder.mkdir(parents=True)
    (folder / "template.yaml").write_text(yaml.safe_dump(tiny_template(), sort_keys=False))
    register_network(TINY)
    try:
        yield folder.parent
    finally:
        unregister_network(NAME)


def _generate(demo_data: Path, work: Path, templates: Path, **overrides: Any) -> Path:
    from autotune import generate

    [bundle] = generate(demo_data, work, algos=ALGO, num_fold=1, templates=templates, progress=False,
                        overrides={"num_epochs": 1, "num_workers": 0, "cache_rate": 0.0, **overrides})
    return Path(bundle["path"])


def test_a_fifth_template_with_its_own_network_is_generated_built_and_trained(
        tiny_templates: Path, demo_data: Path, tmp_path: Path) -> None:
    from autotune import train
    from autotune.build import build_network
    from autotune.bundles.config import load_bundle_config

    bundle = _generate(demo_data, tmp_path / "work", tiny_templates)
    config = load_bundle_config(bundle)
    assert (config.algo, config.network.name) == (ALGO, NAME)
    assert all(v % 2 == 0 for v in config.roi_size)
    model = build_network(config)
    assert type(model).__name__ == NAME and model.up.out_channels == config.output_classes
    summary = train(bundle, device="cpu", epochs=1, progress=False)
    assert summary["epochs_run"] == 1
    with pytest.raises(ConfigError, match=f"does not suit {NAME}: each size must be a multiple of 2"):
        _generate(demo_data, tmp_path / "odd", tiny_templates, roi_size=[17, 16, 16])


def test_ddp_looks_for_unused_parameters_where_the_networks_kind_says(
        tiny_templates: Path, demo_data: Path, tmp_path: Path) -> None:
    """One gloo process in a process group: the DDP wrapper ``setup_model`` makes, for the tiny network and a UNet."""
    import torch.distributed as dist
    from config_fixtures import bundle_config

    from autotune.bundles.config import load_bundle_config
    from autotune.trainer.data import resolve_options
    from autotune.trainer.ddp import DistContext
    from autotune.trainer.setup import setup_model

    configs = {True: load_bundle_config(_generate(demo_data, tmp_path / "work", tiny_templates)),
               False: bundle_config()}  # the tiny UNet
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'group'}", rank=0, world_size=1)
    try:
        for unused, config in configs.items():
            opts = resolve_options(config, "regular", "cpu")
            setup = setup_model(config, DistContext(distributed=True), "regular", opts, None)
            assert setup.net.find_unused_parameters is unused, config.network.name
    finally:
        dist.destroy_process_group()


def test_an_unknown_network_is_refused_in_one_line_and_a_name_is_registered_once() -> None:
    from autotune.bundles.network import network_names, roi_divisor

    assert network_names()[:3] == ("SegResNet", "UNet", "DiNTS")
    assert network_named("DiNTS").ddp_find_unused_parameters and not network_named("UNet").ddp_find_unused_parameters
    with pytest.raises(ConfigError, match="network") as refused:
        roi_divisor({"network": {"name": "NoSuchNet", "args": {}}})
    assert "\n" not in str(refused.value) and "UNet" in str(refused.value)
    with pytest.raises(ValueError, match="registered already"):
        register_network(network_named("UNet"))


def _network_names_told_apart(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines where a network's name is compared, is a dict key, or is in a literal table of names."""
    return lines_telling_apart(tree, lambda node: isinstance(node, ast.Constant) and node.value in names)


def test_no_module_but_the_network_registry_tells_the_networks_apart() -> None:
    """No ``== "DiNTS"``, no tuple of network names, no table keyed by one outside ``autotune/bundles/network.py``
    (MONAI's templates, ``autotune/auto3dseg/``, build their networks from their own configs)."""
    from autotune.bundles.network import network_names

    names = set(network_names())
    package = REPO / "autotune"
    found = [f"{path.relative_to(package).as_posix()}:{line}" for path in sorted(package.rglob("*.py"))
             if path.relative_to(package).as_posix() != "bundles/network.py"
             and not path.relative_to(package).as_posix().startswith("auto3dseg/")
             for line in _network_names_told_apart(ast.parse(path.read_text()), names)]
    assert found == []
