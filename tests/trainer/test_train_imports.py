"""The training package imports in one direction: no module of ``autotune.trainer`` is part of an
import circle (the scan counts imports inside functions too; see tests/test_layering.py)."""

from __future__ import annotations

from test_layering import import_graph


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    edges = {m: {t for t in targets if t in graph and t != m} for m, targets in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while (member := stack.pop()) != node:
                group.add(member)
            group.add(node)
            if len(group) > 1:
                groups.append(group)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return groups


def test_the_scan_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [{"a", "b"}]


def test_no_training_module_is_in_an_import_circle() -> None:
    inside = {m for group in _circles(import_graph()) for m in group if m.startswith("autotune.trainer.")}
    assert inside == set()
