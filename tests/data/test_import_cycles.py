"""No import cycle: read from the source with ``tests/test_layering.py``'s scanner (every import, lazy ones
included), so a cycle cannot hide inside a function.

``ACYCLIC`` names the packages checked: no module in them may be part of an import cycle. Add a
package once its cycles are gone; ``autotune`` itself once the whole package has none.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

ACYCLIC = ("autotune.data",)


def _layering() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "test_layering.py"
    spec = importlib.util.spec_from_file_location("_layering_scanner", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other in a circle (strongly connected components of two or
    more modules, Tarjan's algorithm without recursion), each sorted; imports of other modules are ignored."""
    edges = {module: sorted(target for target in targets if target in graph and target != module)
             for module, targets in graph.items()}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(edges):
        if root in order:
            continue
        work = [(root, iter(edges[root]))]
        order[root] = low[root] = len(order)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, targets = work[-1]
            target = next(targets, None)
            if target is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == order[module]:
                    group = _pop_group(stack, on_stack, module)
                    if len(group) > 1:
                        cycles.append(sorted(group))
            elif target not in order:
                order[target] = low[target] = len(order)
                stack.append(target)
                on_stack.add(target)
                work.append((target, iter(edges[target])))
            elif target in on_stack:
                low[module] = min(low[module], order[target])
    return cycles


def _pop_group(stack: list[str], on_stack: set[str], root: str) -> list[str]:
    group = []
    while True:
        module = stack.pop()
        on_stack.discard(module)
        group.append(module)
        if module == root:
            return group


def _within(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def test_the_cycle_finder_finds_circles_through_lazy_imports() -> None:
    scanner = _layering()
    sources = {
        "autotune.data.a": "from autotune.data import b\n",
        "autotune.data.b": "def later():\n    from .c import thing\n",
        "autotune.data.c": "import autotune.data.a\n",
        "autotune.data.d": "from autotune.data.a import x\n",  # imports into the circle, is not part of it
        "autotune.data.e": "import autotune.data.e\n",  # itself: not a circle
    }
    graph = {name: scanner.imported_modules(text, name) for name, text in sources.items()}
    assert import_cycles(graph) == [["autotune.data.a", "autotune.data.b", "autotune.data.c"]]
    assert import_cycles({**graph, "autotune.data.c": set()}) == []


def test_no_module_of_the_acyclic_packages_is_in_an_import_cycle() -> None:
    cycles = import_cycles(_layering().import_graph())
    assert [group for group in cycles if any(_within(module, ACYCLIC) for module in group)] == []
