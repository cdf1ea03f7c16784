"""Which package may import which: read from the source (every import, including those inside
functions), so a cycle cannot hide behind a lazy import."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "autotune"
BENCHMARKS = PACKAGE.parent / "benchmarks"
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
        "    from autotune.search.driver.bundles import search_bundles\n"
        "    from . import render\n"
        "    from ..commands import train\n"
    )
    found = imported_modules(source, "autotune.bundles.bundlegen")
    assert {"autotune.search.driver.bundles", "autotune.bundles.render", "autotune.commands.train"} <= found


# The house of docs/architecture.md ("The layers"), top to bottom: each layer a list of rooms, each room a module
# prefix. A module lives in the room of its longest prefix ("autotune" alone is the package's ``__init__.py``, its
# public names), and imports only modules of its own layer or of a layer below it.
LAYERS: tuple[tuple[str, ...], ...] = (
    # the scripts BENCHMARKS.md runs, over autotune; the tests may import them, autotune never does
    ("benchmarks",),
    # the entries: the public names, the command line, torchrun's wrapper, old bundles' inference entry
    ("autotune", "autotune.__main__", "autotune.cli", "autotune.commands", "autotune.torchrun",
     "autotune.bundles.algo"),
    ("autotune.pipeline",),
    ("autotune.stages", "autotune.calibrate"),
    ("autotune.facade",),
    # the search (its rooms ordered among themselves: SEARCH_FAMILIES) beside the trainer: neither imports the other
    ("autotune.search", "autotune.trainer"),
    # the probe's orchestrating part: the runner, the trial, the estimator, the calibrations
    ("autotune.probe",),
    # a bundle loaded through its family
    ("autotune.bundles.config",),
    ("autotune.families",),
    # MONAI's templates and the launcher's entry, reached only by the families
    ("autotune.auto3dseg", "autotune.launch"),
    # the Optuna storage: the search's lowest room, where training records a pass that ran out of memory
    ("autotune.search.storage",),
    # one step and its parts, and the probe's measuring part
    ("autotune.build", "autotune.step", "autotune.schedule", "autotune.finite", "autotune.autocast",
     "autotune.precision", "autotune.device", "autotune.cuda_alloc", "autotune.probe.workload",
     "autotune.probe.tracker", "autotune.probe.memory", "autotune.probe.allocator", "autotune.probe.device_model",
     "autotune.probe.replay"),
    # the config model, and the data's checks of a bundle against its cases
    ("autotune.bundles", "autotune.data.bundle_fit", "autotune.data.split"),
    ("autotune.tunables", "autotune.data"),
    ("autotune.files", "autotune.stopping", "autotune.lazy", "autotune.utils", "autotune.version"),
    ("autotune.checks",),
    ("autotune.errors",),
)


def _room(module: str) -> str | None:
    """The room of ``module``: its longest prefix in ``LAYERS`` (None: in none)."""
    rooms = [room for layer in LAYERS for room in layer
             if module == room or (room != "autotune" and module.startswith(room + "."))]
    return max(rooms, key=len, default=None)


def _layer(module: str) -> int | None:
    """The index in ``LAYERS`` (0 = top) of the layer holding ``module``'s room."""
    room = _room(module)
    return next((i for i, layer in enumerate(LAYERS) if room in layer), None)


def _named(module: str) -> str:
    layer = _layer(module)
    return f"{module} (layer {layer}: {', '.join(LAYERS[layer])})" if layer is not None else f"{module} (no layer)"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import of ``graph`` (module -> the modules it loads) that goes to a higher layer, as a line naming the
    importing module, the imported one and both layers."""
    return [f"{_named(module)} imports {_named(target)}, a layer above it"
            for module, targets in sorted(graph.items()) for target in sorted(targets)
            if _layer(target) is not None and _layer(module) is not None and _layer(target) < _layer(module)]


def test_every_module_has_a_room_and_every_room_a_module() -> None:
    modules = set(_module_paths())
    assert sorted(m for m in modules if _room(m) is None) == []
    rooms = [room for layer in LAYERS for room in layer]
    assert len(rooms) == len(set(rooms))
    assert [r for r in rooms if not any(m == r or m.startswith(r + ".") for m in modules)] == []


def test_the_layer_check_names_both_ends_of_an_import_up() -> None:
    low, high = _layer("autotune.bundles.model"), _layer("autotune.families.own")
    assert upward_imports({"autotune.bundles.model": {"autotune.families.own", "autotune.errors"}}) == [
        f"autotune.bundles.model (layer {low}: autotune.bundles, autotune.data.bundle_fit, autotune.data.split) "
        f"imports autotune.families.own (layer {high}: autotune.families), a layer above it"]
    assert upward_imports({"autotune.families.own": {"autotune.bundles.model"}}) == []
    assert _room("autotune.probe.workload") == "autotune.probe.workload" and _room("autotune.probe.runner") == \
        "autotune.probe" and _room("autotune") == "autotune" and _room("autotune.version") == "autotune.version"


def test_every_import_goes_to_its_own_layer_or_one_below() -> None:
    """The whole table: every import of autotune and the benchmarks (at the top, in functions, under
    ``TYPE_CHECKING``, a module named for ``importlib``) goes to the importer's layer or a lower one."""
    assert upward_imports(_module_graph()) == []


def _room_graph() -> dict[str, set[str]]:
    """Room -> the other rooms its modules load."""
    rooms: dict[str, set[str]] = {}
    for module, targets in _module_graph().items():
        own = str(_room(module))
        rooms.setdefault(own, set()).update(str(_room(t)) for t in targets if _room(t) != own)
    return rooms


def test_no_import_cycle_between_rooms() -> None:
    """No room (the layer table's packages and modules, the benchmarks one of them) reaches itself through the
    rooms it loads: rooms of one layer import one way at most."""
    assert _cycles(_room_graph()) == []


def test_the_trainer_and_the_search_import_neither_the_other() -> None:
    """The search (but its storage, below both) and the trainer share a layer and import nothing of each other:
    the hand-off reads the fold split from ``autotune.data.split``; training records an out-of-memory pass in the
    study through ``autotune.search.storage.training_oom``."""
    graph = _module_graph()
    search = [(m, t) for m, targets in graph.items() if _room(m) == "autotune.search"
              for t in targets if _room(t) == "autotune.trainer"]
    trainer = [(m, t) for m, targets in graph.items() if _room(m) == "autotune.trainer"
               for t in targets if _room(t) == "autotune.search"]
    assert (search, trainer) == ([], [])


def test_nothing_imports_the_old_bundles_inference_entry() -> None:
    """``autotune.bundles.algo`` is an entry for bundles generated before the facade moved (their
    ``scripts/infer.py``), above the facade it names: nothing of autotune imports it."""
    assert sorted(m for m, targets in _module_graph().items() if "autotune.bundles.algo" in targets) == []


def _drawing() -> list[str]:
    """The lines of docs/architecture.md's drawing of the house (the code block under "The layers")."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    section = text.split("## The layers", 1)[1]
    return section.split("```", 2)[1].splitlines()


def _spelled(room: str) -> str:
    """A room as the drawing spells it: ``search/storage/`` for a package, ``step.py`` for a module,
    ``__init__.py`` for autotune's own names, ``benchmarks/`` for the scripts."""
    if room == "autotune":
        return "__init__.py"
    path = PACKAGE.parent / room.replace(".", "/")
    relative = room.split(".", 1)[1].replace(".", "/") if room.startswith("autotune.") else room
    return f"{relative}/" if path.is_dir() else f"{relative}.py"


def test_the_drawing_is_the_layer_table() -> None:
    """Every room is drawn, and the layers are drawn in the table's order: each room's first mention lies below
    every room of the layer above (a room spelled as a path, e.g. ``search/storage/``, ``probe/workload.py``)."""
    lines = _drawing()

    def first(room: str) -> int | None:
        spelled = re.compile(rf"(?<![\w/.]){re.escape(_spelled(room))}(?![\w])")
        return next((i for i, line in enumerate(lines) if spelled.search(line)), None)

    missing = [room for layer in LAYERS for room in layer if first(room) is None]
    assert missing == []
    out_of_order = [(upper, lower) for above, below in zip(LAYERS[:-1], LAYERS[1:], strict=True)
                    for upper in above for lower in below if first(lower) <= first(upper)]
    assert out_of_order == []


def test_bundles_do_not_import_the_search() -> None:
    """``autotune.search`` imports ``autotune.bundles``; the way back would close a cycle."""
    offenders = {m: sorted(t for t in targets if _within(t, "autotune.search"))
                 for m, targets in import_graph().items() if _within(m, "autotune.bundles")}
    assert {m: t for m, t in offenders.items() if t} == {}


def test_the_checks_import_nothing_of_autotune_but_the_errors() -> None:
    """``autotune.checks`` is the validation layer every other module uses: it sits on ``autotune.errors`` alone,
    so a setting's checker (``checks/environment.py``) never reaches up into the stages it serves."""
    offenders = {m: sorted(t for t in targets if t.startswith("autotune.")
                           and not _within(t, ("autotune.checks", "autotune.errors")))
                 for m, targets in import_graph().items() if _within(m, "autotune.checks")}
    assert {m: t for m, t in offenders.items() if t} == {}


def test_packages_export_lazily_through_the_one_helper() -> None:
    """A package that loads its names lazily takes ``__getattr__`` from ``autotune.lazy.lazy_exports``: no
    ``__init__.py`` writes its own."""
    found = set()
    for path in sorted(PACKAGE.rglob("__init__.py")):
        tree = ast.parse(path.read_text())
        if any(isinstance(node, ast.FunctionDef) and node.name == "__getattr__" for node in tree.body):
            found.add(module_name(path))
    assert found == set()


def test_lazy_exports_load_a_name_from_its_module_when_asked() -> None:
    import textwrap

    from autotune.lazy import lazy_exports

    getattr_, dir_ = lazy_exports("pkg", {"dedent": "textwrap", "indent": "textwrap"}, ["dedent"])

    assert getattr_("dedent") is textwrap.dedent and getattr_("indent") is textwrap.indent and dir_() == ["dedent"]
    with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'missing'"):
        getattr_("missing")


def test_only_the_command_line_imports_the_commands() -> None:
    offenders = {m: sorted(t for t in targets if _within(t, "autotune.commands"))
                 for m, targets in import_graph().items() if not _within(m, CLI)}
    assert {m: t for m, t in offenders.items() if t} == {}


def test_torchrun_entry_loads_no_cli_module() -> None:
    """``python -m autotune.trainer`` (what torchrun starts on every rank) parses and runs without the CLI."""
    code = ("import sys\nfrom autotune.trainer.__main__ import main\ntry:\n    main(['--help'])\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith(('autotune.commands', 'autotune.cli'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "usage: python -m autotune.trainer" in out and "--nproc" in out
    assert out.strip().splitlines()[-1] == "[]"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    import itertools

    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = itertools.count()

    def visit(node: str) -> None:
        index[node] = low[node] = next(counter)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in graph:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _module_edges(path: Path, name: str, modules: set[str]) -> set[str]:
    """The autotune modules ``name`` loads when it runs (lazy imports and lazily named modules included):
    ``from pkg import sub`` where ``sub`` is a module loads ``sub`` (and ``pkg``'s ``__init__``, which a
    package's own modules do not count as an edge back into themselves); ``from pkg import name`` of
    anything else loads ``pkg``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            subs = [f"{base}.{alias.name}" for alias in node.names]
            found = [sub for sub in subs if sub in modules]
            out.update(found)
            if len(found) < len(subs) and base in modules:
                out.add(base)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("autotune.")
              and node.value.split(" ")[0] in modules):  # a module named for importlib
            out.add(node.value.split(" ")[0])
    out.discard(name)
    return out


def _module_paths() -> dict[str, Path]:
    """Every module of ``autotune/`` and ``benchmarks/`` (the scripts over it), by name."""
    return {module_name(path): path for root in (PACKAGE, BENCHMARKS) for path in sorted(root.rglob("*.py"))}


def _module_graph() -> dict[str, set[str]]:
    """Module -> the modules of autotune and the benchmarks it loads (``_module_edges``)."""
    paths = _module_paths()
    return {name: _module_edges(path, name, set(paths)) for name, path in paths.items()}


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_among_modules() -> None:
    """No module of autotune or the benchmarks reaches itself through the modules it loads, lazy imports and
    lazily named modules included, package ``__init__`` files included."""
    assert _cycles(_module_graph()) == []


def test_the_module_graph_follows_a_package_init_and_its_lazy_names(tmp_path: Path) -> None:
    modules = {"autotune", "autotune.a", "autotune.b", "autotune.pkg", "autotune.pkg.sub"}
    init = tmp_path / "__init__.py"
    init.write_text('EXPORTS = {"thing": "autotune.a"}\n')
    module = tmp_path / "b.py"
    module.write_text("from autotune.pkg import sub\nfrom autotune import thing\n")
    assert _module_edges(init, "autotune", modules) == {"autotune.a"}
    assert _module_edges(module, "autotune.b", modules) == {"autotune.pkg.sub", "autotune"}


# the search's families, lowest first: a family may import only those before it
SEARCH_FAMILIES = ("storage", "curves", "strategies", "handoff", "dashboard", "driver")


def _family(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["autotune", "search"] else None


def test_search_families_import_only_lower_families() -> None:
    offenders = {}
    for name, targets in import_graph().items():
        own = _family(name)
        if own is None:
            continue
        rank = SEARCH_FAMILIES.index(own)
        higher = sorted(t for t in targets if _family(t) in SEARCH_FAMILIES[rank + 1:])
        if higher:
            offenders[name] = higher
    assert offenders == {}


def test_the_search_reaches_the_probe_through_its_package() -> None:
    """``autotune.search`` uses what ``autotune.probe`` exports (its ``__all__``), not the probe's modules."""
    import autotune.probe

    exported = set(autotune.probe.__all__)
    offenders = {}
    for name, targets in import_graph().items():
        if not _within(name, "autotune.search"):
            continue
        inside = sorted(t for t in targets if t.startswith("autotune.probe.") and t.rpartition(".")[2] not in exported)
        if inside:
            offenders[name] = inside
    assert offenders == {}


def test_public_names_are_not_shadowed_by_subpackages() -> None:
    """Importing every module leaves each public name of ``autotune`` what ``__all__`` says (a function stays a
    function: a subpackage of the same name would replace it on import)."""
    import importlib
    import types

    import autotune

    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if name.endswith("__main__"):
            continue
        importlib.import_module(name)
    shadowed = [n for n in autotune.__all__ if isinstance(getattr(autotune, n), types.ModuleType)]
    assert shadowed == []


# the bundle model (config, plan, render, templates, scaling, network) sits on these alone
BUNDLE_MODEL_BASE = ("autotune.bundles", "autotune.errors", "autotune.utils", "autotune.checks", "autotune.files",
                     "autotune.version", "autotune.tunables")
# bundles/config.py is where the stages load a bundle: it asks the bundle's family (``autotune.families``), which
# sits above the model (``autotune.bundles.schema`` and the rest) and below every stage
BUNDLE_MODEL_CLIMBS_LEFT = {"autotune.bundles.config": ("autotune.families",),
                            # the old inference entry of bundles generated before the facade moved up
                            "autotune.bundles.algo": ("autotune.facade",)}
# MONAI's shapes over the bundles (BundleGen, Algo): only the stages above them and the public names import them
FACADE_IMPORTERS = ("autotune", "autotune.facade", "autotune.pipeline", "autotune.stages", "autotune.bundles.algo",
                    "autotune.calibrate.data")  # the calibration generates its bundles as a user would


def test_the_bundle_model_imports_nothing_above_it() -> None:
    """``autotune.bundles`` is the low-level config model: the builders, the trainer and the facade import it,
    never the other way round (no import climbs back up a level)."""
    offenders = {m: sorted(t for t in targets if t.startswith("autotune.")
                           and not _within(t, (*BUNDLE_MODEL_BASE, *BUNDLE_MODEL_CLIMBS_LEFT.get(m, ()))))
                 for m, targets in import_graph().items() if _within(m, "autotune.bundles")}
    assert {m: t for m, t in offenders.items() if t} == {}


def test_only_the_stages_import_the_facade() -> None:
    offenders = {m: sorted(t for t in targets if _within(t, "autotune.facade"))
                 for m, targets in import_graph().items() if m not in FACADE_IMPORTERS and not _within(m, "autotune.facade")}
    assert {m: t for m, t in offenders.items() if t} == {}


# the template families (``autotune.families``) sit above the bundles' config model (``autotune.bundles.schema``,
# ``autotune.build``, ``autotune.step``, ``autotune.probe.workload``) and MONAI's templates (``autotune.auto3dseg``),
# and below every stage that asks them (``autotune.bundles.config``, the probe, the search, training)
ABOVE_FAMILIES = ("autotune.search", "autotune.trainer", "autotune.stages", "autotune.pipeline", "autotune.commands",
                  "autotune.cli", "autotune.bundles.config")
# the modules that may use MONAI's templates' package directly: the families, the package itself, and the
# entry ``python -m autotune.launch`` (MONAI's ``train.py`` under a limit, AutoRunner's command prefix)
AUTO3DSEG_USERS = ("autotune.families", "autotune.auto3dseg", "autotune.launch")


def test_the_families_import_no_stage_that_asks_them() -> None:
    offenders = {m: sorted(t for t in targets if _within(t, ABOVE_FAMILIES))
                 for m, targets in import_graph().items() if _within(m, "autotune.families")}
    assert {m: t for m, t in offenders.items() if t} == {}


def test_only_the_families_reach_monais_templates() -> None:
    """The probe, the estimator, the search, the hand-off, training and the bundles ask a bundle's family
    (``autotune.families``), never ``autotune.auto3dseg`` itself."""
    offenders = {m: sorted(t for t in targets if _within(t, "autotune.auto3dseg"))
                 for m, targets in import_graph().items() if not _within(m, AUTO3DSEG_USERS)}
    assert {m: t for m, t in offenders.items() if t} == {}


# a format or a template's name compared, or a MONAI bundle told apart by hand
_NAMES = "monai|segresnet|dints|unet|swinunetr|segresnet2d"
NAME_TEST = re.compile(rf'[!=]=\s*"({_NAMES})"|"({_NAMES})"\s*[!=]=|\bin\s*\(\s*"({_NAMES})"|is_monai_bundle')


def test_the_name_test_finds_what_the_families_replaced() -> None:
    for line in ('if cfg.get("format") == "monai":', "if auto3dseg.is_monai_bundle(bundle):",
                 'if view["monai_template"] == "segresnet":', 'monai = "dints" != template',
                 'if algo in ("swinunetr", "segresnet2d"):'):
        assert NAME_TEST.search(line), line
    assert not NAME_TEST.search('return {"monai": monai_version(), "analyzer": ANALYZER}')


def test_no_module_outside_the_families_tests_a_format_or_a_template_name() -> None:
    """``cfg.get("format") == "monai"``, ``is_monai_bundle`` and a template's name compared: the families' job."""
    found = [f"{path.relative_to(PACKAGE.parent)}:{number}" for path in sorted(PACKAGE.rglob("*.py"))
             if not _within(module_name(path), ("autotune.families", "autotune.auto3dseg"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if NAME_TEST.search(line)]
    assert found == []


def test_bundles_generated_before_the_facade_moved_still_find_their_inferer() -> None:
    """An older bundle's ``scripts/infer.py`` imports ``autotune.bundles.algo.InferClass``; MONAI loads it."""
    import importlib

    from autotune.facade.algo import InferClass

    assert importlib.import_module("autotune.bundles.algo").InferClass is InferClass
