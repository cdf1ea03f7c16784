"""Tiny bundles: a small synthetic dataset (2 cases, 32^3, 2 classes), analysed, and one bundle per algorithm
with the ``tiny`` preset (32^3 roi, small networks). The benchmarks of many workers and of the CPU's estimate bound
make them, and so do the tests (``tests/probe_fixtures.py``). The same arguments give the same configs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["ALGOS", "make_tiny_bundles"]

ALGOS = ("segresnet", "dints", "unet")


def make_tiny_bundles(tmp_path: str | Path, algos: Sequence[str] = ALGOS) -> dict[str, Path]:
    """Generate tiny bundles under ``tmp_path``; returns ``{algo: bundle folder}`` (fold 0).

    Takes a few seconds (the data analysis); use it from a session- or module-scoped fixture.
    """
    from autotune.bundles.templates import load_overrides
    from autotune.data import analyze, make_demo_dataset
    from autotune.facade.bundlegen import BundleGen

    root = Path(tmp_path)
    data = make_demo_dataset(root / "data", cases=2, size=32, classes=2, seed=0)
    work = root / "work"
    result = analyze(data, work, num_fold=1, progress=False)
    bundles = BundleGen(
        work, algos=list(algos), data_stats_filename=result.datastats, data_src_cfg_name=result.data_src
    ).generate(work, num_fold=1, overrides=load_overrides("tiny"))
    return {b["algo"]: Path(b["path"]) for b in bundles}
