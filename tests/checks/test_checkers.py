"""The checkers, one per kind of value: what each accepts, returns and refuses, and that a refusal is one line
naming where the value came from, the value and what is allowed."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from autotune.checks import (
    Integer,
    Number,
    Triple,
    byte_size,
    choice,
    device,
    duration,
    flag,
    host,
    integer,
    number,
    path,
    port,
    storage_url,
)
from autotune.checks.environment import SETTINGS, setting
from autotune.errors import AutotuneError, ConfigError, SpecError


def _refused(check: Any, value: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(AutotuneError) as exc:
        check(value, *args, **kwargs)
    message = str(exc.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "nan", "inf", "1e999", True, None, "", "x", [1]])
def test_number_refuses_what_is_not_a_finite_number(value: Any) -> None:
    message = _refused(number, value, "f.yaml: key 'lr'", low=0.0, low_open=True)
    assert message.startswith("f.yaml: key 'lr': got ") and "must be a finite number above 0" in message


@pytest.mark.parametrize(("value", "expected"), [(0.5, 0.5), (1, 1.0), (" 2.5 ", 2.5), ("1e-3", 0.001)])
def test_number_reads_numbers_and_number_text(value: Any, expected: float) -> None:
    assert number(value, "x", low=0.0, high=10.0) == expected


def test_number_ranges_say_which_ends_are_open() -> None:
    assert "at least 0 and below 1" in _refused(number, 1.0, "m", low=0, high=1, high_open=True)
    assert "from 0 to 1" in _refused(number, -0.1, "m", low=0, high=1)
    assert number(0.0, "m", low=0, high=1, high_open=True) == 0.0


@pytest.mark.parametrize("value", [True, 1.0, "1.5", "١٢", "9" * 30, "", "0x10", None, 0, 70000])
def test_integer_refuses_bools_floats_unicode_digits_and_out_of_range(value: Any) -> None:
    message = _refused(integer, value, "--port", low=1, high=65535, error=SpecError)
    assert "must be a whole number from 1 to 65535" in message


@pytest.mark.parametrize(("value", "expected"), [(5, 5), ("5", 5), (" +7 ", 7), ("-0", 0)])
def test_integer_reads_ints_and_digit_text(value: Any, expected: int) -> None:
    assert integer(value, "n", low=0) == expected


def test_flags_and_choices() -> None:
    assert flag(True, "k") is True and flag("Yes", "E", words=True) is True and flag("off", "E", words=True) is False
    assert "must be true or false" in _refused(flag, "yes", "k")
    assert choice("FP32", ("auto", "fp32"), "precision", SpecError, fold_case=True) == "fp32"
    message = _refused(choice, "tpee", ("fast", "tpe"), "strategy", SpecError, where="--strategy")
    assert message == "--strategy: unknown strategy 'tpee' (did you mean 'tpe'?); valid: fast, tpe"


@pytest.mark.parametrize(("value", "expected"), [("8GiB", 8 * 1024**3), ("512MiB", 512 * 1024**2), ("1.5GB", 1.5e9),
                                                 (".5KiB", 512), (4096, 4096), ("2 g", 2e9)])
def test_byte_size_reads_sizes(value: Any, expected: float) -> None:
    assert byte_size(value, "--memory-limit") == int(expected)


@pytest.mark.parametrize("value", ["-1GiB", "0", "0.5", "1e3", "8XB", "9" * 40 + "TiB", "2PiB", math.nan, math.inf,
                                   True, None, [], "9" * 400])
def test_byte_size_refuses_what_is_not_a_positive_size_up_to_a_pebibyte(value: Any) -> None:
    assert _refused(byte_size, value, "--memory-limit").startswith("--memory-limit: got ")


@pytest.mark.parametrize(("value", "expected"), [("90s", 90.0), ("30m", 1800.0), ("1.5h", 5400.0), (2, 2.0)])
def test_duration_reads_durations(value: Any, expected: float) -> None:
    assert duration(value, "--max-time") == expected


@pytest.mark.parametrize("value", ["0", "-1m", "1y", "nan", "9" * 30, "400d", math.inf, True])
def test_duration_refuses_what_is_not_a_duration_up_to_a_year(value: Any) -> None:
    assert "duration above 0 and at most a year" in _refused(duration, value, "--max-time")


def test_devices_ports_and_hosts() -> None:
    assert device(" CUDA:1 ", "--device") == "cuda:1" and device("auto", "--device") == "auto"
    for bad in ("gpu", "cuda:x", "cuda:-1", "cuda:1234", "", "cpu0", None):
        assert "must be auto, cpu, cuda or cuda:N" in _refused(device, bad, "--device")
    assert "must be cpu, cuda or cuda:N" in _refused(device, "auto", "--device", auto=False)
    assert port("8080", "--port") == 8080
    for bad in ("0", "-1", "65536", "http", "80.5"):
        assert "(a TCP port)" in _refused(port, bad, "--port")
    assert host("127.0.0.1", "--host") == "127.0.0.1" and host("localhost", "--host") == "localhost"
    assert "cannot be resolved" in _refused(host, "no-such-host.invalid", "--host")
    for bad in ("", "a b", "a..b", "x\n", "é.com"):
        assert "must be a host name or an IP address" in _refused(host, bad, "--host")


def test_paths(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("x")
    assert path(str(tmp_path / "f.txt"), "--specs", kind="file", exists=True) == tmp_path / "f.txt"
    assert "no such folder" in _refused(path, str(tmp_path / "f.txt"), "--templates", kind="folder", exists=True)
    assert "control characters" in _refused(path, "a\x00b", "--input")
    assert "cannot find the home folder of '~nosuchuser_xyz'" in _refused(path, "~nosuchuser_xyz/a", "--input")


def test_storage_urls_never_show_a_password() -> None:
    assert storage_url("sqlite:///studies/a.db", "--storage") == "sqlite:///studies/a.db"
    assert storage_url("postgresql+psycopg://u:pw@db/x", "--storage").startswith("postgresql")
    for bad in ("nosuchdialect://u:secret@h/x", "not a url", "", "sqlite", "\x00"):
        message = _refused(storage_url, bad, "--storage")
        assert "must be an SQLAlchemy URL" in message and "secret" not in message


def test_typed_keys_name_the_place_of_a_bad_item() -> None:
    check = Triple(Integer(1, 4096))
    assert check([32, 32, 16], "cfg: key 'roi_size'") == [32, 32, 16]
    assert _refused(check, [32, 0, 16], "cfg: key 'roi_size'", ConfigError).startswith("cfg: key 'roi_size'[1]: got 0")
    assert "must be three whole numbers from 1 to 4096, one per axis" in _refused(check, [32, 32], "k", ConfigError)
    assert Number(0, 1)(0.25, "k") == 0.25


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_every_environment_setting_refuses_junk_naming_itself(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, "\u2603 junk \u2603")
    with pytest.raises(SpecError, match=f"^{name}: "):
        setting(name)
    monkeypatch.setenv(name, "  ")
    assert setting(name) is None


def test_environment_settings_are_read_through_their_checker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_CLAIM_STALE_SECONDS", "2.5")
    monkeypatch.setenv("AUTOTUNE_PRECISION", " FP32 ")
    monkeypatch.setenv("AUTOTUNE_TEMPLATES", str(tmp_path))
    from autotune.bundles.templates import default_templates_path
    from autotune.precision import forced_precision
    from autotune.search.storage.liveness import stale_after_default

    assert stale_after_default() == 2.5 and forced_precision() == "fp32" and default_templates_path() == tmp_path
