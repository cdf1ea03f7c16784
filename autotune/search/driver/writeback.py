"""Write a key's result (``autotune.bundles.result.TuningResult``) into its bundles: the tuned values, the loader
batch and learning rate that follow them, and the ``tuning:`` plan (``autotune.bundles.plan.TuningPlan``), written
atomically by the bundle's family (``autotune.bundles.config.write_result``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autotune.bundles.config import Bundle, write_result
from autotune.bundles.result import TuningResult
from autotune.search.handoff import handoff_updates

__all__ = ["check_writable", "write_bundle"]


def check_writable(folders: Sequence[Path]) -> None:
    """Fail before any trial when a folder the results go to cannot be written (or created), writing nothing.

    Raises:
        ConfigError: naming the folder and what to do.
    """
    import os

    from autotune.errors import ConfigError
    from autotune.files import check_creatable

    for folder in sorted(set(folders)):
        check_creatable(folder, "a folder for the results", ConfigError)
        if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
            raise ConfigError(f"{folder}: cannot write the tuned values here (permission denied); make it writable, "
                              "or tune a copy of the bundles")


def write_bundle(path: str, bundle: Bundle, result: TuningResult, write: bool,
                 say: Callable[[str], None]) -> dict[str, Any]:
    """The summary's row of ``bundle`` (given as ``path``): ``result``'s record with the keys the bundle gets (its
    template's keys, the learning rate, the ``tuning:`` block); written into the bundle when ``write``."""
    row = {"bundle": path, **result.as_record()}
    if not result.tuned:
        say(f"[{result.algo}] {bundle.path.name}: not tuned: {result.reason or result.status}")
        return row
    handed = handoff_updates(bundle.config, int(result.num_patches_per_iter or 0), result.handoff_rule)
    recipe = handed.pop("record")  # the learning rate and the schedule follow the handed batch
    row.update(write_result(bundle.config, result, recipe, handed, write=write))
    return row
