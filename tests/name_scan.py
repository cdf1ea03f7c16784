"""Where a source tells things apart by name: for the tests that keep such branches inside their registries."""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any


def lines_telling_apart(tree: ast.AST, is_name: Callable[[Any], bool]) -> list[int]:
    """Lines of ``tree`` where a name (a node ``is_name`` accepts, or a literal table of them) is compared, is a
    dict key, or is in a literal tuple, list or set."""

    def named(node: Any) -> bool:
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(named(e) for e in node.elts)
        return is_name(node)

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(named(op) for op in (node.left, *node.comparators)):
            found.append(node.lineno)
        elif isinstance(node, ast.Dict) and any(k is not None and named(k) for k in node.keys):
            found.append(node.lineno)
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and named(node):
            found.append(node.lineno)
    return found
