"""Shared helpers: plain data for YAML/JSON, home-folder expansion, reading YAML and JSON."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from autotune.errors import ConfigError, InputError
from autotune.files import atomic_write_json, atomic_write_yaml
from autotune.utils import expand_path, plain_data, read_json, read_yaml


class Colour(str, Enum):
    RED = "red"


class Version(str):
    pass


def test_plain_data_turns_library_types_into_plain_ones() -> None:
    data = {"v": Version("2.1"), "f": np.float64(0.5), "i": np.int64(3), "b": np.bool_(True), "t": (1, 2),
            "p": Path("/a/b"), "arr": np.arange(4).reshape(2, 2), "tensor": torch.tensor([1.5, 2.5]),
            "scalar": torch.tensor(7), "enum": Colour.RED, "none": None, 4: True}
    plain = plain_data(data)
    assert plain == {"v": "2.1", "f": 0.5, "i": 3, "b": True, "t": [1, 2], "p": "/a/b", "arr": [[0, 1], [2, 3]],
                     "tensor": [1.5, 2.5], "scalar": 7, "enum": "red", "none": None, 4: True}
    assert type(plain["v"]) is str and type(plain["f"]) is float and type(plain["i"]) is int
    assert type(plain["b"]) is bool
    yaml.safe_dump(plain)  # would raise on any library type left
    json.dumps(plain)


def test_plain_data_options_for_statistics() -> None:
    other = object()
    assert plain_data({"x": other})["x"] is other, "unknown objects are left alone by default"
    plain = plain_data({1: other, Colour.RED: 2}, str_keys=True, str_other=True)
    assert plain == {"1": str(other), "red": 2}


def test_atomic_writers_accept_library_types(tmp_path: Path) -> None:
    data = {"n": np.int32(5), "shape": (2, 3), "name": Colour.RED}
    assert read_yaml(atomic_write_yaml(tmp_path / "a.yaml", data)) == {"n": 5, "shape": [2, 3], "name": "red"}
    assert read_json(atomic_write_json(tmp_path / "a.json", data)) == {"n": 5, "shape": [2, 3], "name": "red"}


def test_expand_path_names_what_and_what_to_give_instead(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/someone")
    assert expand_path("~/x.yaml") == Path("/home/someone/x.yaml")
    assert expand_path(Path("rel/x")) == Path("rel/x")
    with pytest.raises(ConfigError, match=r"path '~nosuchuser_xyz/a': cannot find the home folder of "
                                          r"'~nosuchuser_xyz'; give the full path"):
        expand_path("~nosuchuser_xyz/a")
    with pytest.raises(InputError, match=r"^work dir '~nosuchuser_xyz': .*; give an absolute path$"):
        expand_path("~nosuchuser_xyz", InputError, "work dir", "an absolute path")


def test_read_yaml_and_json_errors_name_the_file(tmp_path: Path) -> None:
    for reader, kind, bad in ((read_yaml, "YAML", "a: [1"), (read_json, "JSON", "{1")):
        with pytest.raises(InputError, match="file not found"):
            reader(tmp_path / "missing", InputError)
        binary = tmp_path / f"binary.{kind}"
        binary.write_bytes(b"\xff\xfe\x00")
        with pytest.raises(ConfigError, match=f"not a UTF-8 text file; give a {kind} file"):
            reader(binary)
        broken = tmp_path / f"broken.{kind}"
        broken.write_text(bad, encoding="utf-8")
        with pytest.raises(ConfigError, match=f"not valid {kind}"):
            reader(broken)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"a value cannot be read as JSON \(RecursionError"):
        read_json(deep)
