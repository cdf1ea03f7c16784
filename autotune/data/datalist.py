"""Data sources: read an input.yaml, a datalist JSON or a Decathlon folder into one ``DataSource``.

Accepted: (1) an Auto3DSeg input.yaml (``modality``, ``datalist``, ``dataroot``, optional
``class_names``, ``sigmoid``, ``labels``, ``name``); (2) an Auto3DSeg datalist JSON
(``{"training": [{"image", "label", "fold"?}], "testing": [...]}``); (3) a Decathlon task
folder with ``dataset.json``. All give absolute paths and a fold for every training case.
Only the lists are read here; ``autotune.data.validate`` checks the image files.
"""

from __future__ import annotations

import logging
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import InputError
from autotune.utils import atomic_write_json, atomic_write_yaml, read_json, read_yaml

__all__ = ["MODALITIES", "DataSource", "load_data_source", "assign_folds", "normalise_modality", "write_datalist",
           "write_data_src_config"]

logger = logging.getLogger(__name__)

MODALITIES = ("CT", "MRI")

# Lower-case names with spaces, dashes and underscores removed -> modality family.
# Decathlon dataset.json files name MRI sequences (T2, ADC, FLAIR, ...) rather than "MRI".
_MODALITY_ALIASES = {"ct": "CT", "mr": "MRI", "mri": "MRI", **dict.fromkeys(
    ("t1", "t1w", "t1gd", "t1ce", "t1c", "t2", "t2w", "flair", "adc", "dwi", "pd", "pdw", "swi", "cine"), "MRI")}


@dataclass
class DataSource:
    """A dataset as autotune sees it: absolute file paths, folds and a few facts.

    Attributes:
        source: What the user gave (input.yaml, datalist .json or Decathlon folder), absolute.
        dataroot: Folder that relative paths were resolved against, absolute.
        modality: ``"CT"`` or ``"MRI"``.
        training: ``{"image": str | list[str], "label": str, "fold": int}`` with absolute paths.
        testing: ``{"image": str | list[str]}`` with absolute paths.
        class_names: Names of the foreground classes, if known.
        labels: Label values, if known (Decathlon ``labels`` keys or ``labels`` in input.yaml).
        sigmoid: Whether classes overlap (region-based, sigmoid output) rather than softmax.
        folds_given: True if the input carried a ``fold`` for every training case.
        name: Dataset name.
        num_channels: Images per case: the length of the image list, the number of Decathlon
            modalities, or 1. ``validate.check_cases`` reports what the files really hold.
        listed_in: The file that holds the training list (datalist JSON or dataset.json), absolute.
    """

    source: Path
    dataroot: Path
    modality: str
    training: list[dict]
    testing: list[dict]
    class_names: list[str] | None
    labels: list[int] | None
    sigmoid: bool
    folds_given: bool
    name: str
    num_channels: int
    listed_in: Path | None = None

    @property
    def num_fold(self) -> int:
        """Number of folds the training cases are split into (highest fold + 1)."""
        return max(int(entry["fold"]) for entry in self.training) + 1

    def as_datalist(self) -> dict[str, Any]:
        """The Auto3DSeg datalist form: ``{"training": [...], "testing": [...]}``, absolute paths."""
        return {
            "training": [{"image": e["image"], "label": e["label"], "fold": int(e["fold"])} for e in self.training],
            "testing": [{"image": e["image"]} for e in self.testing],
        }


def assign_folds(num_cases: int, num_fold: int, seed: int = 0) -> list[int]:
    """Assign each case a fold: balanced (fold sizes differ by at most one), shuffled, deterministic.

    Args:
        num_cases: Number of training cases.
        num_fold: Number of folds, at least 1.
        seed: Seed of the shuffle; the same arguments always give the same folds.

    Returns:
        One fold index in ``range(num_fold)`` per case.

    Raises:
        InputError: ``num_fold`` is below 1 or ``num_cases`` is negative.
    """
    if isinstance(num_fold, bool) or not isinstance(num_fold, int) or num_fold < 1:
        raise InputError(f"num_fold {num_fold!r} must be an integer of at least 1")
    if num_cases < 0:
        raise InputError(f"num_cases {num_cases!r} must not be negative")
    folds = [index % num_fold for index in range(num_cases)]
    random.Random(seed).shuffle(folds)
    return folds


def normalise_modality(value: Any, where: str) -> str:
    """Map a modality given as text, a list or a Decathlon ``{"0": "MRI"}`` dict to ``"CT"`` or ``"MRI"``.

    Args:
        value: The ``modality`` value as read from the file.
        where: The file that holds it, for error messages.

    Raises:
        InputError: The value is unknown, empty, or mixes CT and MRI channels.
    """
    names = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else [value]
    if not names:
        raise InputError(f"{where}: key 'modality' is empty; use one of {', '.join(MODALITIES)}")
    families = []
    for name in names:
        key = str(name).lower().replace(" ", "").replace("-", "").replace("_", "") if isinstance(name, str) else ""
        if key not in _MODALITY_ALIASES:
            raise InputError(f"{where}: key 'modality' is {name!r}; use one of {', '.join(MODALITIES)}")
        families.append(_MODALITY_ALIASES[key])
    if len(set(families)) > 1:
        raise InputError(f"{where}: key 'modality' mixes CT and MRI ({names}); all channels of a case must be "
                         "one modality family")
    return families[0]


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
    source = _absolute(_expand_home(Path(path), "input"))
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
                         f"found {_kind(config)}")
    if "datalist" not in config:
        raise InputError(f"{path}: key 'datalist' missing; add datalist: <path to the datalist .json>")
    datalist_path = _absolute(path.parent / _text(config["datalist"], path, "datalist"))
    if not datalist_path.is_file():
        raise InputError(f"{path}: key 'datalist' points to {datalist_path}, which does not exist; fix the path "
                         f"(relative paths are taken from {path.parent})")
    dataroot = _absolute(path.parent / _text(config.get("dataroot", "."), path, "dataroot"))
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
        name=_text(settings.get("name") or default_name, source, "name"),
        class_names=_class_names(settings.get("class_names"), source),
        labels=_labels(settings.get("labels"), source),
        sigmoid=_flag(settings.get("sigmoid", False), source, "sigmoid"),
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
    if label_map is not None and (not isinstance(label_map, dict) or not all(map(_is_int_text, label_map))):
        raise InputError(f"{dataset_json}: key 'labels' must map label values to names, e.g. "
                         "{\"0\": \"background\", \"1\": \"tumour\"}")
    labels = _labels(label_map, dataset_json)
    class_names = [str(label_map[k]) for k in sorted(label_map, key=int) if int(k) != 0] if label_map else None
    if "testing" not in dataset and "test" in dataset:
        dataset = {**dataset, "testing": dataset["test"]}
    channel_hint = len(modality_value) if isinstance(modality_value, (dict, list)) else 1
    return _build(
        source=folder, listed_in=dataset_json, datalist=dataset, dataroot=folder,
        modality=normalise_modality(modality_value, str(dataset_json)),
        name=_text(dataset.get("name") or folder.name, dataset_json, "name"),
        class_names=class_names, labels=labels, sigmoid=False,
        num_fold=num_fold, seed=seed, channel_hint=channel_hint,
    )


def _read_datalist_json(path: Path) -> dict[str, Any]:
    data = read_json(path, error=InputError)
    if not isinstance(data, dict):
        raise InputError(f"{path}: top level must be an object with a 'training' list; found {_kind(data)}")
    return data


def _build(*, source: Path, listed_in: Path, datalist: dict[str, Any], dataroot: Path, modality: str, name: str,
           class_names: list[str] | None, labels: list[int] | None, sigmoid: bool, num_fold: int, seed: int,
           channel_hint: int = 1) -> DataSource:
    """Parse the training/testing lists of ``datalist`` (read from ``listed_in``) into a DataSource."""
    if "training" not in datalist:
        raise InputError(f"{listed_in}: key 'training' missing; add a 'training' list of {{image, label}} cases")
    entries = datalist["training"]
    if not isinstance(entries, list):
        raise InputError(f"{listed_in}: key 'training' must be a list of {{image, label}} cases; found {_kind(entries)}")
    if not entries:
        raise InputError(f"{listed_in}: key 'training' is empty; add at least one {{image, label}} case")
    training: list[dict] = []
    folds: list[int | None] = []
    first_channels = None
    for index, entry in enumerate(entries):
        where = f"training[{index}]"
        if not isinstance(entry, dict):
            raise InputError(f"{listed_in}: {where} must be an object with 'image' and 'label'; found {_kind(entry)}")
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
        raise InputError(f"{listed_in}: key 'testing' must be a list; found {_kind(entries)}")
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
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{listed_in}: {where} must be a file path; found {value!r}")
    given = _expand_home(Path(value), f"{listed_in}: {where}", "an absolute path or one relative to dataroot")
    if given.is_absolute():
        return os.path.normpath(given)
    full = os.path.normpath(dataroot / given)
    root = str(dataroot)
    if full != root and not full.startswith(root.rstrip(os.sep) + os.sep):
        raise InputError(f"{listed_in}: {where} {value!r} points outside dataroot {dataroot}; move the file under "
                         "dataroot or give an absolute path")
    return full


def _class_names(value: Any, where: Path) -> list[str] | None:
    """``class_names`` as a list of names; Auto3DSeg's ``{"name": ..., "index": [...]}`` entries give their name."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise InputError(f"{where}: key 'class_names' must be a list of names; found {_kind(value)}")
    names = []
    for item in value:
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            item = item["name"]
        if not isinstance(item, str):
            raise InputError(f"{where}: key 'class_names' holds {item!r}; give each class name as text")
        names.append(item)
    return names


def _labels(value: Any, where: Path) -> list[int] | None:
    if value is None:
        return None
    if isinstance(value, dict) and all(_is_int_text(key) for key in value):
        return sorted(int(key) for key in value)
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise InputError(f"{where}: key 'labels' must be a list of integer label values, e.g. [0, 1, 2]")
    return sorted(value)


def _flag(value: Any, where: Path, key: str) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"{where}: key {key!r} is {value!r}; use true or false")
    return value


def _text(value: Any, where: Path, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: key {key!r} must be non-empty text; found {value!r}")
    return value


def _is_int_text(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return False
    # ASCII digits only: str.isdigit() also accepts '²', which int() refuses.
    if isinstance(value, str) and not re.fullmatch(r"-?[0-9]+", value.strip()):
        return False
    try:
        int(value)  # still refuses text beyond Python's 4300-digit limit
    except ValueError:
        return False
    return True


def _expand_home(path: Path, what: str, instead: str = "an absolute path") -> Path:
    """``path.expanduser()``, but an unknown ``~user`` is an InputError, not a RuntimeError."""
    try:
        return path.expanduser()
    except RuntimeError as exc:
        raise InputError(f"{what} {str(path)!r}: cannot find the home folder of {path.parts[0]!r}; "
                         f"give {instead}") from exc


def _kind(value: Any) -> str:
    return "nothing (empty file)" if value is None else f"a {type(value).__name__}"


def _absolute(path: Path) -> Path:
    """Absolute and normalised, without resolving symlinks (users see the paths they gave)."""
    return Path(os.path.abspath(path))
