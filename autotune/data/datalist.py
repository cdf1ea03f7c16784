"""Data sources: read an input.yaml, a datalist JSON or a Decathlon folder into one ``DataSource``.

Accepted: (1) an Auto3DSeg input.yaml (``modality``, ``datalist``, ``dataroot``, optional
``class_names``, ``sigmoid``, ``labels``, ``name``); (2) an Auto3DSeg datalist JSON
(``{"training": [{"image", "label", "fold"?}], "testing": [...]}``); (3) a Decathlon task
folder with ``dataset.json``. All give absolute paths and a fold for every training case.
Only the lists are read here; ``autotune.data.validate`` checks the image files. The
``DataSource`` type lives in ``autotune.data.source``, the checks of single values in
``autotune.data.values``; both are re-exported here.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from autotune.checks import path as checked_path
from autotune.data.source import DataSource, assign_folds
from autotune.data.values import (
    MODALITIES,
    class_names_value,
    flag_value,
    is_int_text,
    kind_of,
    labels_value,
    normalise_modality,
    text_value,
)
from autotune.errors import InputError
from autotune.files import atomic_write_json, atomic_write_yaml
from autotune.utils import expand_path, read_json, read_yaml

__all__ = ["MODALITIES", "DataSource", "load_data_source", "assign_folds", "normalise_modality", "write_datalist",
           "write_data_src_config"]

logger = logging.getLogger(__name__)

def load_data_source(path: str | Path, num_fold: int = 5, seed: int = 0) -> DataSource:
    """Read an input.yaml, a datalist JSON or a Decathlon task folder.

    Args:
        path: The input.yaml (``.yaml``/``.yml``), datalist (``.json``) or Decathlon folder.
        num_fold: Folds to assign when the datalist does not give one for every case.
        seed: Seed of the fold assignment.

    Returns:
        The data source with absolute paths and a fold for every training case.

    Raises:
        InputError: The input is missing or malformed; the message names the file and key.
    """
    if isinstance(num_fold, bool) or not isinstance(num_fold, int) or num_fold < 1:
        raise InputError(f"num_fold {num_fold!r} must be an integer of at least 1")
    source = _absolute(expand_path(path, InputError, "input", "an absolute path"))
    if not source.exists():
        raise InputError(f"{source}: not found; give an input.yaml, a datalist .json or a Decathlon task folder")
    if source.is_dir():
        return _load_decathlon(source, num_fold, seed)
    suffix = source.suffix.lower()
    if suffix in (".yaml", ".yml"):
        return _load_config(source, num_fold, seed)
    if suffix == ".json":
        return _load_datalist_json(source, num_fold, seed)
    raise InputError(f"{source}: unknown input type {suffix or '(no suffix)'!r}; give an input.yaml (.yaml), "
                     "a datalist (.json) or a Decathlon task folder")


def write_datalist(source: DataSource, path: str | Path) -> Path:
    """Write the Auto3DSeg datalist JSON (absolute paths, a fold per training case) atomically; returns ``path``."""
    return atomic_write_json(path, source.as_datalist())


def write_data_src_config(source: DataSource, datalist_path: Path, path: str | Path) -> Path:
    """Write an Auto3DSeg data source config (input.yaml form) pointing at ``datalist_path``; returns ``path``."""
    config = {
        "name": source.name,
        "modality": source.modality,
        "datalist": str(_absolute(Path(datalist_path))),
        "dataroot": str(source.dataroot),
        "class_names": list(source.class_names) if source.class_names is not None else None,
        "sigmoid": bool(source.sigmoid),
        "labels": list(source.labels) if source.labels is not None else None,
    }
    return atomic_write_yaml(path, config)


def _load_config(path: Path, num_fold: int, seed: int) -> DataSource:
    config = read_yaml(path, error=InputError)
    if not isinstance(config, dict):
        raise InputError(f"{path}: top level must be a mapping with keys modality, datalist, dataroot; "
                         f"found {kind_of(config)}")
    if "datalist" not in config:
        raise InputError(f"{path}: key 'datalist' missing; add datalist: <path to the datalist .json>")
    datalist_path = _absolute(path.parent / text_value(config["datalist"], path, "datalist"))
    if not datalist_path.is_file():
        raise InputError(f"{path}: key 'datalist' points to {datalist_path}, which does not exist; fix the path "
                         f"(relative paths are taken from {path.parent})")
    dataroot = _absolute(path.parent / text_value(config.get("dataroot", "."), path, "dataroot"))
    if not dataroot.is_dir():
        raise InputError(f"{path}: key 'dataroot' points to {dataroot}, which is not a folder; fix the path")
    datalist = _read_datalist_json(datalist_path)
    settings = {**datalist, **config}  # input.yaml keys win over the same keys inside the datalist
    if settings.get("modality") is None:
        raise InputError(f"{path}: key 'modality' missing; add modality: CT or modality: MRI")
    return _build_from_settings(settings, path, datalist_path, datalist, dataroot, path.parent.name, num_fold, seed)


def _load_datalist_json(path: Path, num_fold: int, seed: int) -> DataSource:
    datalist = _read_datalist_json(path)
    settings = dict(datalist)
    if settings.get("modality") is None:
        logger.warning("%s: no 'modality' key; assuming MRI (give an input.yaml with modality: CT|MRI to set it)",
                       path)
        settings["modality"] = "MRI"
    return _build_from_settings(settings, path, path, datalist, path.parent, path.stem, num_fold, seed)


def _build_from_settings(settings: dict[str, Any], source: Path, listed_in: Path, datalist: dict[str, Any],
                         dataroot: Path, default_name: str, num_fold: int, seed: int) -> DataSource:
    """input.yaml and datalist JSON: optional keys name, class_names, labels, sigmoid (errors name ``source``)."""
    return _build(
        source=source, listed_in=listed_in, datalist=datalist, dataroot=dataroot,
        modality=normalise_modality(settings["modality"], str(source)),
        name=text_value(settings.get("name") or default_name, source, "name"),
        class_names=class_names_value(settings.get("class_names"), source),
        labels=labels_value(settings.get("labels"), source),
        sigmoid=flag_value(settings.get("sigmoid", False), source, "sigmoid"),
        num_fold=num_fold, seed=seed,
    )


def _load_decathlon(folder: Path, num_fold: int, seed: int) -> DataSource:
    dataset_json = folder / "dataset.json"
    if not dataset_json.is_file():
        raise InputError(f"{folder}: folder has no dataset.json; give a Decathlon task folder, an input.yaml "
                         "or a datalist .json")
    dataset = _read_datalist_json(dataset_json)
    if "modality" not in dataset:
        raise InputError(f"{dataset_json}: key 'modality' missing; add e.g. \"modality\": {{\"0\": \"MRI\"}}")
    modality_value = dataset["modality"]
    label_map = dataset.get("labels")
    if label_map is not None and (not isinstance(label_map, dict) or not all(map(is_int_text, label_map))):
        raise InputError(f"{dataset_json}: key 'labels' must map label values to names, e.g. "
                         "{\"0\": \"background\", \"1\": \"tumour\"}")
    labels = labels_value(label_map, dataset_json)
    class_names = [str(label_map[k]) for k in sorted(label_map, key=int) if int(k) != 0] if label_map else None
    if "testing" not in dataset and "test" in dataset:
        dataset = {**dataset, "testing": dataset["test"]}
    channel_hint = len(modality_value) if isinstance(modality_value, (dict, list)) else 1
    return _build(
        source=folder, listed_in=dataset_json, datalist=dataset, dataroot=folder,
        modality=normalise_modality(modality_value, str(dataset_json)),
        name=text_value(dataset.get("name") or folder.name, dataset_json, "name"),
        class_names=class_names, labels=labels, sigmoid=False,
        num_fold=num_fold, seed=seed, channel_hint=channel_hint,
    )


def _read_datalist_json(path: Path) -> dict[str, Any]:
    data = read_json(path, error=InputError)
    if not isinstance(data, dict):
        raise InputError(f"{path}: top level must be an object with a 'training' list; found {kind_of(data)}")
    return data


def _build(*, source: Path, listed_in: Path, datalist: dict[str, Any], dataroot: Path, modality: str, name: str,
           class_names: list[str] | None, labels: list[int] | None, sigmoid: bool, num_fold: int, seed: int,
           channel_hint: int = 1) -> DataSource:
    """Parse the training/testing lists of ``datalist`` (read from ``listed_in``) into a DataSource."""
    if "training" not in datalist:
        raise InputError(f"{listed_in}: key 'training' missing; add a 'training' list of {{image, label}} cases")
    entries = datalist["training"]
    if not isinstance(entries, list):
        raise InputError(f"{listed_in}: key 'training' must be a list of {{image, label}} cases; found {kind_of(entries)}")
    if not entries:
        raise InputError(f"{listed_in}: key 'training' is empty; add at least one {{image, label}} case")
    training: list[dict] = []
    folds: list[int | None] = []
    first_channels = None
    for index, entry in enumerate(entries):
        where = f"training[{index}]"
        if not isinstance(entry, dict):
            raise InputError(f"{listed_in}: {where} must be an object with 'image' and 'label'; found {kind_of(entry)}")
        for key in ("image", "label"):
            if key not in entry:
                raise InputError(f"{listed_in}: {where} has no {key!r}; every training case needs an image and a label")
        image = _image(entry["image"], dataroot, listed_in, f"{where}.image")
        channels = len(image) if isinstance(image, list) else 1
        if first_channels is None:
            first_channels = channels
        elif channels != first_channels:
            raise InputError(f"{listed_in}: {where}.image has {channels} file(s) but training[0].image has "
                             f"{first_channels}; every case needs the same modalities")
        label = _resolve(entry["label"], dataroot, listed_in, f"{where}.label")
        fold = entry.get("fold")
        if "fold" in entry and (isinstance(fold, bool) or not isinstance(fold, int) or fold < 0):
            raise InputError(f"{listed_in}: {where}.fold is {fold!r}; a fold must be an integer >= 0")
        folds.append(fold if "fold" in entry else None)
        training.append({"image": image, "label": label})
    folds_given = all(fold is not None for fold in folds)
    if not folds_given:
        if any(fold is not None for fold in folds):
            logger.warning("%s: only some training cases have a 'fold'; assigning %d new folds to all",
                           listed_in, num_fold)
        if len(training) < num_fold:
            raise InputError(f"{listed_in}: {len(training)} training case(s) cannot be split into {num_fold} folds; "
                             f"use --num-fold {len(training)} or fewer")
        folds = list(assign_folds(len(training), num_fold, seed))
    for entry, fold in zip(training, folds, strict=True):
        entry["fold"] = int(fold)  # type: ignore[arg-type]
    testing = _testing(datalist.get("testing"), dataroot, listed_in)
    num_channels = first_channels if first_channels and first_channels > 1 else max(1, channel_hint)
    return DataSource(
        source=source, dataroot=dataroot, modality=modality, training=training, testing=testing,
        class_names=class_names, labels=labels, sigmoid=sigmoid, folds_given=folds_given, name=name,
        num_channels=num_channels, listed_in=listed_in,
    )


def _testing(entries: Any, dataroot: Path, listed_in: Path) -> list[dict]:
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise InputError(f"{listed_in}: key 'testing' must be a list; found {kind_of(entries)}")
    testing = []
    for index, entry in enumerate(entries):
        where = f"testing[{index}]"
        if isinstance(entry, dict):
            if "image" not in entry:
                raise InputError(f"{listed_in}: {where} has no 'image'; give the image path")
            entry = entry["image"]
        testing.append({"image": _image(entry, dataroot, listed_in, f"{where}.image")})
    return testing


def _image(value: Any, dataroot: Path, listed_in: Path, where: str) -> str | list[str]:
    if isinstance(value, list):
        if not value:
            raise InputError(f"{listed_in}: {where} is an empty list; give one file per modality")
        return [_resolve(item, dataroot, listed_in, f"{where}[{i}]") for i, item in enumerate(value)]
    return _resolve(value, dataroot, listed_in, where)


def _resolve(value: Any, dataroot: Path, listed_in: Path, where: str) -> str:
    """Absolute, normalised path of ``value``; relative paths must stay inside ``dataroot``."""
    given = checked_path(value, f"{listed_in}: {where}", error=InputError,
                         instead="an absolute path or one relative to dataroot")
    if given.is_absolute():
        return os.path.normpath(given)
    full = os.path.normpath(dataroot / given)
    root = str(dataroot)
    if full != root and not full.startswith(root.rstrip(os.sep) + os.sep):
        raise InputError(f"{listed_in}: {where} {value!r} points outside dataroot {dataroot}; move the file under "
                         "dataroot or give an absolute path")
    return full


def _absolute(path: Path) -> Path:
    """Absolute and normalised, without resolving symlinks (users see the paths they gave)."""
    return Path(os.path.abspath(path))
