"""Checks of single values read from a data source file (input.yaml, datalist JSON, dataset.json).

Each returns the value in the form autotune keeps, or raises ``InputError`` naming the file
and the key and saying what to write instead.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from autotune.errors import InputError

__all__ = ["MODALITIES", "class_names_value", "flag_value", "is_int_text", "kind_of", "labels_value",
           "normalise_modality", "text_value"]

MODALITIES = ("CT", "MRI")

# Lower-case names with spaces, dashes and underscores removed -> modality family.
# Decathlon dataset.json files name MRI sequences (T2, ADC, FLAIR, ...) rather than "MRI".
_MODALITY_ALIASES = {"ct": "CT", "mr": "MRI", "mri": "MRI", **dict.fromkeys(
    ("t1", "t1w", "t1gd", "t1ce", "t1c", "t2", "t2w", "flair", "adc", "dwi", "pd", "pdw", "swi", "cine"), "MRI")}


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


def class_names_value(value: Any, where: Path) -> list[str] | None:
    """``class_names`` as a list of names; Auto3DSeg's ``{"name": ..., "index": [...]}`` entries give their name."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise InputError(f"{where}: key 'class_names' must be a list of names; found {kind_of(value)}")
    names = []
    for item in value:
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            item = item["name"]
        if not isinstance(item, str):
            raise InputError(f"{where}: key 'class_names' holds {item!r}; give each class name as text")
        names.append(item)
    return names


def labels_value(value: Any, where: Path) -> list[int] | None:
    """``labels`` as sorted label values, from a list of integers or a Decathlon ``{"0": name}`` map."""
    if value is None:
        return None
    if isinstance(value, dict) and all(is_int_text(key) for key in value):
        return sorted(int(key) for key in value)
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise InputError(f"{where}: key 'labels' must be a list of integer label values, e.g. [0, 1, 2]")
    return sorted(value)


def flag_value(value: Any, where: Path, key: str) -> bool:
    """A true/false key (``sigmoid``)."""
    if not isinstance(value, bool):
        raise InputError(f"{where}: key {key!r} is {value!r}; use true or false")
    return value


def text_value(value: Any, where: Path, key: str) -> str:
    """A non-empty text key (``name``, ``datalist``, ``dataroot``)."""
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: key {key!r} must be non-empty text; found {value!r}")
    return value


def is_int_text(value: Any) -> bool:
    """True for an int or a text of ASCII digits that ``int()`` reads (a Decathlon label key)."""
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


def kind_of(value: Any) -> str:
    """How a wrong value is named in messages: "a list", "a dict", "nothing (empty file)"."""
    return "nothing (empty file)" if value is None else f"a {type(value).__name__}"
