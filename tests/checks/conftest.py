"""A good work folder (the demo data analysed, one tiny UNet bundle generated), made once per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def good_work(demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``work/`` with datastats.yaml, datalist.json and ``unet_0/``: shared, never to be changed by a test
    (tests that change a bundle copy it first)."""
    from bundle_fixtures import make_bundles

    work = tmp_path_factory.mktemp("checks") / "work"
    make_bundles(demo_data, work, algos="unet", num_fold=1)
    return work
