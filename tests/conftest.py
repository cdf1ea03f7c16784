"""Shared fixtures: a small synthetic dataset made once per test session."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

# The shipped CPU calibration (autotune/probe/calibrations/cpu.json) states the estimator's error bound,
# so a CPU search settles N+1 from its estimate instead of probing it. Most tests check the probed edge
# (N fits, N+1 measured and does not), so they run with N+1 probed; tests/search/test_cpu_bound.py
# removes this to check the bounded edge.
os.environ.setdefault("AUTOTUNE_PROBE_EDGE", "1")


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demo dataset (6 cases, about 32^3 voxels, 2 foreground classes, seed 0); returns its folder.

    Shared by the whole session: do not modify it; copy it first (see ``demo_data_copy``).
    """
    from autotune.data.synthetic import make_demo_dataset

    out = tmp_path_factory.mktemp("demo_data") / "demo"
    return make_demo_dataset(out, cases=6, size=32, classes=2, seed=0)


@pytest.fixture()
def demo_data_copy(demo_data: Path, tmp_path: Path) -> Path:
    """A private copy of ``demo_data`` that a test may change."""
    return Path(shutil.copytree(demo_data, tmp_path / "demo"))
