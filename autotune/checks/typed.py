"""Typed models over the files autotune reads back, with the checkers of this package as their field types.

A file autotune reads back (a bundle's config and its ``tuning:`` block, a calibration, a checkpoint's header,
overrides) is parsed once, where it is read, into a pydantic model (``parse``); nothing after that reads it
as a dict. The models' field types are this package's checkers (``Checked(Integer(1, 256))``), so a refused
value reads as everywhere else: ``FILE: key 'fast_training.ram_fraction': got 5; must be a finite number above
0 and at most 1``. pydantic gives the key's location, its own checks (a missing key, an unknown key, a
mapping where a list was due) are put in the same words, and a cross-key rule a model states
(``refuse_key``) names the key it is about.

pydantic is imported by this module, not by ``autotune.checks``: the command line checks its options before
any model is loaded.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticCustomError, core_schema

from autotune.checks.values import Error, shown
from autotune.errors import AutotuneError, ConfigError

__all__ = ["Checked", "Refused", "nested_model", "FileModel", "OpenModel", "parse", "check_partial", "refuse_key", "key_path"]

M = TypeVar("M", bound=BaseModel)


class Refused(AutotuneError):
    """A checker's refusal inside a model: its text, without the file and key pydantic locates."""


class FileModel(BaseModel):
    """The base of a model of a file: frozen, strict (a number is a number, not text) and closed (an unknown key
    is refused, with the nearest known one)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, validate_default=False)


class OpenModel(FileModel):
    """A model of a mapping whose further keys are not autotune's to list (a MONAI constructor's arguments): the
    keys it names are checked, the others kept as they are."""

    model_config = ConfigDict(extra="allow")


@dataclass(frozen=True)
class Checked:
    """A field type from one of this package's checkers (``Integer``, ``Number``, ``Flag``, ``Items``, ...):
    ``Annotated[int, Checked(Integer(1, 256))]``; ``check`` is called as ``check(value, where, error)``."""

    check: Callable[..., Any]

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        check = self.check

        def validate(value: Any) -> Any:
            try:
                return check(value, "", Refused)
            except Refused as exc:
                raise PydanticCustomError("autotune", "{text}", {"text": str(exc)}) from None

        return core_schema.no_info_plain_validator_function(validate)


def refuse_key(key: str, text: str) -> NoReturn:
    """Refuse a value from inside a model's validator: ``text`` is said of ``key`` (a dotted path from the
    file's top, ``tuning.training_oom.micro_batches``), whatever the validator's own place is."""
    raise PydanticCustomError("autotune_key", "{text}", {"key": key, "text": text})


def key_path(loc: Sequence[Any]) -> str:
    """A pydantic location as a key path: ``fast_training.ram_fraction``, ``roi_size[1]``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _fields_at(model: type[BaseModel], loc: Sequence[Any]) -> list[str]:
    """The field names of the (sub)model that holds the key at ``loc`` (for a "did you mean")."""
    current: Any = model
    for part in loc[:-1]:
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        annotation = fields[part].annotation
        current = next((a for a in getattr(annotation, "__args__", (annotation,))
                        if isinstance(a, type) and issubclass(a, BaseModel)), annotation)
    fields = getattr(current, "model_fields", None)
    return list(fields) if fields else []


def _line(model: type[BaseModel], error: Mapping[str, Any], where: str, fix: str) -> str:
    kind, loc, ctx = error["type"], tuple(error["loc"]), error.get("ctx") or {}
    key = key_path(loc)
    tail = f"; {fix}" if fix else ""
    if kind == "autotune_key":
        text = str(ctx["text"])
        return f"{where}: key {ctx['key']!r}: {text}{tail if fix not in text else ''}"
    if kind == "autotune":
        text = str(ctx["text"])
        head = f"{where}: key {key!r}" if key else where
        return f"{head}{'' if text.startswith('[') else ': '}{text}{tail if fix not in text else ''}"
    if kind == "missing":
        return f"{where}: key {key!r} is missing{tail}"
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(str(loc[-1]), _fields_at(model, loc), n=1, cutoff=0.6)
        hint = f"did you mean {key_path((*loc[:-1], close[0]))!r}? " if close else ""
        return f"{where}: unknown key {key!r}; {hint}fix or remove it"
    what = {"model_type": "must be a mapping", "model_attributes_type": "must be a mapping",
            "dict_type": "must be a mapping", "list_type": "must be a list", "string_type": "must be text",
            "bool_type": "must be true or false", "int_type": "must be a whole number",
            "float_type": "must be a finite number", "literal_error": f"must be {error['msg'].split('Input should be ')[-1]}"
            }.get(kind, error["msg"])
    head = f"{where}: key {key!r}" if key else where
    return f"{head}: got {shown(error.get('input'))}; {what}{tail}"


def parse(model: type[M], data: Any, where: str, *, error: Error = ConfigError, fix: str = "",
          context: Mapping[str, Any] | None = None) -> M:
    """``data`` (plain data as a file holds it) as a ``model``; ``where`` names the file in a refusal.

    Raises:
        error: one line naming ``where``, the key, the value and what is allowed (then ``fix``, what to do).
    """
    if not isinstance(data, Mapping):
        raise error(f"{where}: the top level must be a mapping, got {shown(data)}{'; ' + fix if fix else ''}")
    try:
        return model.model_validate(data, context=dict(context or {}))
    except ValidationError as exc:
        raise error(_line(model, exc.errors(include_url=False)[0], where, fix)) from None


def nested_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (``Section``, ``Section | None``), or None."""
    for arg in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def check_partial(model: type[BaseModel], values: Mapping[str, Any], where: str, *, error: Error = ConfigError,
                  prefix: tuple[Any, ...] = (), root: type[BaseModel] | None = None) -> None:
    """Check each value ``values`` gives against ``model``'s field of that key, without asking for the keys it
    leaves out (overrides merged into a template's values later): a mapping for a field that holds a model is
    checked key by key; a key the model does not know is left to the caller (who names what does know it).

    Raises:
        error: one line naming ``where``, the key, the value and what is allowed.
    """
    from pydantic import TypeAdapter

    for key, value in values.items():
        field = model.model_fields.get(key)
        if field is None:
            continue
        nested = nested_model(field.annotation)
        if nested is not None and isinstance(value, Mapping):
            check_partial(nested, value, where, error=error, prefix=(*prefix, key), root=root or model)
            continue
        adapter = TypeAdapter(Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation)
        try:
            adapter.validate_python(value, strict=True)
        except ValidationError as exc:
            first = dict(exc.errors(include_url=False)[0])
            first["loc"] = (*prefix, key, *first["loc"])
            raise error(_line(root or model, first, where, "")) from None
