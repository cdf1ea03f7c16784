"""What a probe and an estimate allocate and run: the loader batches, a validation volume, the
training state, a training step through one loader batch, validation of one volume.

The probe's child (``autotune.probe.trial``) runs these on real tensors and the estimator
(``autotune.probe.estimate``) on fake ones, so both count the same tensors. torch is
imported inside the functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from autotune.bundles.model import BundleConfig

__all__ = ["make_batch", "make_volume", "make_volume_label", "make_loader_batches", "train_loader_batch",
           "validate_volume", "ensure_training_state"]


def make_batch(config: BundleConfig, num_patches: int,
               device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (N, C, *roi) and labels as the training loader gives them: class indices (N, 1, *roi)
    as float, or for sigmoid bundles one binary channel per class."""
    import torch

    roi, channels, classes = config.roi_size, config.input_channels, config.output_classes
    images = torch.randn(num_patches, channels, *roi, device=device)
    if config.sigmoid:
        labels = torch.randint(0, 2, (num_patches, classes, *roi), device=device).float()
    else:
        labels = torch.randint(0, classes, (num_patches, 1, *roi), device=device).float()
    return images, labels


def make_volume(config: BundleConfig, device: str | torch.device) -> torch.Tensor:
    """One validation volume (1, C, *infer_volume_shape); the roi when the shape is not recorded."""
    import torch

    shape = config.infer_volume_shape or config.roi_size
    return torch.randn(1, config.input_channels, *shape, device=device)


def make_volume_label(config: BundleConfig, device: str | torch.device) -> torch.Tensor:
    """The validation label for ``make_volume``'s volume, as the validation loader gives it:
    class indices (1, 1, *shape) as float, or one binary channel per class for sigmoid bundles."""
    import torch

    shape, classes = config.infer_volume_shape or config.roi_size, config.output_classes
    if config.sigmoid:
        return torch.randint(0, 2, (1, classes, *shape), device=device).float()
    return torch.randint(0, classes, (1, 1, *shape), device=device).float()


def make_loader_batches(config: BundleConfig, num_patches_per_iter: int,
                        device: str | torch.device) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    """What training holds on the device at a step: the loader batch being stepped through
    (images x crops patches, ``loader_batch_patches``) and the one the thread loader has prefetched."""
    from autotune.tunables import loader_batch_patches

    total = loader_batch_patches(num_patches_per_iter, config.num_crops_per_image)
    return make_batch(config, total, device), make_batch(config, total, device)


def train_loader_batch(model: Any, loss_fn: Any, optimizer: Any, batch: tuple[torch.Tensor, torch.Tensor],
                       num_patches_per_iter: int, amp_dtype: Any, scaler: Any) -> Any:
    """Step through one loader batch in forward passes of N patches, as training does; returns the last loss."""
    from autotune.step import split_patches, train_step

    loss = None
    for image, label in split_patches(batch[0], batch[1], num_patches_per_iter):
        loss = None  # the last pass's loss is not held through the next: every pass allocates the same
        loss = train_step(model, loss_fn, optimizer, image, label, amp_dtype, scaler)
    return loss


def validate_volume(model: Any, volume: torch.Tensor, label: torch.Tensor, config: BundleConfig, sw_batch_size: int,
                    device: Any, amp_dtype: Any, metric: Any) -> torch.Tensor:
    """Validation of one case as training runs it: sliding window, post-processing and the metric
    where the volume lives; returns the scores (the logits when ``metric`` is None: the estimator's
    volume on the meta device, whose scoring happens off the GPU and is not counted)."""
    from autotune.step import score_case, sliding_window_predict

    logits = sliding_window_predict(model, volume, config.roi_size, int(sw_batch_size), device, config.sw_overlap,
                                    amp_dtype)
    if metric is None:
        return logits
    scores = score_case(logits, label, config, metric)
    metric.reset()
    return scores


def ensure_training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Give every parameter a gradient and the optimizer its state, as after a training step.

    Validation in training runs with both alive, so the infer phase is measured with them,
    whether or not the train phase ran first.
    """
    import torch

    if not optimizer.state:
        for param in model.parameters():
            if param.requires_grad and param.grad is None:
                param.grad = torch.zeros_like(param)
        optimizer.step()
    for param in model.parameters():
        if param.requires_grad and param.grad is None:
            param.grad = torch.zeros_like(param)
