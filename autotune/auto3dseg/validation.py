"""Validation of one case as MONAI's templates run it during training (see ``autotune.auto3dseg.workload``).

SegResNet: ``Segmenter.val_epoch`` with the ``SlidingWindowInfererAdapt`` that ``Segmenter.__init__``
makes (or the one the bundle's ``sliding_inferrer`` names: tuned bundles get one with the tuned sw batch
and output device). DiNTS: the validation block of ``train.py``. The validation device of a probe is the
volume's device: the CPU means SegResNet stitches on the CPU (its input still goes to the device) and
DiNTS keeps input and output on the CPU (``sw_input_on_cpu``). The window is the config's validation roi
(``roi_size_valid``, else ``roi_size``) and the overlap its ``sw_overlap``, which every template's view states
(``autotune.auto3dseg.templates``: SegResNet's 0.625 and DiNTS's 0.125 when the bundle does not say).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

__all__ = ["segresnet_inferrer", "validate_segresnet", "validate_dints"]

def segresnet_inferrer(config: BundleConfig, sw_batch_size: int, output_device: Any) -> Any:
    """The inferrer SegResNet validates with; its cached weight map (on ``output_device``, else the CPU) is an
    empty tensor of the same shape, dtype and device: memory, not values, is what a probe measures."""
    import torch
    from monai.inferers import SlidingWindowInfererAdapt

    roi = config.validation_roi
    inferrer = SlidingWindowInfererAdapt(roi_size=roi, sw_batch_size=int(sw_batch_size),
                                         overlap=config.sw_overlap, mode="gaussian",
                                         cache_roi_weight_map=False, progress=False, device=output_device)
    inferrer.roi_weight_map = torch.empty(roi, dtype=torch.float32, device=output_device or "cpu")
    return inferrer


def validate_segresnet(model: Any, volume: Any, label: Any, config: BundleConfig, sw_batch_size: int, device: Any,
                       amp_dtype: Any, accuracy: Any, score: bool = True,
                       make_inferrer: Callable[[Any], Any] | None = None) -> Any:
    """One case of ``Segmenter.val_epoch`` (no post-transforms, no validation loss, as during training).

    ``make_inferrer``: the output device (None: the compute device) -> the inferrer, for a Segmenter that makes
    its own (``Segmenter2D``); default ``segresnet_inferrer``."""
    import torch

    device = torch.device(device)
    memory_format = torch.channels_last_3d if config.channels_last else torch.preserve_format
    off_device = volume.device.type != device.type  # validation on the CPU: stitched there
    output_device = volume.device if off_device else None
    inferrer = (make_inferrer(output_device) if make_inferrer is not None
                else segresnet_inferrer(config, sw_batch_size, output_device))
    with torch.no_grad():  # val_epoch is decorated with torch.no_grad()
        data = volume.as_subclass(torch.Tensor).to(memory_format=memory_format, device=device)
        with torch.autocast(device.type, dtype=torch.float16, enabled=amp_dtype is torch.float16):
            logits = inferrer(inputs=data, network=model)
        data = None
        if not score:
            return logits
        pred = logits[0] if isinstance(logits, (list, tuple)) else logits
        if config.sigmoid:
            pred = torch.sigmoid(pred)
        target = label.as_subclass(torch.Tensor)
        acc = accuracy(pred.to(device=device), target.to(device=device))
        if isinstance(acc, (list, tuple)):
            acc = acc[0]
        acc = acc.detach().clone()
    return acc


def validate_dints(model: Any, volume: Any, label: Any, config: BundleConfig, sw_batch_size: int, device: Any,
                   amp_dtype: Any, score: bool = True) -> Any:
    """One case of DiNTS ``train.py``'s validation: sliding window, argmax on the CPU, per-class Dice."""
    import torch
    from monai.inferers import sliding_window_inference

    device = torch.device(device)
    device_in = device_out = volume.device  # sw_input_on_cpu: both on the CPU, else both on the device
    val_images = volume
    val_labels = label.to(device_out)
    roi = config.validation_roi
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.float16, enabled=amp_dtype is torch.float16):
        val_outputs = sliding_window_inference(inputs=val_images, roi_size=roi, sw_batch_size=int(sw_batch_size),
                                               predictor=model, mode="gaussian",
                                               overlap=config.sw_overlap, sw_device=device,
                                               device=device_out)
    del val_images
    if not score:
        return val_outputs
    with torch.no_grad():
        return _dints_dice(val_outputs, val_labels, device_in, device, config)


def _dints_dice(val_outputs: Any, val_labels: Any, device_in: Any, device: Any, config: BundleConfig) -> Any:
    """The argmax on the CPU and the per-class Dice on the input's device, as train.py scores a case."""
    import torch
    from monai.metrics import compute_dice

    softmax = not config.sigmoid
    val_labels = val_labels.cpu()
    val_outputs = val_outputs.cpu()
    if softmax:  # post_pred: EnsureType, AsDiscrete(argmax=True): an int64 argmax, returned as float32
        val_outputs = torch.argmax(val_outputs[0, ...], dim=0, keepdim=True).to(torch.float)[None, ...]
    else:  # Activations(sigmoid=True), AsDiscrete(threshold=0.5 + eps)
        val_outputs = (torch.sigmoid(val_outputs[0, ...]) >= 0.5 + 1.2e-7).to(torch.float)[None, ...]
    val_labels = val_labels.to(device_in)
    val_outputs = val_outputs.to(device_in)
    metric_dim = config.output_classes - 1 if softmax else config.output_classes
    if not softmax:
        return compute_dice(y_pred=val_outputs, y=val_labels, include_background=True).to(device)
    val_labels = val_labels.int()
    value = torch.zeros(1, metric_dim).to(device)
    for k in range(1, metric_dim + 1):
        value[0, k - 1] = compute_dice(y_pred=(val_outputs == k).float(), y=(val_labels == k).float(),
                                       include_background=False)
    return value
