"""The front door: --help without torch, every subcommand listed, the public API resolves."""

from __future__ import annotations

import subprocess
import sys

import pytest

import autotune
from autotune.cli import build_parser, main

SUBCOMMANDS = ("analyze", "demo-data", "generate", "probe", "estimate", "tune", "run", "worker", "verify",
               "dashboard", "train", "infer")


def test_help_does_not_import_torch() -> None:
    code = ("import sys; from autotune.cli import build_parser; build_parser().format_help(); "
            "print(sorted(m for m in ('torch', 'monai', 'optuna') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_subcommand_is_registered() -> None:
    help_text = build_parser().format_help()
    for name in SUBCOMMANDS:
        assert name in help_text, name


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_subcommand_help_exits_0(name: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    assert "usage: autotune" in capsys.readouterr().out


def test_unknown_subcommand_and_missing_argument_exit_2(capsys) -> None:
    assert main(["frobnicate"]) == 2
    assert main(["generate", "--work-dir", "w"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err


def test_public_api_resolves() -> None:
    for name in autotune.__all__:
        assert getattr(autotune, name) is not None, name


def test_the_errors_live_in_their_module_and_older_imports_still_resolve() -> None:
    """``autotune.__all__`` lists the stages and MONAI's shapes (at most 24 names); the errors are
    ``autotune.errors``'s, as Optuna's are ``optuna.exceptions``', yet ``autotune.SpecError`` still resolves."""
    import autotune.errors

    assert len(autotune.__all__) <= 24 and not set(autotune.__all__) & set(autotune.errors.__all__)
    for name in autotune.errors.__all__:
        assert getattr(autotune, name) is getattr(autotune.errors, name), name
    with pytest.raises(AttributeError, match="no attribute 'NoSuchError'"):
        autotune.NoSuchError  # noqa: B018 - the attribute access is the test


@pytest.mark.parametrize("value", ["-1GiB", "-0.5GiB"])
def test_negative_memory_limit_is_named_not_swallowed_by_argparse(value: str, tmp_path, capsys) -> None:
    """``--memory-limit -1GiB`` (a value starting with '-') reaches the size check, which runs as the options are
    parsed (before the bundle is read): one line saying why."""
    code = main(["estimate", str(tmp_path / "no_bundle"), "--memory-limit", value])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "must be a positive size" in err and value in err and "expected one argument" not in err
