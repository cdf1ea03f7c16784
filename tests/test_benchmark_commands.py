"""Every command BENCHMARKS.md quotes (``python -m benchmarks.X ...``) imports from a fresh clone as written: from
the repository root, with nothing of ``tests/`` on the path. The benchmarks take what they need from ``autotune``
and ``benchmarks``; the tests may import the benchmarks' helpers, never the other way round."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = re.compile(r"\bpython3? -m (benchmarks\.\w+)")

# In a fresh interpreter at the root (``python -c``: the root first on the path, as ``python -m`` puts it): import
# each module, then run every import statement it holds, those inside its functions included (what its main
# function and sections import when they run), and follow the benchmarks' modules those reach. A module missing
# from the environment is noted, not failed, unless it lies in the repository (a test helper named bare, e.g.
# ``system_deps``): only then would the command fail on a fresh clone with the dependencies installed.
_IMPORTER = r'''
import ast, importlib, json, sys, traceback
from pathlib import Path

root = Path.cwd()
todo, seen, failed, missing = list(sys.argv[1:]), set(), {}, {}

def in_repo(name):
    top = name.split(".")[0]
    return any(p.exists() for p in (root / f"{top}.py", root / top, root / "tests" / f"{top}.py", root / "tests" / top))

def note(module, what, exc):
    if isinstance(exc, ModuleNotFoundError) and exc.name and not in_repo(exc.name):
        missing.setdefault(module, []).append(f"{what}: {exc.name}")
    else:
        failed.setdefault(module, []).append(f"{what}: {type(exc).__name__}: {exc}")

while todo:
    module = todo.pop()
    if module in seen:
        continue
    seen.add(module)
    try:
        importlib.import_module(module)
    except BaseException as exc:  # noqa: BLE001 - reported
        note(module, f"import {module}", exc)
        continue
    path = Path(sys.modules[module].__file__)
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        statement = ast.unparse(node)
        scope = {"__name__": module, "__package__": module.rpartition(".")[0]}
        try:
            exec(statement, scope)
        except BaseException as exc:  # noqa: BLE001 - reported
            note(module, statement, exc)
            continue
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [
            node.module or "", *(f"{node.module}.{a.name}" for a in node.names)]
        todo += [n for n in names if n.startswith("benchmarks.") and n in sys.modules]
print(json.dumps({"seen": sorted(seen), "failed": failed, "missing": missing}))
'''


def quoted_commands(text: str) -> list[str]:
    """The benchmark modules a text's ``python -m benchmarks.X`` commands run, sorted."""
    return sorted(set(COMMAND.findall(text)))


def import_everything(modules: list[str]) -> dict:
    """``_IMPORTER``'s answer for ``modules``, run at the repository root with nothing of ``tests/`` on the path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", _IMPORTER, *modules], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_quoted_commands_are_found() -> None:
    found = quoted_commands((ROOT / "BENCHMARKS.md").read_text())
    assert {"benchmarks.bench_many_workers", "benchmarks.gpu_check", "benchmarks.tables"} <= set(found)
    assert quoted_commands("run `python3 -m benchmarks.x --y` or python -m benchmarks.y_2") == [
        "benchmarks.x", "benchmarks.y_2"]


def test_every_quoted_benchmark_command_imports_from_a_fresh_clone() -> None:
    """Each module a quoted command runs, every import its functions make, and the benchmarks' modules those
    reach, import from the root with ``tests/`` off the path (``No module named 'system_deps'`` was the case of
    ``bench_many_workers``, through the tests' PostgreSQL fixtures)."""
    modules = quoted_commands((ROOT / "BENCHMARKS.md").read_text())
    answer = import_everything(modules)
    assert set(modules) <= set(answer["seen"])
    assert answer["failed"] == {}


def test_the_importer_fails_a_test_helper_named_bare(tmp_path: Path) -> None:
    """A module whose function imports a test helper (here ``system_deps``, in ``tests/``) fails; a third-party
    module missing from the environment is only noted."""
    package = tmp_path / "benchmarks"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "bench_x.py").write_text("def main():\n    from system_deps import unavailable\n"
                                        "    import not_installed_anywhere_xyz\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "system_deps.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", _IMPORTER, "benchmarks.bench_x"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["failed"] == {"benchmarks.bench_x": [
        "from system_deps import unavailable: ModuleNotFoundError: No module named 'system_deps'"]}
    assert answer["missing"] == {"benchmarks.bench_x": ["import not_installed_anywhere_xyz: not_installed_anywhere_xyz"]}


def _test_helpers() -> set[str]:
    """The names the tests' own modules and folders answer to when ``tests/`` is on the path."""
    tests = ROOT / "tests"
    return {p.stem for p in tests.glob("*.py")} | {p.name for p in tests.iterdir() if p.is_dir()} | {"tests"}


def test_the_benchmarks_import_nothing_of_the_tests() -> None:
    helpers = _test_helpers()
    found = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.name}:{node.lineno} {name}" for name in names if name.split(".")[0] in helpers]
    assert found == []
