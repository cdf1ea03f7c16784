"""The training step and the sliding-window pass, shared by probe, estimator and trainer.

Keeping these in one place is what makes a probe measure what training runs. A ``config`` here is the bundle's
``autotune.bundles.model.BundleConfig`` (typed ``Any``). The loader batch a pass splits from is
``autotune.tunables.loader_batch_patches``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from autotune.finite import StepGuard

__all__ = ["train_step", "micro_batch_sizes", "split_patches", "sliding_window_predict", "num_windows", "make_grad_scaler",
           "make_dice_metric", "score_case"]


def make_dice_metric(config: Any) -> Any:
    """Validation's metric: Dice per class, empty ground truth ignored (background left out for softmax)."""
    from monai.metrics import DiceMetric

    return DiceMetric(include_background=config.sigmoid, reduction="none", ignore_empty=True)


def score_case(logits: torch.Tensor, label: torch.Tensor, config: Any, metric: Any) -> torch.Tensor:
    """Validation's post-processing and metric for one case, where the logits live: argmax and
    one-hot (softmax) or a 0.5 threshold (sigmoid), then Dice per class (NaN where the class is absent)."""
    from monai.networks.utils import one_hot

    num_classes = config.output_classes
    if config.sigmoid:
        pred, target = (logits.float().sigmoid() > 0.5).float(), label
    else:
        pred = one_hot(logits.argmax(dim=1, keepdim=True), num_classes=num_classes)
        target = one_hot(label.round().long(), num_classes=num_classes)
    return metric(pred, target)


def make_grad_scaler(device: str | torch.device, amp_dtype: torch.dtype | None) -> Any:
    """A GradScaler for fp16 autocast on CUDA; None otherwise (bf16 and fp32 need none)."""
    import torch

    if amp_dtype is torch.float16 and torch.device(device).type == "cuda":
        return torch.amp.GradScaler("cuda")
    return None


def train_step(
    model: torch.nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    images: torch.Tensor,
    labels: torch.Tensor,
    amp_dtype: torch.dtype | None = None,
    scaler: Any = None,
    guard: StepGuard | None = None,
    micro_batches: int = 1,
) -> torch.Tensor:
    """One optimizer step on one forward pass of ``images`` (N patches); returns the detached loss.

    With ``micro_batches`` > 1 the N patches go through the network in that many micro-batches
    (``micro_batch_sizes``) whose gradients are accumulated: each micro-batch's loss is weighted by its share
    of the N patches, so the gradient and the returned loss are those of the whole pass (exact where nothing
    reduces over the batch), and the optimizer (and fp16's GradScaler) steps once. Under
    DistributedDataParallel the gradients are synchronised on the last micro-batch only (``no_sync``).

    With a ``guard`` (``autotune.finite``), a step whose loss or gradients are non-finite is not
    applied (``guard.applied`` says which), and too many in a row raise ``NonFiniteSteps``.
    """
    import contextlib

    from autotune.autocast import autocast

    optimizer.zero_grad(set_to_none=True)
    if guard is not None:
        guard.before_forward()
    total = int(images.shape[0])
    sizes = micro_batch_sizes(total, micro_batches)
    loss_sum: Any = None
    start = 0
    for index, size in enumerate(sizes):
        last = index == len(sizes) - 1
        no_sync = getattr(model, "no_sync", None)
        sync = contextlib.nullcontext() if last or no_sync is None else no_sync()
        with sync:
            with autocast(images.device.type, amp_dtype):  # on the CPU with CUDA's float32 list
                logits = model(images[start : start + size])
                loss = loss_fn(logits, labels[start : start + size])
                if len(sizes) > 1:
                    loss = loss * (size / total)  # the micro-batches' losses sum to the whole pass's mean
            if len(sizes) > 1:
                del logits  # not held into the next micro-batch's forward pass
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        start += size
    if guard is not None and not guard.permits(loss_sum, scaler):
        return loss_sum
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return loss_sum


def micro_batch_sizes(total: int, micro_batches: int) -> list[int]:
    """The sizes of ``micro_batches`` micro-batches of a pass of ``total`` patches: as equal as they come, the
    larger first, never empty (at most ``total`` of them).

    >>> micro_batch_sizes(5, 2), micro_batch_sizes(4, 4), micro_batch_sizes(3, 8)
    ([3, 2], [1, 1, 1, 1], [1, 1, 1])
    """
    count = max(1, min(int(micro_batches), int(total)))
    base, extra = divmod(int(total), count)
    return [base + 1 if i < extra else base for i in range(count)]


def split_patches(
    images: torch.Tensor, labels: torch.Tensor, num_patches_per_iter: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Split a loader batch (images x crops patches) into forward passes of at most N patches."""
    step = max(1, int(num_patches_per_iter))
    for start in range(0, images.shape[0], step):
        yield images[start : start + step], labels[start : start + step]


def sliding_window_predict(
    model: torch.nn.Module,
    image: torch.Tensor,
    roi_size: list[int],
    sw_batch_size: int,
    device: str | torch.device,
    overlap: float = 0.5,
    amp_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Sliding-window logits for ``image`` (1, C, H, W, D).

    The image stays where it is (the "validation device": CPU when ``sw_input_on_cpu``),
    windows run on ``device`` and the output is stitched where the image lives, as
    MONAI's ``sliding_window_inference`` does with ``sw_device``/``device``.
    """
    import torch
    from monai.inferers import sliding_window_inference

    from autotune.autocast import autocast

    with torch.no_grad(), autocast(torch.device(device).type, amp_dtype):
        return sliding_window_inference(
            image,
            roi_size=list(roi_size),
            sw_batch_size=int(sw_batch_size),
            predictor=model,
            overlap=overlap,
            mode="gaussian",
            sw_device=torch.device(device),
            device=image.device,
        )


def num_windows(config: Any) -> int:
    """Windows ``sliding_window_predict`` runs over the bundle's validation volume, by MONAI's own scan
    arithmetic: a sliding-window batch larger than this holds no more memory."""
    from monai.data.utils import dense_patch_slices
    from monai.inferers.utils import _get_scan_interval

    roi = tuple(config.roi_size)
    shape = tuple(max(s, r) for s, r in zip(config.infer_volume_shape or roi, roi, strict=True))
    overlap = (tuple(config.sw_overlap_axes) if config.sw_overlap_axes  # per axis (SegResNet2D)
               else (config.sw_overlap,) * len(roi))
    return len(dense_patch_slices(shape, roi, _get_scan_interval(shape, roi, len(roi), overlap)))
