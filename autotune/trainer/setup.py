"""What a training run builds before its first epoch: the data (split, shard, cache, loaders,
schedule) and the model with its recipe (loss, optimizer, schedule, precision, DDP wrapper).

``setup_data`` and ``setup_model`` return plain records; the runner joins them into the
``EpochParts`` every epoch works with.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.bundles.scaling import plan_schedule

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig
    from autotune.precision import Precision
    from autotune.trainer.compiled import CompileRecord
    from autotune.trainer.data import TrainOptions
    from autotune.trainer.ddp import DistContext
    from autotune.trainer.monitor import NvtxRanges

__all__ = ["DataSetup", "ModelSetup", "setup_data", "setup_model", "REGULAR_LR"]

REGULAR_LR = 1e-4  # the seed baseline's Adam learning rate


@dataclass
class DataSetup:
    """The run's data: options, loaders, the training transforms (reseeded per epoch), the schedule
    plan, the split's note, this rank's training cases and the disk cache's estimated bytes (all ranks)."""

    opts: TrainOptions
    train_loader: Any
    val_loader: Any
    train_transforms: Any
    plan: Any
    split_note: str
    num_train_cases: int
    cache_disk_bytes: int


@dataclass
class ModelSetup:
    """The run's network and its recipe: ``model`` the network, ``net`` what trains (DDP-wrapped with
    several processes; through ``torch.compile`` when asked), the loss, optimizer, schedule, scaler, autocast dtype,
    precision, NVTX ranges and what compiling did."""

    model: Any
    net: Any
    loss_fn: Callable[..., Any]
    optimizer: Any
    scheduler: Any
    scaler: Any
    amp_dtype: Any
    precision: Precision
    nvtx: NvtxRanges
    compiled: CompileRecord | None = None


def setup_data(config: BundleConfig, ctx: DistContext, mode: str, total_epochs: int,
               device_free_bytes: int | None, progress: bool) -> DataSetup:
    """Split the fold, take this rank's shard, decide the cache (``device_free_bytes``: the GPU memory
    it may take, None on the CPU) and build datasets and loaders."""
    import autotune.trainer.data as data
    from autotune.build import build_transforms
    from autotune.data.split import split_datalist

    seed = config.seed
    train_cases, val_cases, split_note = split_datalist(config)
    train_cases = data.shard(train_cases, ctx.rank, ctx.world_size, seed, even=True)
    val_cases = data.shard(val_cases, ctx.rank, ctx.world_size, seed, even=False)
    fast_cache = mode == "fast" and config.fast_training.cache
    cache_bytes = data.estimate_cache_bytes(train_cases, config) if fast_cache else None
    opts = data.resolve_options(config, mode, ctx.device, cache_bytes, device_free_bytes)
    # A disk cache holds every rank's training and validation cases (the shards' sizes are about equal).
    disk_bytes = ((cache_bytes or 0) + data.estimate_cache_bytes(val_cases, config)) * ctx.world_size \
        if opts.persistent else 0
    train_transforms = build_transforms(config, "train", device=ctx.device if opts.cache_on_device else None)
    train_ds = data.make_dataset(train_cases, train_transforms, opts, "train", progress)
    val_ds = data.make_dataset(val_cases, build_transforms(config, "val"), opts, "val", progress)
    return DataSetup(
        opts=opts, train_loader=data.make_loader(train_ds, config.tuned.num_images_per_batch, opts, shuffle=True),
        val_loader=data.make_loader(val_ds, 1, opts, shuffle=False), train_transforms=train_transforms,
        # the schedule counts samples: epochs x cases x crops, in ceil(samples / N) optimizer steps
        plan=plan_schedule(config, len(train_ds), total_epochs), split_note=split_note,
        num_train_cases=len(train_ds), cache_disk_bytes=disk_bytes)


def _recipe(config: BundleConfig, model: Any, opts: TrainOptions, plan: Any) -> tuple[Any, Any, Any]:
    """(loss, optimizer, scheduler): the template's, or the seed baseline's in regular mode."""
    import torch

    import autotune.build as build

    if opts.template_recipe:
        loss_fn = build.build_loss(config)
        optimizer = build.build_optimizer(config, model.parameters())
        scheduler = build.build_lr_scheduler(config, optimizer, plan.total_steps, plan.warmup_steps,
                                             plan.warmup_start_factor)
        return loss_fn, optimizer, scheduler
    from monai.losses import DiceLoss

    sigmoid = config.sigmoid
    loss_fn = DiceLoss(to_onehot_y=not sigmoid, softmax=not sigmoid, sigmoid=sigmoid)
    return loss_fn, torch.optim.Adam(model.parameters(), lr=REGULAR_LR), None


def _precision(config: BundleConfig, opts: TrainOptions, device: str, is_main: bool) -> Precision:
    """Fast mode: the precision the bundle was tuned in; regular mode: fp32, as the seed's baseline."""
    from autotune.precision import Precision, for_bundle

    if not opts.template_recipe:
        return Precision("fp32", "regular mode: the seed's baseline runs in fp32")
    precision, warning = for_bundle(config, device)
    if warning and is_main:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    return precision


def setup_model(config: BundleConfig, ctx: DistContext, mode: str, opts: TrainOptions, plan: Any) -> ModelSetup:
    """Build the network (seeded: the same initial weights in every mode and on every rank) and its recipe."""
    import torch

    import autotune.build as build
    from autotune.step import make_grad_scaler
    from autotune.trainer.monitor import NvtxRanges

    device = ctx.device
    seed_everything(config.seed)
    model = build.build_network(config).to(device)
    loss_fn, optimizer, scheduler = _recipe(config, model, opts, plan)
    precision = _precision(config, opts, device, ctx.is_main)
    amp_dtype = build.amp_dtype(config, device, precision.name)
    nvtx = NvtxRanges(opts.nvtx)
    nvtx.attach(model, optimizer)
    net = model
    if ctx.enabled:
        from torch.nn.parallel import DistributedDataParallel

        from autotune.bundles.network import network_named

        index = [torch.device(device).index] if device.startswith("cuda") else None
        unused = network_named(config.network.name).ddp_find_unused_parameters  # steps leaving parameters unused
        net = DistributedDataParallel(model, device_ids=index, find_unused_parameters=unused)
    if device.startswith("cuda") and mode == "fast":
        torch.backends.cudnn.benchmark = True  # the roi is fixed, so the fastest kernels are found once
    from autotune.trainer.compiled import compiled_net

    net, compiled = compiled_net(net, opts.compile and opts.template_recipe)
    return ModelSetup(model=model, net=net, loss_fn=nvtx.wrap_loss(loss_fn), optimizer=optimizer, scheduler=scheduler,
                      scaler=make_grad_scaler(device, amp_dtype), amp_dtype=amp_dtype, precision=precision, nvtx=nvtx,
                      compiled=compiled)


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's generators."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
