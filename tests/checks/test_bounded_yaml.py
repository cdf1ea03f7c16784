"""YAML within limits: every YAML autotune reads (its own files, MONAI's bundle configs before ConfigParser)
is refused in one line naming the file and the limit when it stands for too many values, nests too deep,
holds itself or is too large; what loads is plain data; walks over it visit each shared node once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from cli_harness import alias_bomb

from autotune.bundles.templates import load_overrides, reject_expressions
from autotune.checks import bounded_yaml
from autotune.checks.bounded_yaml import MAX_YAML_NODES, load_yaml, scan_yaml
from autotune.checks.tree import leaves, refuse_non_finite
from autotune.errors import ConfigError, SpecError
from autotune.stages import load_specs
from autotune.utils import read_json, read_yaml


def _file(tmp_path: Path, text: str, name: str = "f.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("reader", [lambda p: read_yaml(p), load_overrides, load_specs,
                                    lambda p: __import__("autotune.auto3dseg.view", fromlist=["x"]).check_config_file(p)],
                         ids=["read_yaml", "overrides", "specs", "monai-config"])
def test_nested_aliases_are_refused_fast_by_every_reader(reader: object, tmp_path: Path) -> None:
    path = _file(tmp_path, alias_bomb())
    start = time.perf_counter()
    with pytest.raises((ConfigError, SpecError)) as exc:
        reader(path)  # type: ignore[operator]
    assert time.perf_counter() - start < 0.5
    assert str(exc.value) == (f"{path}: refused: more than the limit of {MAX_YAML_NODES} values once aliases are "
                              "expanded (nested aliases?); write the values out or simplify the file")


@pytest.mark.parametrize(("text", "needle"), [
    ("a: &x [1, *x]\n", "the alias *x is inside its own anchor"),
    ("a: &x {b: *x}\n", "the alias *x is inside its own anchor"),
    ("a: " + "[" * 150 + "]" * 150 + "\n", "nesting deeper than the limit of 100 levels"),
])
def test_structures_holding_themselves_or_nested_too_deep_are_refused(text: str, needle: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="refused: " + needle.replace("*", r"\*")):
        read_yaml(_file(tmp_path, text))


def test_a_file_over_the_size_limit_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounded_yaml, "MAX_FILE_BYTES", 100)
    for name, reader in (("f.yaml", read_yaml), ("f.json", read_json)):
        path = _file(tmp_path, "x" * 101, name)
        with pytest.raises(ConfigError, match=f"{name}: refused: 101 bytes is more than the limit of 100 bytes"):
            reader(path)


def test_aliases_within_the_limit_load_and_stay_shared() -> None:
    data = load_yaml("base: &b {lr: 0.1, roi: [32, 32, 32]}\nunet: *b\nmerged: {<<: *b, lr: 0.2}\n", "t")
    assert data["unet"] is data["base"] and data["merged"] == {"lr": 0.2, "roi": [32, 32, 32]}
    assert scan_yaml("a: &x [1, 2]\nb: [*x, *x]\n") == 1 + 1 + 3 + 1 + 1 + 3 + 3


def test_loaded_yaml_is_plain_data() -> None:
    assert load_yaml("date: 2024-01-31\nwhen: 2024-01-31 10:00:00\n", "t") == {
        "date": "2024-01-31", "when": "2024-01-31 10:00:00"}
    for tag in ("!!set {a, b}", "!!binary aGk=", "!!omap [a: 1]", "!!timestamp 2024-01-31"):
        with pytest.raises(yaml.YAMLError, match="does not hold plain data"):
            load_yaml(f"x: {tag}\n", "t")


def test_a_bad_tag_names_the_file_line_and_why(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"f.yaml: not valid YAML \(line 1, column 4: the tag 'set' does not hold plain"):
        read_yaml(_file(tmp_path, "x: !!set {a}\n"))


def test_walks_visit_each_shared_node_once() -> None:
    """9 levels of 9 shared lists stand for 9**9 leaves; a walk sees each list once."""
    node: list[object] = ["x"] * 9
    for _ in range(8):
        node = [node] * 9
    start = time.perf_counter()
    reject_expressions({"a": node}, "t")
    refuse_non_finite({"a": node}, "t")
    assert len(list(leaves({"a": node}))) == 9 and time.perf_counter() - start < 0.1
    looped: list[object] = [1]
    looped.append(looped)
    assert [value for _, value in leaves(looped)] == [1]


def test_a_shared_expression_is_still_found() -> None:
    shared = {"lr": "$1+1"}
    with pytest.raises(ConfigError, match=r"t\.a\.lr: '\$1\+1' looks like an expression"):
        reject_expressions({"a": shared, "b": shared}, "t")
