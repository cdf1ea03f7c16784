"""Tiny bundles for probe, estimate and search tests (import this module; it is not a conftest).

``make_tiny_bundles(tmp_path)`` (``benchmarks/tiny_bundles.py``: the benchmarks make them too) writes a small
synthetic dataset (2 cases, 32^3, 2 classes), analyses it and generates one bundle per algorithm with the ``tiny``
preset (32^3 roi, small networks). The result is stable: the same arguments give the same configs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from benchmarks.tiny_bundles import ALGOS, make_tiny_bundles

__all__ = ["ALGOS", "make_tiny_bundles", "shared_tiny_bundles"]

_SHARED: dict[tuple[str, ...], dict[str, Path]] = {}


def shared_tiny_bundles(tmp_path_factory: object, algos: Sequence[str] = ALGOS) -> dict[str, Path]:
    """``make_tiny_bundles`` once per test session (any number of modules), under ``tmp_path_factory``.

    Call it from a fixture: ``return shared_tiny_bundles(tmp_path_factory)``. Tests must not
    edit the bundles it returns (copy them first).
    """
    key = tuple(algos)
    if key not in _SHARED:
        _SHARED[key] = make_tiny_bundles(tmp_path_factory.mktemp("tiny_bundles"), algos)  # type: ignore[attr-defined]
    return _SHARED[key]


def one_window_unet(tmp_path_factory: object, folder: str) -> Path:
    """A private copy of the tiny UNet bundle whose validation volume is one window (quicker probes)."""
    import shutil

    from autotune.bundles.config import update_bundle_config

    src = shared_tiny_bundles(tmp_path_factory, algos=("unet",))["unet"]
    dst = tmp_path_factory.mktemp(folder) / "unet_0"  # type: ignore[attr-defined]
    shutil.copytree(src, dst)
    update_bundle_config(dst, {"infer_volume_shape": [32, 32, 32]})
    return dst


def limit_for_patches(bundle: Path, patches: float, margin: float) -> int:
    """A memory limit whose budget (the limit less ``margin``) holds ``patches`` patches' worth of
    estimated training memory: with 3.5, at most 3 patches per iteration fit."""
    from autotune.probe.estimate import fit_memory_model

    model = fit_memory_model(bundle, phase="train", device="cpu")
    return int((model.intercept + patches * model.slope) / (1 - margin))


def two_fold_work(bundle: Path, root: Path) -> Path:
    """A work folder holding ``bundle`` twice, as folds unet_0 and unet_1 of one algorithm
    (one tuning key, two bundles to write back)."""
    import shutil

    for name in ("unet_0", "unet_1"):
        shutil.copytree(bundle, root / name)
    return root
