"""Read, check and write a bundle's config, whichever template family wrote the bundle.

This file is the hand-off between generation, tuning and training: a person can read and
edit it, and every stage reads it through ``load_bundle`` (a ``Bundle``: the folder, the
checked config and its typed ``tuning:`` plan) or ``load_bundle_config`` (the config alone),
which check the values the stages rely on and name the key at fault. The bundle's template family
(``autotune.families``: autotune's own templates, MONAI's) reads and writes it; the key table every
family's view is checked against is ``autotune.bundles.schema``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.bundles.model import BundleConfig
from autotune.bundles.plan import TuningPlan
from autotune.bundles.result import TuningResult
from autotune.bundles.schema import (
    CONFIG_RELPATH,
    MAX_BATCH,
    bundle_config_path,
    check_bundle_config,
    check_config_values,
    save_bundle_config,
)

__all__ = [
    "CONFIG_RELPATH",
    "BundleConfig",
    "Bundle",
    "load_bundle",
    "bundle_config_path",
    "load_bundle_config",
    "save_bundle_config",
    "update_bundle_config",
    "write_result",
    "check_bundle_config",
    "check_config_values",
    "MAX_BATCH",
]


def load_bundle_config(bundle: str | os.PathLike[str]) -> BundleConfig:
    """Load and check a bundle config as its template family reads it; ``bundle_root`` is set to the bundle
    folder.

    Raises:
        ConfigError: missing file, bad YAML, or an invalid value (the key is named).
    """
    from autotune.families import family_of

    return family_of(bundle).load_config(bundle)


@dataclass(frozen=True)
class Bundle:
    """A loaded bundle: what every stage hands on instead of reloading it.

    Attributes:
        path: the bundle folder.
        config_path: its ``configs/hyper_parameters.yaml``.
        config: the checked config (``bundle_root`` set to ``path``).
        plan: the typed ``tuning:`` block, or None when the bundle was never tuned.
    """

    path: Path
    config_path: Path
    config: BundleConfig
    plan: TuningPlan | None


def load_bundle(bundle: str | os.PathLike[str]) -> Bundle:
    """Load and check a bundle once: its config and its plan.

    Raises:
        ConfigError: missing file, bad YAML, or an invalid value, the tuning block's included (the key is named).
    """
    config = load_bundle_config(bundle)
    return Bundle(Path(config.bundle_root), bundle_config_path(bundle), config, config.plan)


def update_bundle_config(bundle: str | os.PathLike[str], updates: Mapping[str, Any]) -> BundleConfig:
    """Write ``updates`` (plain top-level keys: tuned values, the loader batch, the learning rate, ``tuning``)
    into the bundle, where its template family keeps them, atomically; returns the config read back."""
    from autotune.families import family_of

    return family_of(bundle).write_back(bundle, updates)


def write_result(config: BundleConfig, result: TuningResult, recipe: Mapping[str, Any],
                 follow: Mapping[str, Any], write: bool = True) -> dict[str, Any]:
    """Write a tuned ``result`` into the bundle of ``config`` through its template family: each tuned value once,
    in the template's own keys (``autotune.tunables.written_values``: the batch with the loader batch that yields
    it, the sliding-window batch, where validation lives), the keys that ``follow`` the batch (the learning rate
    and warm-up), and the ``tuning:`` block as provenance (``TuningPlan.from_result`` with the hand-off's
    ``recipe``). Returns the plain keys written (nothing is written unless ``write``).

    Raises:
        ConfigError: the result or a key to write is refused (one line naming it).
    """
    from autotune.tunables import written_values

    updates: dict[str, Any] = {**written_values(result.point, config), **follow,
                               "tuning": TuningPlan.from_result(result, recipe).as_dict()}
    if write:
        update_bundle_config(config.bundle_root, updates)
    return updates
