"""Walks over loaded plain data (what a YAML or JSON file holds) that visit each shared node once.

A YAML alias makes two places hold the same list or mapping; a walk that follows every place
again does work exponential in the nesting of aliases. ``leaves`` goes through each container
once (by identity), without recursion, and names each value by the first path that reaches it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

from autotune.checks.values import Error, shown
from autotune.errors import ConfigError

__all__ = ["leaves", "refuse_non_finite", "refuse_expressions"]


def leaves(tree: Any, where: str = "") -> Iterator[tuple[str, Any]]:
    """``(path, value)`` for every value that is not a list or mapping, each container walked once.

    Paths read ``where.key[0].other``; a container reached again through an alias is not walked
    again, and a container that holds itself is walked once.
    """
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [(where, tree)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, Mapping):
            items = [(f"{path}.{key}" if path else str(key), value) for key, value in node.items()]
        elif isinstance(node, (list, tuple)):
            items = [(f"{path}[{index}]", value) for index, value in enumerate(node)]
        else:
            yield path, node
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(reversed(items))


def refuse_non_finite(tree: Any, where: str, error: Error = ConfigError) -> None:
    """Raise ``error`` naming the first NaN or infinite number in ``tree`` (a config holds finite numbers)."""
    for path, value in leaves(tree):
        if isinstance(value, float) and not math.isfinite(value):
            raise error(f"{where}: key {path!r}: got {value!r}; must be a finite number (NaN and infinity are "
                        "refused in every file autotune reads): fix the value or regenerate the file")


def refuse_expressions(tree: Any, where: str, error: Error = ConfigError) -> None:
    """Raise ``error`` if a string in ``tree`` is a MONAI-style ``$`` expression: nothing autotune reads is evaluated."""
    for path, value in leaves(tree):
        if isinstance(value, str) and value.lstrip().startswith("$"):
            place = f"{where}.{path}" if path and not path.startswith("[") else f"{where}{path}"
            raise error(f"{place}: {shown(value)} looks like an expression; templates are plain data, write the value")
