"""What a probe and an estimate run for a MONAI bundle: the template's own training loop and validation.

``MonaiWorkload`` has the functions of ``autotune.probe.workload`` (the probe's child and the
estimator call them the same way), with the template's behaviour:

- **the loader batch** is on the host, as MONAI's ``DataLoader`` gives it: images float32 and labels
  float32 (one channel of class indices; MONAI's random spatial transforms return float32; a view's
  ``loader_label_dtype`` names another, as SwinUNETR's uint8), of
  ``images x crops`` patches; no batch is prefetched on the device (MONAI's workers prefetch on the host).
- **the training loop** is the template's (``MonaiTemplate.training_loop``: SegResNet's ``Segmenter.train_epoch``,
  DiNTS's and SwinUNETR's ``train.py``), and so is **validation** of one case (``MonaiTemplate.validate``), each
  in its template's module of ``autotune.auto3dseg.templates``.

Each loop is a generator, so that the variables one iteration leaves behind are alive in the next, as in
MONAI's loops; a new loop runs one iteration before the one asked for, so the first measured iteration
already holds what the previous one left. The running averages of the epoch (a few scalars on the host)
and the progress prints are left out. MONAI's scripts autocast only on CUDA: here fp16 autocast runs when
the request's precision is fp16 (CUDA with ``amp: true``, or a CUDA target emulated by the estimator).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

__all__ = ["MonaiWorkload"]


class MonaiWorkload:
    """The functions of ``autotune.probe.workload`` for a MONAI bundle (see the module docstring).

    Args:
        config: the bundle's config (``autotune.auto3dseg.view.load_view``, parsed).
        accuracy: the template's training accuracy (SegResNet's ``DiceHelper``); None: it has none.
        host: where the loader's tensors live: ``cpu``, or ``meta`` when the estimator emulates a GPU
            (host memory is not the GPU's, and meta tensors are not counted).
    """

    def __init__(self, config: BundleConfig, loss_fn: Any, accuracy: Any, host: str = "cpu") -> None:
        from autotune.auto3dseg.templates import template_named
        from autotune.auto3dseg.view import template_of

        self.config = config
        self.template = template_named(template_of(config), config.bundle_root or None)
        self.loss_fn = loss_fn
        self.accuracy = accuracy
        self.host = host
        self._loop: Iterator[None] | None = None
        self._loop_batch: Any = None
        self._pending: Any = None  # a loader batch made and not yet trained on

    def make_loader_batches(self, config: BundleConfig, num_patches_per_iter: int, device: Any) -> tuple[Any, None]:
        """One loader batch on the host (images x crops patches) and no prefetched batch on the device."""
        import torch

        from autotune.tunables import loader_batch_patches

        host = self.host if torch.device(device).type != "cpu" else "cpu"
        total = loader_batch_patches(num_patches_per_iter, config.num_crops_per_image)
        roi, classes = config.roi_size, config.output_classes
        images = torch.randn(total, config.input_channels, *roi, device=host)
        if config.loader_label_dtype:  # as the template's transforms leave them (SwinUNETR: uint8)
            labels = torch.randint(0, classes, (total, 1, *roi), device=host,
                                   dtype=getattr(torch, config.loader_label_dtype))
        else:
            labels = torch.randint(0, classes, (total, 1, *roi), device=host).float()
        self._pending = (images, labels)
        return self._pending, None

    def train_loader_batch(self, model: Any, loss_fn: Any, optimizer: Any, batch: Any, num_patches_per_iter: int,
                           amp_dtype: Any, scaler: Any = None) -> None:
        """One iteration of the template's training loop over ``batch`` (a new loop runs one more first)."""
        self._pending = None
        if self._loop is None or self._loop_batch is not batch:
            self._loop_batch = batch
            self._loop = self.template.training_loop(model, loss_fn, optimizer, self.accuracy, batch,
                                                     num_patches_per_iter, amp_dtype, self.config)
            next(self._loop)
        next(self._loop)

    def ensure_training_state(self, model: Any, optimizer: Any) -> None:
        """The state validation runs with, as the template's training leaves it: the optimizer's state and (DiNTS)
        the gradients of the parameters that get one (SegResNet's ``train_epoch`` sets them to None); the loop's
        other leftovers are dropped. Without a training step in this process, one is run (one patch, not
        measured): parameters a template leaves unused (DiNTS's inactive stems) get no state. Before a loader
        batch is traced (the estimator's training phase), nothing: the traced loop makes the state."""
        if self._pending is not None:
            return
        self._loop = self._loop_batch = None
        if not optimizer.state:
            device = next(model.parameters()).device
            batch, _ = self.make_loader_batches(self.config, 1, device)
            self.train_loader_batch(model, self.loss_fn, optimizer, batch, 1, None)
            self._loop = self._loop_batch = None
        if self.template.validates_without_gradients:
            for param in model.parameters():
                param.grad = None

    def make_volume(self, config: BundleConfig, device: Any) -> Any:
        """One validation image (1, C, *infer_volume_shape), float32, where validation reads it."""
        import torch

        shape = config.infer_volume_shape or config.roi_size
        return torch.randn(1, config.input_channels, *shape, device=device)

    def make_volume_label(self, config: BundleConfig, device: Any) -> Any:
        """Its label, class indices as uint8 (1, 1, *shape), as MONAI's validation transforms give it."""
        import torch

        shape = config.infer_volume_shape or config.roi_size
        return torch.randint(0, config.output_classes, (1, 1, *shape), device=device, dtype=torch.uint8)

    def validate_volume(self, model: Any, volume: Any, label: Any, config: BundleConfig, sw_batch_size: int,
                        device: Any, amp_dtype: Any, metric: Any) -> Any:
        """Validation of one case as the template runs it; ``metric`` None: the estimator's volume on the meta
        device, scored off the GPU (not counted): the sliding window alone."""
        return self.template.validate(model, volume, label, config, sw_batch_size, device, amp_dtype, self.accuracy,
                                      score=metric is not None)
