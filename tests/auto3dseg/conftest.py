"""Fixtures of the MONAI-format tests: the demo data analysed once, and private copies of two small bundles in
MONAI's layout (``monai_fixtures``) with their scripts' hashes registered as a known version."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from monai_fixtures import register_versions, write_dints, write_segresnet


@pytest.fixture(scope="session")
def monai_work(demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo data analysed, with a SegResNet and a DiNTS bundle in MONAI's layout (do not modify)."""
    from autotune import analyze

    folder = tmp_path_factory.mktemp("monai_format")
    analyze(demo_data, folder, num_fold=2, progress=False)
    write_segresnet(folder)
    write_dints(folder)
    return folder


@pytest.fixture()
def bundles(monai_work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Private copies of the two bundles (beside the shared analysis), their version registered."""
    copies = {}
    for name in ("segresnet_0", "dints_0"):
        copies[name.split("_")[0]] = Path(shutil.copytree(monai_work / name, tmp_path / name))
    for name in ("datalist.json", "datastats.yaml", "data_src.yaml"):
        shutil.copy(monai_work / name, tmp_path / name)
    register_versions(monkeypatch, *copies.values())
    return copies
