"""Write a key's result into its bundles: the tuned values, the loader batch and learning rate that
follow them, and the ``tuning:`` plan (``autotune.bundles.plan.TuningPlan``), written atomically."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.bundles.config import Bundle, update_bundle_config
from autotune.bundles.plan import TuningPlan
from autotune.search.handoff import handoff_updates
from autotune.tunables import written_values

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


def write_bundle(path: str, bundle: Bundle, record: Mapping[str, Any], write: bool,
                 say: Callable[[str], None]) -> dict[str, Any]:
    """The result of ``bundle`` (given as ``path``): ``record`` with the values it gets; written into the bundle
    when ``write``."""
    result = {"bundle": path, **record}
    if record.get("status") != "tuned":
        say(f"[{record.get('algo')}] {bundle.path.name}: not tuned: {record.get('reason', record.get('status'))}")
        return result
    updates: dict[str, Any] = written_values(record, bundle.config)  # each tunable's plain keys (autotune.tunables)
    rule = str((record.get("handoff") or {}).get("rule") or "goodput")
    handed = handoff_updates(bundle.config, int(record["num_patches_per_iter"]), rule)  # lr and schedule follow the batch
    recipe = handed.pop("record")
    updates.update(handed)
    updates["tuning"] = TuningPlan.from_record(record, recipe).as_dict()
    result.update(updates)
    if write:
        update_bundle_config(bundle.path, updates)
    return result
