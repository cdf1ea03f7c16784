"""Check MONAI-style ``train_params`` and ``predict_params`` for ``AutotuneAlgo``.

MONAI Auto3DSeg scripts pass a dict of template keys to ``algo.train(train_params)`` and
``algo.predict(files, predict_params)``. autotune accepts the MONAI keys that mean the
same thing in its bundles, plus a few of its own run options; anything else is an error
that lists the known keys. Plain data in, plain data out: no torch here.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.errors import ConfigError, SpecError
from autotune.utils import parse_bytes

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

__all__ = [
    "TRAIN_CONFIG_KEYS",
    "TRAIN_RUN_KEYS",
    "TUNED_KEYS",
    "PREDICT_KEYS",
    "ENSEMBLE_PASSED_KEYS",
    "TrainRun",
    "PredictOptions",
    "parse_train_params",
    "parse_predict_params",
]

# MONAI template keys (and autotune's early_stop_patience) that set a value of the bundle config.
TRAIN_CONFIG_KEYS = (
    "num_epochs",
    "num_epochs_per_validation",
    "num_warmup_epochs",
    "learning_rate",
    "amp",
    "cache_rate",
    "num_workers",
    "early_stop_patience",
)
# autotune's own options of one training run (``autotune train`` flags).
TRAIN_RUN_KEYS = ("device", "mode", "max_time", "resume", "progress", "memory_limit")
# Set by the tuner for the bundle's memory limit: not changed per run.
TUNED_KEYS = (
    "num_images_per_batch",
    "num_crops_per_image",
    "num_patches_per_iter",
    "num_sw_batch_size",
    "sw_input_on_cpu",
    "roi_size",
)
PREDICT_KEYS = ("device", "checkpoint", "output")
# MONAI's AlgoEnsemble and EnsembleRunner hand these to every algo's predict; they concern the ensemble
# (EnsembleRunner also passes on its SaveImage arguments: see ``autotune.facade.algo``).
ENSEMBLE_PASSED_KEYS = ("rank", "image_save_func", "n_best")
OUTPUTS = ("prob", "label")


@dataclass
class TrainRun:
    """What ``AutotuneAlgo.train`` does: config values to change and the options of the run."""

    updates: dict[str, Any]
    device: str | None = None
    mode: str = "fast"
    max_time: float | None = None
    resume: bool = False
    progress: bool = True
    memory_limit: int | None = None


@dataclass
class PredictOptions:
    """Where and with which weights ``AutotuneAlgo.predict`` runs, and what it returns."""

    device: str | None = None
    checkpoint: str = "best"
    output: str = "prob"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _unknown(key: str, where: str, known: tuple[str, ...]) -> ConfigError:
    return ConfigError(f"{where}: unknown key {key!r}; known keys: {', '.join(sorted(known))}")


def _config_value(key: str, value: Any, where: str) -> Any:
    """Check one config key's value; returns it."""
    name = f"{where}[{key!r}]"
    if key in ("num_epochs", "num_epochs_per_validation") and not (_is_int(value) and value >= 1):
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if key in ("num_warmup_epochs", "num_workers", "early_stop_patience") and not (_is_int(value) and value >= 0):
        raise ConfigError(f"{name} must be an integer of 0 or more, got {value!r}")
    if key == "learning_rate" and not (_is_number(value) and value > 0):
        raise ConfigError(f"{name} must be a positive number, got {value!r}")
    if key == "amp" and not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    if key == "cache_rate" and not (_is_number(value) and 0 <= value <= 1):
        raise ConfigError(f"{name} must be between 0 and 1, got {value!r}")
    return value


def _set_run_option(run: TrainRun, key: str, value: Any, where: str) -> None:
    """Check one of autotune's run options (``TRAIN_RUN_KEYS``) and set it on ``run``."""
    from autotune.trainer.runner import parse_duration

    if key == "device":
        if not isinstance(value, str) or value.split(":")[0] not in ("cpu", "cuda"):
            raise ConfigError(f"{where}['device'] must be cpu, cuda or cuda:N, got {value!r}")
        run.device = value
    elif key == "mode":
        if value not in ("fast", "regular"):
            raise ConfigError(f"{where}['mode'] must be 'fast' or 'regular', got {value!r}")
        run.mode = value
    elif key == "max_time":
        try:
            run.max_time = parse_duration(value)
        except SpecError as exc:
            raise ConfigError(f"{where}['max_time'] must be a duration such as 90s, 30m or 2h, got {value!r}") from exc
    elif key == "memory_limit":
        try:
            run.memory_limit = parse_bytes(value, f"{where}['memory_limit']")
        except SpecError as exc:
            raise ConfigError(str(exc)) from exc
    else:  # resume, progress
        if not isinstance(value, bool):
            raise ConfigError(f"{where}[{key!r}] must be true or false, got {value!r}")
        setattr(run, key, value)


def _apply_warmup(run: TrainRun, config: BundleConfig, where: str) -> None:
    """Turn ``num_warmup_epochs`` in ``run.updates`` into the warm-up share of a ``WarmupCosineSchedule``."""
    warmup = run.updates.pop("num_warmup_epochs", None)
    if warmup is None:
        return
    epochs = int(run.updates.get("num_epochs", config.num_epochs))
    schedule = config.lr_scheduler
    name = schedule.name if schedule is not None else "none"
    if schedule is not None and name == "WarmupCosineSchedule":
        if warmup > epochs:
            raise ConfigError(f"{where}['num_warmup_epochs'] ({warmup}) must not exceed num_epochs ({epochs})")
        run.updates["lr_scheduler"] = {**schedule.as_dict(),
                                       "args": {**schedule.args, "warmup_fraction": warmup / epochs}}
    elif warmup:
        # MONAI's scripts pass warm-up to every algo; a schedule without one trains as it is, said once.
        warnings.warn(
            f"{where}['num_warmup_epochs']: this bundle's schedule {name!r} has no "
            "warm-up; trained without one",
            stacklevel=4,  # the caller of AutotuneAlgo.train
        )


def parse_train_params(
    config: BundleConfig, train_params: Mapping[str, Any] | None, where: str = "train_params"
) -> TrainRun:
    """Check ``train_params`` against the bundle config ``config``; returns the config updates and run options.

    ``num_warmup_epochs`` becomes the warm-up share of a ``WarmupCosineSchedule``
    (warm-up epochs / epochs); other config keys are copied as they are.

    Warns:
        UserWarning: ``num_warmup_epochs`` above 0 for a schedule without warm-up (MONAI's
            scripts pass it to every algo; the bundle trains with its own schedule).

    Raises:
        ConfigError: an unknown key (the known ones are listed), a tuned key (say how to
            change it), or a value of the wrong type or range.
    """
    if train_params is None:
        train_params = {}
    if not isinstance(train_params, Mapping):
        raise ConfigError(f"{where} must be a dict of MONAI template keys, got {type(train_params).__name__}")
    run = TrainRun(updates={})
    known = TRAIN_CONFIG_KEYS + TRAIN_RUN_KEYS
    for key, value in train_params.items():
        key = str(key)
        if key in TUNED_KEYS:
            raise ConfigError(
                f"{where}: {key!r} is set by the tuner for this bundle's memory limit; change it with "
                f"'autotune tune {config.bundle_root or 'BUNDLE'}' or by editing configs/hyper_parameters.yaml"
            )
        if key not in known:
            raise _unknown(key, where, known)
        if key in TRAIN_CONFIG_KEYS:
            run.updates[key] = _config_value(key, value, where)
        else:
            _set_run_option(run, key, value, where)
    _apply_warmup(run, config, where)
    return run


def parse_predict_params(predict_params: Mapping[str, Any] | None, where: str = "predict_params",
                         ignored: Sequence[str] = ENSEMBLE_PASSED_KEYS) -> PredictOptions:
    """Check ``predict_params``; ``ignored`` keys (what MONAI's ensembles pass on to every algo) are skipped.

    Raises:
        ConfigError: an unknown key (the known ones are listed) or a bad value.
    """
    if predict_params is None:
        predict_params = {}
    if not isinstance(predict_params, Mapping):
        raise ConfigError(f"{where} must be a dict, got {type(predict_params).__name__}")
    options = PredictOptions()
    for key, value in predict_params.items():
        key = str(key)
        if key in ignored:
            continue
        if key not in PREDICT_KEYS:
            raise _unknown(key, where, PREDICT_KEYS)
        if key == "device":
            if not isinstance(value, str) or value.split(":")[0] not in ("cpu", "cuda"):
                raise ConfigError(f"{where}['device'] must be cpu, cuda or cuda:N, got {value!r}")
            options.device = value
        elif key == "checkpoint":
            options.checkpoint = str(value)
        elif value not in OUTPUTS:
            raise ConfigError(f"{where}['output'] must be 'prob' (probabilities) or 'label', got {value!r}")
        else:
            options.output = value
    return options
