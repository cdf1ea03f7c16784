"""Fixtures of the training tests: the demo's SegResNet bundles, generated once per module, and a
private copy for a test that changes its bundle."""

from __future__ import annotations

from pathlib import Path

import pytest
from bundle_fixtures import copy_bundle, make_bundles


@pytest.fixture(scope="module")
def bundles(demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_bundles(demo_data, tmp_path_factory.mktemp("trainer_work"))


@pytest.fixture()
def bundle(bundles: dict[str, Path], tmp_path: Path) -> Path:
    return copy_bundle(bundles["segresnet_0"], tmp_path / "segresnet_0")
