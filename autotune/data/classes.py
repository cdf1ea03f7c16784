"""The label values a dataset declares (``labels``, or ``class_names`` without ``sigmoid``), and the
refusal of a label value outside them.

Both the per-case checks (``autotune.data.validate``) and the dataset-wide checks
(``autotune.data.integrity``) use these, so they live apart from either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from autotune.data.source import DataSource
from autotune.errors import DataError, InputError

__all__ = ["DeclaredClasses", "declared_classes", "declaring_file", "refuse_undeclared"]


@dataclass(frozen=True)
class DeclaredClasses:
    """The label values a dataset declares, and where.

    Attributes:
        values: Allowed label values, ascending; background 0 is always allowed.
        names: Class name per foreground value, where known.
        where: Completes "label holds the value V, which ...", naming the declaring file.
        fix: What to change, for the refusal.
        file: The declaring file.
    """

    values: tuple[int, ...]
    names: dict[int, str] = field(default_factory=dict)
    where: str = "is not declared"
    fix: str = "fix the label"
    file: Path | None = None


def declared_classes(source: DataSource) -> DeclaredClasses | None:
    """The classes ``source`` declares: its ``labels``, else ``class_names`` (values 0..N) unless ``sigmoid``.

    With ``sigmoid`` (overlapping regions) class names name regions, not label values, so they
    declare nothing on their own.

    Raises:
        InputError: Both ``labels`` and ``class_names`` are given (without ``sigmoid``) and they name
            a different number of foreground classes.
    """
    declaring = declaring_file(source)
    names = source.class_names
    if source.labels is not None:
        values = tuple(sorted({0, *source.labels}))
        foreground = [value for value in values if value != 0]
        if names is not None and not source.sigmoid and len(names) != len(foreground):
            raise InputError(f"{declaring}: class_names names {len(names)} class(es) but labels declares "
                             f"{len(foreground)} foreground value(s) {foreground}; give one class name per "
                             "foreground label value")
        named = dict(zip(foreground, names, strict=True)) if names is not None and not source.sigmoid else {}
        return DeclaredClasses(values=values, names=named, file=declaring,
                               where=f"is not among the labels {list(values)} declared in {declaring}",
                               fix=f"fix the label, or add the value to 'labels' in {declaring.name}")
    if names is not None and not source.sigmoid:
        count = len(names)
        return DeclaredClasses(values=tuple(range(count + 1)), names=dict(enumerate(names, start=1)), file=declaring,
                               where=f"class_names in {declaring} does not name ({count} class(es): label values "
                                     f"0-{count})",
                               fix="fix the label, or give class_names one name per foreground value")
    return None


def refuse_undeclared(label_path: str, values: tuple[int, ...], declared: DeclaredClasses) -> None:
    """Raise ``DataError`` for the first value of ``values`` that ``declared`` does not allow."""
    allowed = set(declared.values) | {0}
    for value in values:
        if value not in allowed:
            raise DataError(f"{label_path}: label holds the value {value}, which {declared.where}; {declared.fix}")


def declaring_file(source: DataSource) -> Path:
    """The file that declares the classes: a Decathlon folder's dataset.json, else the input file."""
    return source.source / "dataset.json" if source.source.is_dir() else source.source
