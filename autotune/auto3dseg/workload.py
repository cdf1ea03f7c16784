"""What a probe and an estimate run for a MONAI bundle: the template's own training loop and validation.

``MonaiWorkload`` has the functions of ``autotune.probe.workload`` (the probe's child and the
estimator call them the same way), with the template's behaviour:

- **the loader batch** is on the host, as MONAI's ``DataLoader`` gives it: images float32 and labels
  float32 (one channel of class indices; MONAI's random spatial transforms return float32; a view's
  ``loader_label_dtype`` names another, as SwinUNETR's uint8), of
  ``images x crops`` patches; no batch is prefetched on the device (MONAI's workers prefetch on the host).
- **SegResNet** (``Segmenter.train_epoch``): the batch moved to the device channels-last, gradients set to
  None, the forward under ``autocast`` (fp16, CUDA only), ``DeepSupervisionLoss`` outside it, the
  GradScaler's step, then the training Dice (``DiceHelper``) on the first output. The loop's variables live
  as long as there: the previous step's first output stays alive (as ``pred``) through the next step.
- **DiNTS** (``train.py``): the host batch shuffled by a permutation (a copy), split into passes of
  ``num_patches_per_iter`` moved to the device; ``loss(outputs.float(), labels)``, backward, gradient
  clipping to 0.5 (after unscaling with AMP), the optimizer step; the previous pass's outputs stay alive
  through the next forward.
- **validation** of one case: SegResNet's ``SlidingWindowInfererAdapt`` (overlap 0.625, Gaussian, its
  cached weight map), stitched on the device or on the CPU (``device: cpu``), Dice on the device; DiNTS's
  ``sliding_window_inference`` (``overlap_ratio_train``) with the input and output on the device or on the
  CPU (``sw_input_on_cpu``), the argmax and per-class Dice as ``train.py`` computes them.

Each loop is a generator, so that the variables one iteration leaves behind are alive in the next, as in
MONAI's loops; a new loop runs one iteration before the one asked for, so the first measured iteration
already holds what the previous one left. The running averages of the epoch (a few scalars on the host)
and the progress prints are left out. MONAI's scripts autocast only on CUDA: here fp16 autocast runs when
the request's precision is fp16 (CUDA with ``amp: true``, or a CUDA target emulated by the estimator).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["MonaiWorkload"]

#: template -> "module:function" validating one case (``validate_dints``'s arguments); SegResNet and DiNTS below
_VALIDATORS = {"swinunetr": "autotune.auto3dseg.swinunetr:validate"}


def _is_fake(tensor: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(tensor, FakeTensor)


def _fp16(amp_dtype: Any) -> bool:
    import torch

    return amp_dtype is torch.float16


def _segresnet_loop(model: Any, loss_function: Any, optimizer: Any, accuracy: Any, batch: Any,
                    amp_dtype: Any, cfg: Mapping[str, Any]) -> Iterator[None]:
    """``Segmenter.train_epoch``, one loader batch per iteration (``num_steps_per_image`` 1)."""
    import torch

    model.train()
    device = next(model.parameters()).device
    memory_format = torch.channels_last_3d if cfg.get("channels_last", True) else torch.preserve_format
    use_amp = _fp16(amp_dtype)
    grad_scaler = torch.amp.GradScaler("cuda", enabled=use_amp and device.type == "cuda")
    sigmoid = bool(cfg.get("sigmoid"))
    while True:
        batch_data = {"image": batch[0], "label": batch[1]}
        data = batch_data["image"].as_subclass(torch.Tensor).to(memory_format=memory_format, device=device)
        target = batch_data["label"].as_subclass(torch.Tensor).to(memory_format=memory_format, device=device)
        data_list, target_list = [data], [target]
        data, target = data_list[0], target_list[0]
        for param in model.parameters():
            param.grad = None
        with torch.autocast(device.type, dtype=torch.float16, enabled=use_amp):
            logits = model(data)
        loss = loss_function(logits, target)
        grad_scaler.scale(loss).backward()
        grad_scaler.step(optimizer)
        grad_scaler.update()
        with torch.no_grad():
            pred = logits[0] if isinstance(logits, (list, tuple)) else logits  # logits2pred(skip_softmax=True)
            if sigmoid:
                pred = torch.sigmoid(pred)
            acc = accuracy(pred, target)
        if isinstance(acc, (list, tuple)):
            acc, batch_size_adjusted = acc  # noqa: F841 - alive until the next step, as in train_epoch
        yield


def _dints_loop(model: Any, loss_function: Any, optimizer: Any, batch: Any, num_patches_per_iter: int,
                amp_dtype: Any) -> Iterator[None]:
    """DiNTS ``train.py``'s loop over one loader batch per iteration."""
    import torch

    model.train()
    device = next(model.parameters()).device
    use_amp = _fp16(amp_dtype)
    scaler = torch.amp.GradScaler("cuda", enabled=device.type == "cuda") if use_amp else None
    try:
        from apex.contrib.clip_grad import clip_grad_norm_  # type: ignore[import-not-found]  # as train.py
    except ModuleNotFoundError:
        from torch.nn.utils import clip_grad_norm_
    loss_torch = torch.zeros(2, dtype=torch.float, device=device)
    n = int(num_patches_per_iter)
    while True:
        inputs_l, labels_l = batch[0], batch[1]
        _idx = torch.randperm(inputs_l.shape[0])
        inputs_l, labels_l = inputs_l[_idx], labels_l[_idx]
        for _k in range(inputs_l.shape[0] // n):
            inputs = inputs_l[_k * n: (_k + 1) * n, ...]
            labels = labels_l[_k * n: (_k + 1) * n, ...]
            inputs = inputs.to(device)
            labels = labels.to(device)
            for param in model.parameters():
                param.grad = None
            if scaler is not None:
                with torch.autocast(device.type, dtype=torch.float16):
                    outputs = model(inputs)
                    loss = loss_function(outputs.float(), labels)
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                clip_grad_norm_(model.parameters(), 0.5)
                scaler.step(optimizer)
                scaler.update()
            else:
                outputs = model(inputs)
                loss = loss_function(outputs.float(), labels)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                optimizer.step()
            loss_torch[0] += 0.0 if _is_fake(loss) else loss.item()
            loss_torch[1] += 1.0
        yield


class MonaiWorkload:
    """The functions of ``autotune.probe.workload`` for a MONAI bundle (see the module docstring).

    Args:
        cfg: the bundle's view (``autotune.auto3dseg.view.load_view``).
        accuracy: SegResNet's training accuracy (``DiceHelper``); None for DiNTS.
        host: where the loader's tensors live: ``cpu``, or ``meta`` when the estimator emulates a GPU
            (host memory is not the GPU's, and meta tensors are not counted).
    """

    def __init__(self, cfg: Mapping[str, Any], loss_fn: Any, accuracy: Any, host: str = "cpu") -> None:
        from autotune.auto3dseg.view import template_of

        self.cfg = cfg
        self.template = template_of(cfg)
        self.loss_fn = loss_fn
        self.accuracy = accuracy
        self.host = host
        self._loop: Iterator[None] | None = None
        self._loop_batch: Any = None
        self._pending: Any = None  # a loader batch made and not yet trained on

    def make_loader_batches(self, cfg: Mapping[str, Any], num_patches_per_iter: int, device: Any) -> tuple[Any, None]:
        """One loader batch on the host (images x crops patches) and no prefetched batch on the device."""
        import torch

        from autotune.step import loader_batch_patches

        host = self.host if torch.device(device).type != "cpu" else "cpu"
        total = loader_batch_patches(num_patches_per_iter, int(cfg.get("num_crops_per_image", 1) or 1))
        roi = [int(v) for v in cfg["roi_size"]]
        images = torch.randn(total, int(cfg["input_channels"]), *roi, device=host)
        if cfg.get("loader_label_dtype"):  # as the template's transforms leave them (SwinUNETR: uint8)
            labels = torch.randint(0, int(cfg["output_classes"]), (total, 1, *roi), device=host,
                                   dtype=getattr(torch, str(cfg["loader_label_dtype"])))
        else:
            labels = torch.randint(0, int(cfg["output_classes"]), (total, 1, *roi), device=host).float()
        self._pending = (images, labels)
        return self._pending, None

    def train_loader_batch(self, model: Any, loss_fn: Any, optimizer: Any, batch: Any, num_patches_per_iter: int,
                           amp_dtype: Any, scaler: Any = None) -> None:
        """One iteration of the template's training loop over ``batch`` (a new loop runs one more first)."""
        self._pending = None
        if self._loop is None or self._loop_batch is not batch:
            self._loop_batch = batch
            if self.template in ("segresnet", "segresnet2d"):  # SegResNet2D: Segmenter.train_epoch too
                self._loop = _segresnet_loop(model, loss_fn, optimizer, self.accuracy, batch, amp_dtype, self.cfg)
            else:
                self._loop = _dints_loop(model, loss_fn, optimizer, batch, num_patches_per_iter, amp_dtype)
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
            batch, _ = self.make_loader_batches(self.cfg, 1, device)
            self.train_loader_batch(model, self.loss_fn, optimizer, batch, 1, None)
            self._loop = self._loop_batch = None
        if self.template in ("segresnet", "segresnet2d"):
            for param in model.parameters():
                param.grad = None

    def make_volume(self, cfg: Mapping[str, Any], device: Any) -> Any:
        """One validation image (1, C, *infer_volume_shape), float32, where validation reads it."""
        import torch

        shape = [int(v) for v in (cfg.get("infer_volume_shape") or cfg["roi_size"])]
        return torch.randn(1, int(cfg["input_channels"]), *shape, device=device)

    def make_volume_label(self, cfg: Mapping[str, Any], device: Any) -> Any:
        """Its label, class indices as uint8 (1, 1, *shape), as MONAI's validation transforms give it."""
        import torch

        shape = [int(v) for v in (cfg.get("infer_volume_shape") or cfg["roi_size"])]
        return torch.randint(0, int(cfg["output_classes"]), (1, 1, *shape), device=device, dtype=torch.uint8)

    def validate_volume(self, model: Any, volume: Any, label: Any, cfg: Mapping[str, Any], sw_batch_size: int,
                        device: Any, amp_dtype: Any, metric: Any) -> Any:
        """Validation of one case as the template runs it; ``metric`` None: the estimator's volume on the meta
        device, scored off the GPU (not counted): the sliding window alone."""
        from autotune.auto3dseg import segresnet2d
        from autotune.auto3dseg.validation import validate_dints, validate_segresnet

        if self.template == segresnet2d.NAME:
            return segresnet2d.validate(model, volume, label, cfg, sw_batch_size, device, amp_dtype, self.accuracy,
                                        score=metric is not None)
        if self.template in _VALIDATORS:
            import importlib

            module, name = _VALIDATORS[self.template].split(":")
            validate = getattr(importlib.import_module(module), name)
            return validate(model, volume, label, cfg, sw_batch_size, device, amp_dtype, score=metric is not None)
        if self.template == "segresnet":
            return validate_segresnet(model, volume, label, cfg, sw_batch_size, device, amp_dtype, self.accuracy,
                                      score=metric is not None)
        return validate_dints(model, volume, label, cfg, sw_batch_size, device, amp_dtype, score=metric is not None)
