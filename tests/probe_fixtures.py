"""Tiny bundles for probe, estimate and search tests (import this module; it is not a conftest).

``make_tiny_bundles(tmp_path)`` writes a small synthetic dataset (2 cases, 32^3, 2 classes),
analyses it and generates one bundle per algorithm with the ``tiny`` preset (32^3 roi,
small networks). The result is stable: the same arguments give the same configs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["ALGOS", "make_tiny_bundles", "shared_tiny_bundles"]

ALGOS = ("segresnet", "dints", "unet")
_SHARED: dict[tuple[str, ...], dict[str, Path]] = {}


def make_tiny_bundles(tmp_path: str | Path, algos: Sequence[str] = ALGOS) -> dict[str, Path]:
    """Generate tiny bundles under ``tmp_path``; returns ``{algo: bundle folder}`` (fold 0).

    Takes a few seconds (the data analysis); use it from a session- or module-scoped fixture.
    """
    from autotune.bundles.bundlegen import BundleGen
    from autotune.bundles.templates import load_overrides
    from autotune.data import analyze, make_demo_dataset

    root = Path(tmp_path)
    data = make_demo_dataset(root / "data", cases=2, size=32, classes=2, seed=0)
    work = root / "work"
    result = analyze(data, work, num_fold=1, progress=False)
    bundles = BundleGen(
        work, algos=list(algos), data_stats_filename=result.datastats, data_src_cfg_name=result.data_src
    ).generate(work, num_fold=1, overrides=load_overrides("tiny"))
    return {b["algo"]: Path(b["path"]) for b in bundles}


def shared_tiny_bundles(tmp_path_factory: object, algos: Sequence[str] = ALGOS) -> dict[str, Path]:
    """``make_tiny_bundles`` once per test session (any number of modules), under ``tmp_path_factory``.

    Call it from a fixture: ``return shared_tiny_bundles(tmp_path_factory)``. Tests must not
    edit the bundles it returns (copy them first).
    """
    key = tuple(algos)
    if key not in _SHARED:
        _SHARED[key] = make_tiny_bundles(tmp_path_factory.mktemp("tiny_bundles"), algos)  # type: ignore[attr-defined]
    return _SHARED[key]
