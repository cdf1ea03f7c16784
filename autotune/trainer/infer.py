"""Sliding-window prediction: validation Dice during training, and NIfTI predictions for new images.

Both run ``autotune.step.sliding_window_predict`` with the bundle's tuned settings, read through
``autotune.bundles.tuned`` (``num_sw_batch_size``, the volume where its ``validation_device`` puts it), and
its ``sw_overlap``.
Predictions are written in each input's own geometry: the infer transforms'
orientation and resampling are inverted with MONAI's ``Invertd`` (nearest neighbour).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import ConfigError, HostWriteError, InputError
from autotune.utils import bars_enabled, read_json

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from autotune.bundles.model import BundleConfig
    from autotune.trainer.ddp import DistContext

__all__ = ["infer", "evaluate", "model_dir", "resolve_checkpoint", "load_model", "plain_tensor", "predict_args", "class_labels"]

log = logging.getLogger(__name__)


def model_dir(config: BundleConfig) -> Path:
    """``BUNDLE/model_fold<k>``: where checkpoints and metrics go."""
    return Path(config.bundle_root) / f"model_fold{config.fold}"


def class_labels(config: BundleConfig) -> list[str]:
    """Names of the classes Dice is reported for (foreground only for softmax bundles)."""
    count = config.output_classes if config.sigmoid else config.output_classes - 1
    names = [str(n) for n in (config.class_names or [])]
    if len(names) != count:
        names = [f"class{i}" for i in range(1, count + 1)]
    return ["".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name) for name in names]


def plain_tensor(tensor: Any) -> torch.Tensor:
    """A MONAI ``MetaTensor`` as a plain tensor (metadata tracking slows the network down)."""
    return tensor.as_tensor() if hasattr(tensor, "as_tensor") else tensor


def resolve_checkpoint(config: BundleConfig, checkpoint: str | os.PathLike[str]) -> Path:
    """``best``, ``last`` or a path -> an existing checkpoint file.

    Raises:
        ConfigError: the checkpoint does not exist (says which command makes it).
    """
    name = str(checkpoint)
    path = model_dir(config) / f"{name}.pt" if name in ("best", "last") else Path(name).expanduser()
    if not path.is_file():
        raise ConfigError(f"{path}: checkpoint not found; run 'autotune train {config.bundle_root}' first")
    return path


def load_model(config: BundleConfig, path: Path, device: str) -> torch.nn.Module:
    """The bundle's network with the weights in ``path``, on ``device``, in eval mode.

    Raises:
        ConfigError: the file is not a checkpoint of this bundle's network.
    """
    import torch

    from autotune.build import build_network

    model = build_network(config)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        weights = state["model"] if "model" in state else state
        _refuse_other_shapes(config, model, weights, path)
        model.load_state_dict(weights)
    except (RuntimeError, KeyError, TypeError, OSError, AttributeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{path}: not a checkpoint of this bundle's network ({first})") from exc
    return model.to(device).eval()


def _refuse_other_shapes(config: BundleConfig, model: Any, weights: Mapping[str, Any], path: Path) -> None:
    """Refuse weights of another shape than the bundle's network, naming the first tensor that differs and the
    bundle keys its shape comes from (a checkpoint of a bundle with other channels or classes).

    Raises:
        ConfigError: naming the checkpoint, the tensor, both shapes and the bundle's input_channels and output_classes.
    """
    own = model.state_dict()
    for key, tensor in weights.items():
        if key in own and hasattr(tensor, "shape") and tuple(tensor.shape) != tuple(own[key].shape):
            raise ConfigError(f"{path}: {key} has shape {list(tensor.shape)} in the checkpoint but "
                              f"{list(own[key].shape)} in the network of this bundle (input_channels "
                              f"{config.input_channels}, output_classes {config.output_classes} in "
                              f"{config.bundle_root or 'its config'}); give a checkpoint trained from this bundle")


def predict_args(config: BundleConfig) -> dict[str, Any]:
    """The sliding window's arguments: the roi, the tuned window batch (``autotune.bundles.tuned``), the overlap."""
    return {"roi_size": list(config.roi_size), "sw_batch_size": config.tuned.num_sw_batch_size,
            "overlap": config.sw_overlap}


def evaluate(
    model: torch.nn.Module,
    loader: Any,
    config: BundleConfig,
    device: str,
    amp_dtype: torch.dtype | None,
    ctx: DistContext,
    nvtx: Any = None,
    fallbacks: Any = None,
    epoch: int = 0,
    memory: Any = None,
) -> tuple[list[float | None], float | None]:
    """Sliding-window Dice per class and their mean over the validation cases of every rank.

    Cases where a class is absent from the ground truth do not count for that class
    (MONAI ``DiceMetric`` with ``ignore_empty``); the background is left out for softmax bundles.
    With ``fallbacks`` (``autotune.trainer.fallback.MemoryFallbacks``) its sliding-window batch and validation
    device are used, and a case that runs out of memory is scored again after a step-down (``epoch``, and
    ``memory``'s peak at the failure, go to its record); the ranks then agree on the step-downs.

    Returns:
        (Dice per class, None where no case has the class; mean over the classes with a value).
    """
    from autotune.step import make_dice_metric, score_case, sliding_window_predict
    from autotune.trainer.ddp import all_reduce_sum

    sigmoid = config.sigmoid
    num_classes = config.output_classes
    volume_device = config.tuned.validation_device.volume_device(device)
    metric = make_dice_metric(config)
    count = num_classes if sigmoid else num_classes - 1
    sums, counts = [0.0] * count, [0.0] * count
    was_training = model.training
    model.eval()
    for case, batch in enumerate(loader, 1):
        if fallbacks is None:
            image = plain_tensor(batch["image"]).to(volume_device)
            label = plain_tensor(batch["label"]).to(volume_device)
            logits = sliding_window_predict(model, image, device=device, amp_dtype=amp_dtype, **predict_args(config))
            scores = score_case(logits, label, config, metric).detach().cpu()
        else:
            scores = _score_stepping_down(model, batch, config, device, amp_dtype, metric, fallbacks, epoch, case, memory)
        for row in scores:
            for index, value in enumerate(row.tolist()[:count]):
                if value == value:  # not NaN: the class is in this case's ground truth
                    sums[index] += value
                    counts[index] += 1
        metric.reset()
    model.train(was_training)
    if fallbacks is not None and ctx.enabled:  # every rank validates with the smallest step-downs any rank took
        from autotune.trainer.ddp import all_ranks_max
        from autotune.tunables import ValidationDevice

        cpu = int(fallbacks.validation_device is ValidationDevice.CPU)
        negative_sw, cpu = all_ranks_max(ctx, [-fallbacks.sw_batch, cpu])
        fallbacks.sw_batch, fallbacks.validation_device = -int(negative_sw), ValidationDevice.of_flag(bool(cpu))
    totals = all_reduce_sum(ctx, sums + counts)
    per_class = [s / c if c else None for s, c in zip(totals[:count], totals[count:], strict=True)]
    present = [v for v in per_class if v is not None]
    return per_class, (sum(present) / len(present) if present else None)


def _score_stepping_down(model: Any, batch: Mapping[str, Any], config: BundleConfig, device: str, amp_dtype: Any,
                         metric: Any, fallbacks: Any, epoch: int, case: int, memory: Any) -> Any:
    """One case's Dice per class with the sliding-window batch and validation device in force, stepping down
    (``fallbacks.validation_oom``) and scoring it again after each out-of-memory."""
    from autotune.probe.memory import is_oom_error
    from autotune.step import score_case, sliding_window_predict
    from autotune.trainer.fallback import release_memory

    while True:
        volume_device = fallbacks.validation_device.volume_device(device)
        failed = False
        try:
            image = plain_tensor(batch["image"]).to(volume_device)
            label = plain_tensor(batch["label"]).to(volume_device)
            logits = sliding_window_predict(model, image, device=device, amp_dtype=amp_dtype,
                                            **{**predict_args(config), "sw_batch_size": fallbacks.sw_batch})
            return score_case(logits, label, config, metric).detach().cpu()
        except Exception as exc:
            if not is_oom_error(exc):
                raise
            failed = True  # stepped down below, once this frame no longer holds the failed case's tensors
        if failed:
            image = label = logits = None
            metric.reset()
            release_memory(device)
            fallbacks.validation_oom(memory.failed_peak() if memory is not None else None, epoch, case)


def _input_files(images: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Any]:
    """Image paths from a list of files, one file, or a datalist JSON (its testing cases, else training)."""
    items = [images] if isinstance(images, (str, os.PathLike)) else list(images)
    if not items:
        raise InputError("no images given; pass image files or a datalist .json")
    if len(items) == 1 and str(items[0]).endswith(".json"):
        datalist = read_json(items[0], InputError)
        entries = (datalist.get("testing") or datalist.get("training") or []) if isinstance(datalist, dict) else []
        root = Path(items[0]).resolve().parent
        items = []
        for entry in entries:
            image = entry["image"] if isinstance(entry, dict) else entry
            paths = image if isinstance(image, list) else [image]
            resolved = [str(p if Path(p).is_absolute() else root / p) for p in paths]
            items.append(resolved if isinstance(image, list) else resolved[0])
        if not items:
            raise InputError(f"{images}: the datalist has no 'testing' or 'training' images")
    for item in items:
        for path in item if isinstance(item, list) else [item]:
            if not Path(path).is_file():
                raise InputError(f"{path}: image not found; check the path")
    return items


def _output_name(item: Any, used: set[str]) -> str:
    first = Path(item[0] if isinstance(item, list) else item).name
    stem = first[: -len(".nii.gz")] if first.endswith(".nii.gz") else Path(first).stem
    name, index = f"{stem}_seg.nii.gz", 1
    while name in used:  # two inputs with the same file name in different folders
        index += 1
        name = f"{stem}_{index}_seg.nii.gz"
    used.add(name)
    return name


def infer(
    bundle: str | os.PathLike[str],
    images: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    output_dir: str | os.PathLike[str],
    *,
    device: str = "auto",
    checkpoint: str | os.PathLike[str] = "best",
    progress: bool = True,
) -> list[Path]:
    """Predict a label map for each image and write it as NIfTI in the image's own geometry.

    Args:
        bundle: a trained bundle folder.
        images: image files, or one datalist JSON (its ``testing`` cases, else its ``training`` images); each
            must fit the bundle (``autotune.data.bundle_fit``: 3D, the bundle's ``input_channels``).
        output_dir: where ``<name>_seg.nii.gz`` files go (created if needed, said in one line), once every
            input is checked.
        device: ``auto`` (the first GPU, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``; windows run there.
        checkpoint: ``best``, ``last`` or a checkpoint path.
        progress: show a progress bar (stderr).

    Returns:
        The prediction files, in input order.

    Raises:
        ConfigError: bad bundle or checkpoint.
        InputError: missing images, or an output path that is a file.
        DataError: an image the bundle cannot take (its channels or axes), naming the file, the key and both values.
        SpecError: an unavailable device.
        HostWriteError: the output folder refused a write; says which predictions were written.
    """
    from tqdm import tqdm

    from autotune.bundles.config import bundle_config_path, load_bundle_config
    from autotune.data.bundle_fit import check_images_fit
    from autotune.device import check_device, resolve_device
    from autotune.files import check_creatable

    config = load_bundle_config(bundle)
    device = check_device(resolve_device(device))
    files = _input_files(images)
    check_images_fit(config, files, bundle_config_path(bundle))  # before the model is built or a window run
    check_creatable(output_dir, "the predictions folder (--output)", InputError)
    predict = _Predictor(config, load_model(config, resolve_checkpoint(config, checkpoint), device), device)
    out = _output_folder(output_dir)
    written: list[Path] = []
    used: set[str] = set()
    for item in tqdm(files, desc="infer", unit="image", disable=not bars_enabled(progress)):
        labels, affine = predict(item)
        try:
            written.append(_write_prediction(out / _output_name(item, used), labels, affine))
        except HostWriteError as exc:
            raise _with_predictions_kept(exc, written, len(files), out) from exc
    return written


class _Predictor:
    """``predictor(image)`` -> (label map as uint8 in the image's own geometry, its affine)."""

    def __init__(self, config: BundleConfig, model: torch.nn.Module, device: str) -> None:
        from monai.transforms import Invertd

        from autotune.build import amp_dtype, build_transforms

        self.config, self.model, self.device = config, model, device
        self.transforms = build_transforms(config, "infer")
        self.invert = Invertd(keys="pred", transform=self.transforms, orig_keys="image", nearest_interp=True)
        self.volume_device = config.tuned.validation_device.volume_device(device)
        self.amp_dtype = amp_dtype(config, device)

    def __call__(self, item: Any) -> tuple[Any, Any]:
        import numpy as np
        from monai.data import MetaTensor

        from autotune.step import sliding_window_predict

        data = self.transforms({"image": item})
        logits = sliding_window_predict(
            self.model, plain_tensor(data["image"]).unsqueeze(0).to(self.volume_device), device=self.device,
            amp_dtype=self.amp_dtype, **predict_args(self.config),
        )[0].float()
        if self.config.sigmoid:
            pred = (logits.sigmoid() > 0.5).float()
        else:
            pred = logits.argmax(dim=0, keepdim=True).float()
        # Invertd takes the transform record from "image" and needs "pred" to be a MetaTensor too.
        restored = self.invert({"image": data["image"], "pred": MetaTensor(pred.cpu())})["pred"]
        array = plain_tensor(restored).numpy()
        array = array[0] if array.shape[0] == 1 else np.moveaxis(array, 0, -1)
        affine = np.asarray(plain_tensor(restored.affine).numpy(), dtype=np.float64)
        return np.rint(array).astype(np.uint8), affine


def _output_folder(output_dir: str | os.PathLike[str]) -> Path:
    """``output_dir``, created if needed and then said in one line (a refusal by the host is one
    ``HostWriteError`` line)."""
    from autotune.files import make_folder

    return make_folder(output_dir, "the predictions folder")


def _write_prediction(path: Path, labels: Any, affine: Any) -> Path:
    """``labels`` as a gzipped NIfTI at ``path``, through the one atomic write path."""
    import gzip

    import nibabel as nib

    from autotune.files import atomic_write_bytes

    # Compressed in memory: the write path then knows the exact bytes a full disk refused.
    data = gzip.compress(nib.Nifti1Image(labels, affine).to_bytes(), compresslevel=1)
    return atomic_write_bytes(path, data, what="the prediction")


def _with_predictions_kept(exc: HostWriteError, written: list[Path], total: int, out: Path) -> HostWriteError:
    """``exc`` saying which predictions were written before it, and how to go on."""
    last = f" (the last: {written[-1].name})" if written else ""
    return exc.with_outcome(
        kept=f"{len(written)} of {total} predictions in {out}{last}",
        then=(f"free space, then run the same command again (it predicts all {total} images), "
              f"or give --images only the {total - len(written)} not written"))
