"""Which package may import which: read from the source (every import, including those inside
functions), so a cycle cannot hide behind a lazy import."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "autotune"
# the command line: the only modules that may import autotune.commands
CLI = ("autotune.commands", "autotune.cli", "autotune.__main__")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module ``source`` imports anywhere (top level, functions, ``TYPE_CHECKING`` blocks), as
    absolute names; ``from a import b`` counts as ``a`` and ``a.b`` (``b`` may be a submodule); a
    string naming an autotune module (for ``importlib.import_module``) counts too."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("autotune."):
            found.add(node.value.split()[0])
    return found


def _within(name: str, prefixes: tuple[str, ...] | str) -> bool:
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def import_graph() -> dict[str, set[str]]:
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        graph[name] = imported_modules(path.read_text(), name, path.name == "__init__.py")
    return graph


def test_the_scanner_sees_imports_inside_functions_and_relative_ones() -> None:
    source = (
        "import os\n"
        "def later():\n"
        "    from autotune.search.tune import tune_bundles\n"
        "    from . import render\n"
        "    from ..commands import train\n"
    )
    found = imported_modules(source, "autotune.bundles.bundlegen")
    assert {"autotune.search.tune", "autotune.bundles.render", "autotune.commands.train"} <= found


def test_bundles_do_not_import_the_search() -> None:
    """``autotune.search`` imports ``autotune.bundles``; the way back would close a cycle."""
    offenders = {m: sorted(t for t in targets if _within(t, "autotune.search"))
                 for m, targets in import_graph().items() if _within(m, "autotune.bundles")}
    assert {m: t for m, t in offenders.items() if t} == {}


def test_only_the_command_line_imports_the_commands() -> None:
    offenders = {m: sorted(t for t in targets if _within(t, "autotune.commands"))
                 for m, targets in import_graph().items() if not _within(m, CLI)}
    assert {m: t for m, t in offenders.items() if t} == {}


def test_torchrun_entry_loads_no_cli_module() -> None:
    """``python -m autotune.train`` (what torchrun starts on every rank) parses and runs without the CLI."""
    code = ("import sys\nfrom autotune.train.__main__ import main\ntry:\n    main(['--help'])\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith(('autotune.commands', 'autotune.cli'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "usage: python -m autotune.train" in out and "--nproc" in out
    assert out.strip().splitlines()[-1] == "[]"
