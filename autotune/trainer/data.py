"""Training data: the fast-mode switches, cached datasets and loaders (the fold split: ``autotune.data.split``).

Fast mode caches the deterministic transforms (``CacheDataset`` in RAM, on the GPU
when ``cache_on_device``, or ``PersistentDataset`` on disk when asked or when RAM
would not hold it) and reads the cache with a ``ThreadDataLoader`` (no worker
processes). Regular mode is the seed's baseline: a plain ``Dataset`` read by a
``DataLoader`` with worker processes, every transform run every epoch.

With several ranks, each rank builds its datasets from its own shard only
(``monai.data.partition_dataset``), so each caches only its part.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.device import available_ram_bytes
from autotune.errors import DataError
from autotune.utils import bars_enabled, look_up_option

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

__all__ = [
    "MODES",
    "TrainOptions",
    "resolve_options",
    "cache_folder",
    "shard",
    "estimate_cache_bytes",
    "make_dataset",
    "make_loader",
    "RaisingThreadLoader",
]

log = logging.getLogger(__name__)

MODES = ("fast", "regular")
# Bytes per voxel held by the cache for one image channel, the label and the fg/bg indices (int64).
_CACHE_BYTES_PER_VOXEL_LABEL = 4 + 8


@dataclass
class TrainOptions:
    """What one run does, resolved from the bundle config, the mode and the device.

    Attributes:
        mode: ``fast`` or ``regular``.
        cache: cache the deterministic transforms.
        persistent: cache on disk (``PersistentDataset``) instead of RAM.
        cache_on_device: hold the cache on the training device (CUDA only).
        thread_loader: read with ``ThreadDataLoader`` (no worker processes).
        compile: ``torch.compile`` the network it trains (``autotune.trainer.compiled``).
        num_workers: worker processes for the regular ``DataLoader`` and for building the cache.
        amp: the bundle's ``amp`` (fast mode); the precision it means is ``autotune.precision``'s.
        template_recipe: use the template's loss, optimizer and schedule (else Adam 1e-4, DiceLoss).
        cache_rate: share of the cases cached.
        cache_dir: folder of the persistent cache.
        nvtx: emit NVTX ranges.
        gpu_monitor: sample the GPU with NVML.
        gpu_monitor_interval_s: seconds between samples.
        cache_note: why the cache is not where the config asked, for the log.
    """

    mode: str
    cache: bool
    persistent: bool
    cache_on_device: bool
    thread_loader: bool
    num_workers: int
    amp: bool
    template_recipe: bool
    cache_rate: float
    cache_dir: Path
    nvtx: bool
    gpu_monitor: bool
    gpu_monitor_interval_s: float
    cache_note: str = ""
    compile: bool = False

    def cache_place(self) -> str:
        """Where the cache is: off, disk, device or RAM."""
        return "off" if not self.cache else "disk" if self.persistent else "device" if self.cache_on_device else "RAM"

    def loader_name(self) -> str:
        """The training loader, as the start line and the summary say it."""
        if self.thread_loader:
            return "ThreadDataLoader"
        return f"DataLoader({self.num_workers} workers)"


def _cache_place(config: BundleConfig, on_cuda: bool, cache_bytes: int | None,
                 device_free_bytes: int | None) -> tuple[bool, bool, str]:
    """Where the fast-mode cache goes: (on disk, on the device, why not where the config asked)."""
    fast = config.fast_training
    persistent = config.persistent_cache and fast.cache
    why = "persistent_cache: true" if persistent else ""
    if fast.cache and not persistent and cache_bytes is not None:
        limit = fast.ram_fraction * available_ram_bytes()
        if cache_bytes * config.cache_rate > limit:
            persistent, why = True, f"cache of about {cache_bytes / 2**30:.1f} GiB would not fit in RAM"
    # Disk-cached items are re-read each epoch; they move to the device per batch instead.
    on_device = on_cuda and fast.cache and not persistent and config.cache_on_device
    if on_device and cache_bytes is not None and device_free_bytes is not None:
        share = cache_bytes * config.cache_rate / max(device_free_bytes, 1)
        if share > fast.device_fraction:
            on_device, why = False, f"cache would take {100 * share:.0f}% of the free GPU memory; held in RAM"
    return persistent, on_device, why


def cache_folder(config: BundleConfig) -> Path:
    """The persistent cache's folder: ``fast_training.cache_dir`` (``~`` expanded, a relative path taken from the
    bundle folder), else ``BUNDLE/cache``."""
    root = Path(config.bundle_root)
    chosen = config.fast_training.cache_dir
    return root / Path(chosen).expanduser() if chosen else root / "cache"


def resolve_options(
    config: BundleConfig, mode: str, device: str, cache_bytes: int | None = None,
    device_free_bytes: int | None = None,
) -> TrainOptions:
    """Resolve the fast-mode switches from ``config.fast_training`` and the top-level keys.

    Args:
        config: the bundle config.
        mode: ``fast`` (each technique on where it applies) or ``regular`` (the seed's baseline).
        device: the training device, e.g. ``cpu`` or ``cuda:0``.
        cache_bytes: estimated size of the cache, to decide between RAM and disk.
        device_free_bytes: free memory of the training GPU, to decide whether the cache goes there.

    Raises:
        ConfigError: an unknown mode.
    """
    mode = look_up_option(mode, MODES, "training mode")
    fast = config.fast_training
    cache_dir = cache_folder(config)
    on_cuda = str(device).startswith("cuda")
    monitor = {"nvtx": on_cuda and fast.nvtx, "gpu_monitor": fast.gpu_monitor,
               "gpu_monitor_interval_s": fast.gpu_monitor_interval_s}
    if mode == "regular":
        return TrainOptions(mode=mode, cache=False, persistent=False, cache_on_device=False, thread_loader=False,
                            num_workers=config.num_workers, amp=False, template_recipe=False, cache_rate=0.0,
                            cache_dir=cache_dir, **monitor)
    persistent, on_device, why = _cache_place(config, on_cuda, cache_bytes, device_free_bytes)
    return TrainOptions(
        mode=mode, cache=fast.cache, persistent=persistent, cache_on_device=on_device,
        thread_loader=fast.thread_loader and fast.cache, num_workers=config.num_workers, amp=config.amp,
        template_recipe=True, cache_rate=config.cache_rate, cache_dir=cache_dir, cache_note=why,
        compile=fast.compile, **monitor,
    )


def shard(items: Sequence[dict], rank: int, world_size: int, seed: int, even: bool) -> list[dict]:
    """This rank's part of ``items`` (``even``: same length on every rank, for equal step counts)."""
    if world_size <= 1:
        return list(items)
    from monai.data import partition_dataset

    if even and len(items) < world_size:
        raise DataError(f"{len(items)} training cases cannot be shared by {world_size} processes; use fewer")
    return list(partition_dataset(list(items), num_partitions=world_size, shuffle=even, seed=seed,
                                  even_divisible=even)[rank])


def estimate_cache_bytes(cases: Sequence[dict], config: BundleConfig) -> int:
    """Bytes the training cache would hold: resampled voxels x (channels x 4 + label 4 + indices 8).

    Read from the NIfTI headers only (shape and spacing); unknown formats count as 0.
    """
    import nibabel as nib

    pixdim = config.resample_resolution
    channels = config.input_channels
    total = 0
    for case in cases:
        image = case["image"][0] if isinstance(case["image"], list) else case["image"]
        try:
            header = nib.load(image).header
        except Exception:  # noqa: BLE001 - an estimate; loading reports real problems later
            continue
        shape, zooms = header.get_data_shape()[:3], header.get_zooms()[:3]
        voxels = 1.0
        for size, zoom, target in zip(shape, zooms, pixdim, strict=False):
            voxels *= max(1.0, size * float(zoom) / target)
        total += int(voxels * (4 * channels + _CACHE_BYTES_PER_VOXEL_LABEL))
    return total


def make_dataset(
    cases: Sequence[dict], transform: Any, opts: TrainOptions, stage: str, progress: bool
) -> Any:
    """A dataset over ``cases`` as ``opts`` says: cached in RAM/on the device, on disk, or plain."""
    from monai.data import CacheDataset, Dataset, PersistentDataset
    from monai.data.utils import json_hashing

    if not opts.cache or not cases:
        return Dataset(list(cases), transform=transform)
    if opts.persistent:
        folder = opts.cache_dir / stage
        folder.mkdir(parents=True, exist_ok=True)
        # The transform's description is part of the key, so an edited config does not reuse stale items.
        return PersistentDataset(list(cases), transform=transform, cache_dir=folder, hash_transform=json_hashing)
    return CacheDataset(
        list(cases),
        transform=transform,
        cache_rate=opts.cache_rate,
        num_workers=max(1, opts.num_workers or (os.cpu_count() or 1)),
        progress=bars_enabled(progress),
        # Random crops copy what they take, so the cached items are never changed in place.
        copy_cache=False,
    )


def make_loader(dataset: Any, batch_size: int, opts: TrainOptions, shuffle: bool) -> Any:
    """``ThreadDataLoader`` over a cache (fast) or ``DataLoader`` with worker processes (regular).

    Both use MONAI's ``list_data_collate``, which flattens the per-image crop lists, so a
    batch holds ``batch_size x num_crops_per_image`` patches.
    """
    from monai.data import DataLoader, ThreadDataLoader

    if opts.thread_loader:
        return RaisingThreadLoader(ThreadDataLoader(dataset, batch_size=batch_size, shuffle=shuffle, num_workers=0))
    workers = 0 if opts.cache_on_device else opts.num_workers
    # Workers restart every epoch, as in the seed's baseline.
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, num_workers=workers)


class RaisingThreadLoader:
    """A ``ThreadDataLoader`` whose loading thread's error is raised where the batches are read.

    MONAI's ``ThreadBuffer`` lets an error in its thread (a transform failing, the disk cache
    refused a write) end the iteration early without a word: an epoch would train on part of
    its batches and validation on none. Here the error reaches the training loop.
    """

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        from monai.data import ThreadDataLoader
        from monai.data.thread_buffer import buffer_iterator

        failures: list[Exception] = []

        def batches() -> Iterator[Any]:
            try:
                yield from super(ThreadDataLoader, self.loader).__iter__()  # the plain loader under the buffer
            except Exception as exc:  # noqa: BLE001 - handed to the reading thread below
                failures.append(exc)

        yield from buffer_iterator(batches(), self.loader.buffer_size, self.loader.buffer_timeout,
                                   self.loader.repeats)
        if failures:
            raise failures[0]
