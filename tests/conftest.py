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
# Under pytest-xdist each worker process computes with one thread (and so do the processes it starts):
# two workers on a 2-core machine fill both cores without fighting over them.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


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


@pytest.fixture(scope="session")
def demo_bundles(demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``demo_data`` analysed in two folds and a tiny-preset bundle per algorithm and fold
    (``{"segresnet_0": folder, ...}``), made once per session. Never change them: copy one first
    (``bundle_fixtures.copy_bundle``)."""
    from bundle_fixtures import make_bundles

    return make_bundles(demo_data, tmp_path_factory.mktemp("demo_bundles") / "work", algos="segresnet,dints,unet",
                        num_fold=2)


@pytest.fixture(scope="session")
def demo_bundles_one_fold(demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """As ``demo_bundles`` with one fold (a seeded fifth held out): ``{"unet_0": folder, ...}``."""
    from bundle_fixtures import make_bundles

    return make_bundles(demo_data, tmp_path_factory.mktemp("demo_bundles_one_fold") / "work",
                        algos="segresnet,dints,unet", num_fold=1)


# The training tests' volumes: a 16^3 patch of the same tiny SegResNet on volumes of about 16^3 (the
# training loop, checkpoints, validation and faults take the same paths at an eighth of the voxels; a
# checkpoint keeps its size, the network being the same). The tiny UNet's four strides leave a single
# voxel at 16^3, which its instance norm refuses in training: it keeps 32^3 (``demo_bundles``).
SMALL_ROI = {"roi_size": [16, 16, 16]}


@pytest.fixture(scope="session")
def small_demo_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demo dataset of 6 cases of about 16^3 voxels, 2 foreground classes, seed 0 (shared: copy to change)."""
    from autotune.data.synthetic import make_demo_dataset

    return make_demo_dataset(tmp_path_factory.mktemp("small_demo_data") / "demo", cases=6, size=16, classes=2, seed=0)


@pytest.fixture(scope="session")
def small_demo_bundles(small_demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``small_demo_data`` in two folds with a tiny-preset SegResNet bundle per fold whose patch is 16^3
    (``{"segresnet_0": folder, "segresnet_1": folder}``), made once per session. Never change them: copy
    one first (``bundle_fixtures.copy_bundle``)."""
    from bundle_fixtures import make_bundles

    return make_bundles(small_demo_data, tmp_path_factory.mktemp("small_demo_bundles") / "work",
                        algos="segresnet", num_fold=2, overrides=SMALL_ROI)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject's addopts): one worker per core, two to four (each computes with one thread)."""
    return max(2, min(4, os.cpu_count() or 2))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules that hold the slow tier's end-to-end tests first, then the others by their number of tests.

    ``--dist loadscope`` sends whole modules to the workers in this order (pyproject's addopts turn off
    xdist's own reorder, which sorts by the number of tests alone and so sent the few long end-to-end tests
    last, where one worker ran them while the others had finished). Longest first keeps the tail short.
    Within a module the order is unchanged.
    """
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def weight(tests: list[pytest.Item]) -> tuple[int, int]:
        return (-sum(1 for test in tests if test.get_closest_marker("slow")), -len(tests))

    items[:] = [item for _, tests in sorted(modules.items(), key=lambda entry: weight(entry[1])) for item in tests]
