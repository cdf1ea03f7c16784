"""MONAI Auto3DSeg's ``Algo`` interface over an autotune bundle.

Code written for MONAI's ``BundleGen`` reads ``history[i]["algo_instance"]`` and calls
``train(train_params)``, ``get_score()`` and ``predict(files, predict_params)``, then
ensembles with ``AlgoEnsembleBestN`` / ``AlgoEnsembleBuilder``. ``AutotuneAlgo`` answers
those calls with autotune's own runner and inference: fast mode by default, the bundle's
tuned values (patches per iteration, sliding-window batch, validation device), which
``train_params`` cannot change (they were measured for the bundle's memory limit), and on
CUDA that memory limit (``tuning.memory_limit``) enforced as ``autotune train --memory-limit``
does.

``train_params`` that change config values are written, merged into the bundle config,
to ``configs/hyper_parameters_train.yaml`` and training reads that file, so
``configs/hyper_parameters.yaml`` stays as generated and tuned, and what was trained
can be read. ``predict`` returns, per file, the class probabilities (softmax, or sigmoid
for multi-label bundles) in the input's own geometry, a ``MetaTensor`` of shape
(classes, *input shape), which is what MONAI's templates return and what its ensembles
average; ``predict_params={"output": "label"}`` gives the label map instead.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from monai.auto3dseg.algo_gen import Algo

from autotune.bundles.config import (
    CONFIG_RELPATH,
    bundle_config_path,
    check_bundle_config,
    load_bundle_config,
)
from autotune.errors import ConfigError, InputError
from autotune.facade.algo_params import (
    ENSEMBLE_PASSED_KEYS,
    PredictOptions,
    parse_predict_params,
    parse_train_params,
)
from autotune.files import atomic_write_yaml
from autotune.utils import expand_path, read_json, read_yaml

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

__all__ = ["AutotuneAlgo", "InferClass", "TRAIN_CONFIG_RELPATH", "default_device", "ensemble_passed_keys"]

TRAIN_CONFIG_RELPATH = Path("configs") / "hyper_parameters_train.yaml"
# MONAI's AlgoKeys values (monai.utils.enums.AlgoKeys), as plain strings.
ID, ALGO, IS_TRAINED, SCORE = "identifier", "algo_instance", "is_trained", "best_metric"


def default_device(config: BundleConfig) -> str:
    """The device the bundle was tuned on when it is here, else the first GPU, else the CPU."""
    plan = config.plan
    tuned = plan.device if plan is not None else ""
    cuda = torch.cuda.is_available()
    if tuned == "cpu" or (tuned.startswith("cuda") and cuda):
        return tuned
    return "cuda:0" if cuda else "cpu"


def ensemble_passed_keys() -> tuple[str, ...]:
    """Keys MONAI's ``AlgoEnsemble``/``EnsembleRunner`` pass to every ``predict``: they concern the
    ensemble (``rank``, ``image_save_func``, ``n_best``, the ``SaveImage`` arguments), not one model."""
    from monai.transforms import SaveImage

    save_args = [name for name in inspect.signature(SaveImage.__init__).parameters if name != "self"]
    return (*ENSEMBLE_PASSED_KEYS, *save_args)


def _predict_options(params: Mapping[str, Any], where: str) -> PredictOptions:
    return parse_predict_params(params, where, ignored=ensemble_passed_keys())


def _bundle_from(config_file: Any) -> Path:
    """A bundle folder, its config file, or MONAI's list of the files in ``configs/`` -> the config file."""
    if config_file is None:
        raise ConfigError("InferClass needs the bundle: give its folder or its configs/hyper_parameters.yaml")
    if isinstance(config_file, (str, os.PathLike)):
        return bundle_config_path(config_file)
    paths = [expand_path(p) for p in config_file]
    for path in paths:
        if path.name == CONFIG_RELPATH.name:
            return path
    raise ConfigError(f"none of {[str(p) for p in paths]} is a {CONFIG_RELPATH.name}; give the bundle folder")


def _image_of(image_file: Any) -> str | list[str]:
    """A path, a list of modality paths, or a datalist entry ``{"image": ...}`` -> checked path(s)."""
    image = image_file.get("image") if isinstance(image_file, Mapping) else image_file
    if image is None:
        raise InputError(f"{image_file!r}: a datalist entry needs an 'image' key")
    paths = [str(p) for p in image] if isinstance(image, (list, tuple)) else [str(image)]
    for path in paths:
        if not Path(path).is_file():
            raise InputError(f"{path}: image not found; check the path")
    return paths if isinstance(image, (list, tuple)) else paths[0]


class InferClass:
    """Inference for one bundle, shaped as MONAI's templates' ``scripts/infer.py`` ``InferClass``.

    Args:
        config_file: the bundle folder, its ``configs/hyper_parameters.yaml``, or the list
            of the files in ``configs/`` (what MONAI's ``BundleAlgo.get_inferer`` passes).
        **override: predict params: ``device``, ``checkpoint`` (``best``, ``last`` or a
            path), ``output`` (``prob`` or ``label``).

    Raises:
        ConfigError: a bad bundle, checkpoint or param. SpecError: an unavailable device.
    """

    def __init__(self, config_file: Any = None, **override: Any) -> None:
        from monai.transforms import Invertd

        from autotune.build import amp_dtype, build_transforms
        from autotune.device import check_device
        from autotune.trainer.infer import load_model, resolve_checkpoint

        self.options: PredictOptions = _predict_options(override, "predict_params")
        self.config = load_bundle_config(_bundle_from(config_file))
        self.device = check_device(self.options.device or default_device(self.config), 0, False)
        self.checkpoint_path = resolve_checkpoint(self.config, self.options.checkpoint)
        self.checkpoint_mtime = self.checkpoint_path.stat().st_mtime_ns
        self.model = load_model(self.config, self.checkpoint_path, self.device)
        self.transforms = build_transforms(self.config, "infer")
        # probabilities are resampled smoothly back to the input grid; labels by nearest neighbour
        self.invert = Invertd(keys="pred", transform=self.transforms, orig_keys="image",
                              nearest_interp=self.options.output == "label")
        self.amp_dtype = amp_dtype(self.config, self.device)

    def is_current(self) -> bool:
        """Whether the checkpoint file is still the one loaded (not retrained since)."""
        path = self.checkpoint_path
        return path.is_file() and path.stat().st_mtime_ns == self.checkpoint_mtime

    @torch.no_grad()
    def infer(self, image_file: Any) -> torch.Tensor:
        """Probabilities (classes, *input shape) or the label map (1, *input shape) as a ``MetaTensor``
        with the input's affine."""
        from monai.data import MetaTensor

        from autotune.step import sliding_window_predict
        from autotune.trainer.infer import plain_tensor, predict_args

        data = self.transforms({"image": _image_of(image_file)})
        volume_device = self.config.tuned.validation_device.volume_device(self.device)
        logits = sliding_window_predict(
            self.model, plain_tensor(data["image"]).unsqueeze(0).to(volume_device), device=self.device,
            amp_dtype=self.amp_dtype, **predict_args(self.config),
        )[0].float()
        sigmoid = self.config.sigmoid
        if self.options.output == "label":
            pred = (logits.sigmoid() > 0.5).float() if sigmoid else logits.argmax(dim=0, keepdim=True).float()
        else:
            pred = logits.sigmoid() if sigmoid else logits.softmax(dim=0)
        return self.invert({"image": data["image"], "pred": MetaTensor(pred.cpu())})["pred"]


class AutotuneAlgo(Algo):
    """One autotune bundle behind MONAI's ``Algo`` interface.

    Args:
        output_path: the bundle folder (``<work>/<algo>_<fold>``); may be left out and set
            with ``load_state_dict``, as MONAI's serialisation does.
        name: the identifier (default: from ``bundle.json``, else the folder name).
    """

    def __init__(self, output_path: str | os.PathLike[str] | None = None, name: str | None = None) -> None:
        self.output_path = str(expand_path(output_path).resolve()) if output_path is not None else ""
        self.name = name or self._meta_name()
        self.best_metric: float | None = None
        self._items: list[dict[str, Any]] = []
        self._inferer: tuple[tuple[Any, ...], InferClass] | None = None

    def _meta_name(self) -> str:
        if not self.output_path:
            return ""
        meta = Path(self.output_path) / "bundle.json"
        name = read_json(meta, ConfigError).get("identifier") if meta.is_file() else None
        return str(name or Path(self.output_path).name)

    def __repr__(self) -> str:
        return f"AutotuneAlgo({self.output_path!r}, name={self.name!r})"

    def __getstate__(self) -> dict[str, Any]:
        # MONAI's ensembles deep-copy the algos: leave out the loaded model and the history links.
        state = dict(self.__dict__)
        state.update(_items=[], _inferer=None)
        return state

    def _require_bundle(self) -> None:
        if not self.output_path:
            raise ConfigError("this AutotuneAlgo has no bundle; create it with the bundle folder")

    def _config(self) -> BundleConfig:
        self._require_bundle()
        return load_bundle_config(self.output_path)

    def get_output_path(self) -> str:
        """The bundle folder."""
        return self.output_path

    def state_dict(self) -> dict[str, Any]:
        """What MONAI's ``algo_to_json`` stores: the bundle folder, the name and the score."""
        return {"output_path": self.output_path, "name": self.name, "best_metric": self.best_metric}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from ``state_dict()``."""
        for key in ("output_path", "name", "best_metric"):
            if key in state:
                setattr(self, key, state[key])

    def _read_score(self) -> float | None:
        from autotune.trainer.infer import model_dir

        summary = model_dir(self._config()) / "train_summary.json"
        if not summary.is_file():
            return None
        best = read_json(summary, ConfigError).get("best_metric")
        return float(best) if best is not None else None

    def get_score(self) -> float:
        """The best mean validation Dice of the bundle's training (``model_fold<k>/train_summary.json``).

        Raises:
            ConfigError: the bundle is not trained, or its training recorded no validation Dice.
        """
        score = self._read_score()
        if score is None:
            raise ConfigError(
                f"{self.output_path}: no validation Dice recorded; call .train() on it or run "
                f"'autotune train {self.output_path}'"
            )
        self.best_metric = score
        return score

    def history_item(self) -> dict[str, Any]:
        """A history entry with MONAI's ``AlgoKeys``; ``train()`` keeps ``is_trained``/``best_metric`` current.

        Also writes ``algo_object.json`` (see ``export``), as MONAI's ``BundleGen.generate`` does.
        """
        item = {ID: self.name, ALGO: self, IS_TRAINED: False, SCORE: None}
        self._items.append(item)
        self.refresh_history()
        self.export()
        return item

    def refresh_history(self) -> None:
        """Re-read the score into the history entries made by ``history_item()``."""
        score = self._read_score()
        self.best_metric = score
        for item in self._items:
            item[IS_TRAINED], item[SCORE] = score is not None, score

    def export(self) -> Path | None:
        """Write ``BUNDLE/algo_object.json`` as MONAI's ``algo_to_json`` does, so that MONAI's
        ``import_bundle_algo_history(work_dir)`` (and ``EnsembleRunner``) find this bundle; None
        with a MONAI that has no JSON export."""
        self._require_bundle()
        try:
            from monai.auto3dseg.utils import algo_to_json
        except ImportError:  # MONAI before its JSON serialisation
            return None
        meta = {SCORE: self.best_metric} if self.best_metric is not None else {}
        return Path(algo_to_json(self, template_path=None, **meta))

    def train(self, train_params: Mapping[str, Any] | None = None,
              device_setting: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Train the bundle with autotune's runner; returns its summary (as ``autotune train`` writes it).

        Args:
            train_params: MONAI template keys ``num_epochs``, ``num_epochs_per_validation``,
                ``num_warmup_epochs``, ``learning_rate``, ``amp``, ``cache_rate``, ``num_workers``,
                autotune's ``early_stop_patience``, and the run options ``device``, ``mode``
                (``fast``/``regular``), ``max_time``, ``resume``, ``progress``, ``memory_limit``
                (on CUDA default the limit the bundle was tuned for, ``tuning.memory_limit``).
            device_setting: MONAI's device settings; ``n_devices`` above 1 on CUDA trains with
                that many processes (DistributedDataParallel).

        Raises:
            ConfigError: an unknown or tuned key in ``train_params`` (the known keys are
                listed), a bad value, or a bad bundle. SpecError: an unavailable device.
        """
        from autotune.trainer.runner import train as run_training

        config = self._config()
        run = parse_train_params(config, train_params, where=f"{self.name} train_params")
        device = run.device or default_device(config)
        setting = dict(device_setting or {})
        if int(setting.get("NUM_NODES", 1) or 1) > 1:
            raise ConfigError("device_setting NUM_NODES > 1: run 'torchrun -m autotune.trainer' on each node instead")
        nproc = max(1, int(setting.get("n_devices", 1) or 1)) if device.startswith("cuda") else 1
        target = Path(self.output_path) / TRAIN_CONFIG_RELPATH
        if run.updates:
            merged = {**read_yaml(bundle_config_path(self.output_path), ConfigError), **run.updates}
            check_bundle_config(merged, str(target))  # the file as written, checked as training will read it
            atomic_write_yaml(target, merged)
            bundle = str(target)
        else:
            target.unlink(missing_ok=True)  # an earlier run's overrides no longer describe the weights
            bundle = self.output_path
        memory_limit = run.memory_limit
        if memory_limit is None and device.startswith("cuda"):  # the limit the bundle was tuned for
            plan = config.plan
            memory_limit = plan.memory_limit if plan is not None else None
        summary = run_training(bundle, device=device, max_time=run.max_time, resume=run.resume, mode=run.mode,
                               nproc=nproc, progress=run.progress, memory_limit=memory_limit)
        self._inferer = None
        self.refresh_history()
        self.export()
        return summary

    def get_inferer(self, **predict_params: Any) -> InferClass:
        """The bundle's ``InferClass`` for these params (kept while its checkpoint is unchanged)."""
        options = _predict_options(predict_params, f"{self.name} predict_params")
        key = (options.device, options.checkpoint, options.output)
        if self._inferer is None or self._inferer[0] != key or not self._inferer[1].is_current():
            self._inferer = (key, InferClass(self.output_path, **predict_params))
        return self._inferer[1]

    def predict(self, predict_files: Sequence[Any] | Any,
                predict_params: Mapping[str, Any] | None = None) -> list[torch.Tensor]:
        """Predict each file (a path, a list of modality paths, or ``{"image": ...}``).

        Returns:
            Per file, the class probabilities (classes, *input shape) in the input's
            geometry, or the label map (1, *input shape) with ``{"output": "label"}``.

        Raises:
            ConfigError: an unknown key in ``predict_params`` (the known ones are listed),
                or no checkpoint yet. InputError: a missing image.
        """
        inferer = self.get_inferer(**dict(predict_params or {}))
        files = list(predict_files) if isinstance(predict_files, (list, tuple)) else [predict_files]
        return [inferer.infer(item) for item in files]
