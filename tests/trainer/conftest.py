"""Fixtures of the training tests: the small demo's bundles (16^3 volumes and patches, made once per
session) and a private copy of its SegResNet bundle for a test that changes it."""

from __future__ import annotations

from pathlib import Path

import pytest
from bundle_fixtures import copy_bundle


@pytest.fixture()
def bundles(small_demo_bundles: dict[str, Path]) -> dict[str, Path]:
    """The session's small demo bundles (two folds, 16^3 patches): copy one before changing it."""
    return small_demo_bundles


@pytest.fixture()
def bundle(bundles: dict[str, Path], tmp_path: Path) -> Path:
    return copy_bundle(bundles["segresnet_0"], tmp_path / "segresnet_0")
