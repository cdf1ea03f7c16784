"""Write a key's result into its bundles: the tuned values, the loader batch and learning rate
that follow them, and the ``tuning:`` provenance block (written atomically)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.bundles.config import update_bundle_config
from autotune.search.handoff import handoff_updates

__all__ = ["loader_settings", "check_writable", "write_bundle"]


def loader_settings(num_patches_per_iter: int, num_crops_per_image: int) -> dict[str, int]:
    """Loader batch that splits into whole forward passes of N patches: images x crops = lcm(N, crops)."""
    from autotune.step import loader_batch_patches

    n, crops = int(num_patches_per_iter), max(1, int(num_crops_per_image))
    images = loader_batch_patches(n, crops) // crops  # the probe holds this batch too
    return {"num_patches_per_iter": n, "num_images_per_batch": images, "num_crops_per_image": crops}


def check_writable(folders: Sequence[Path]) -> None:
    """Fail before any trial when a folder the results go to cannot be written."""
    import tempfile

    from autotune.errors import ConfigError

    for folder in sorted(set(folders)):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as exc:
            raise ConfigError(
                f"{folder}: cannot write the tuned values here ({exc.strerror or exc}); "
                "make it writable, or tune a copy of the bundles"
            ) from exc


def write_bundle(
    path: str, cfg: Mapping[str, Any], record: Mapping[str, Any], write: bool, say: Callable[[str], None]
) -> dict[str, Any]:
    """The bundle's result (``record`` with the values it gets); written into the bundle when ``write``."""
    result = {"bundle": path, **record}
    if record.get("status") != "tuned":
        say(f"[{record.get('algo')}] {Path(path).name}: not tuned: {record.get('reason', record.get('status'))}")
        return result
    updates: dict[str, Any] = loader_settings(record["num_patches_per_iter"], cfg.get("num_crops_per_image", 1))
    updates["num_sw_batch_size"] = int(record["num_sw_batch_size"])
    updates["sw_input_on_cpu"] = bool(record["sw_input_on_cpu"])
    handed = handoff_updates(cfg, int(record["num_patches_per_iter"]))  # lr and schedule follow the batch
    provenance = {k: v for k, v in record.items() if k not in ("from_storage",)}
    provenance["recipe"] = handed.pop("record")
    updates.update(handed)
    updates["tuning"] = provenance
    result.update(updates)
    if write:
        update_bundle_config(path, updates)
    return result
