"""The ``AUTOTUNE_*`` environment settings: each one's name, checker and meaning, in one table.

Every module that reads a setting reads it through ``setting(name)``, which checks the text
the same way each time; the command line checks them all once at its start
(``check_environment``), so a bad value is one line naming the variable before any work.
docs/cli.md lists the same settings.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autotune.checks.fake_probe import parse_fake_probe
from autotune.checks.places import path, storage_url
from autotune.checks.values import choice, flag, integer, number
from autotune.errors import SpecError

__all__ = ["Setting", "SETTINGS", "setting", "check_environment"]


@dataclass(frozen=True)
class Setting:
    """One environment setting: ``check(text, where)`` returns its value or raises ``SpecError``."""

    name: str
    check: Callable[[str, str], Any]
    meaning: str


def _one_of(*valid: str) -> Callable[[str, str], str]:
    return lambda raw, where: choice(raw, valid, "value", SpecError, where=where, fold_case=True)


def _seconds(low: float, low_open: bool) -> Callable[[str, str], float]:
    return lambda raw, where: number(raw, where, low=low, low_open=low_open, error=SpecError, unit="seconds")


def _folder(raw: str, where: str) -> Any:
    return path(raw, where, kind="folder", exists=True, error=SpecError).resolve()


def _pool(raw: str, where: str) -> int | str:
    if raw.strip().lower() == "none":
        return "none"
    return integer(raw, where, low=1, high=10_000, error=SpecError, unit="connections, or none")


SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("AUTOTUNE_STORAGE", lambda raw, where: storage_url(raw, where, error=SpecError),
            "the Optuna storage URL when --storage is not given"),
    Setting("AUTOTUNE_PRECISION", _one_of("auto", "fp32", "bf16", "fp16"), "the same as --precision"),
    Setting("AUTOTUNE_CPU_BF16", _one_of("native", "emulated"), "replaces the CPU's bf16 capability check"),
    Setting("AUTOTUNE_TEMPLATES", _folder, "a folder of <algo>/template.yaml used instead of the shipped ones"),
    Setting("AUTOTUNE_CALIBRATION_DIR", _folder, "where per-GPU calibrations are read first"),
    Setting("AUTOTUNE_CLAIM_STALE_SECONDS", _seconds(0.0, True), "the grace after which a silent worker is not live"),
    Setting("AUTOTUNE_STORAGE_RETRY_SECONDS", _seconds(0.0, False),
            "how long a call to a database server that has gone away is retried"),
    Setting("AUTOTUNE_STORAGE_POOL", _pool,
            "database connections a process keeps: a number N (at most N at once) or none (one per call)"),
    Setting("AUTOTUNE_PROBE_EDGE", lambda raw, where: flag(raw, where, error=SpecError, words=True),
            "probe N+1 above every measured fit"),
    Setting("AUTOTUNE_PROBE_ISOLATION", _one_of("forkserver", "subprocess"), "how probe children are started"),
    Setting("AUTOTUNE_FAKE_PROBE", parse_fake_probe,
            "test hook: every probe sleeps, then answers from a synthetic model (no device)"),
)}


def setting(name: str) -> Any:
    """The checked value of environment setting ``name``; None when it is unset or blank.

    Raises:
        SpecError: the variable holds a value its checker refuses (the message names the variable).
    """
    raw = os.environ.get(name, "")
    if not raw.strip():
        return None
    return SETTINGS[name].check(raw.strip(), name)


def check_environment() -> None:
    """Check every setting that is set (the command line's first step).

    Raises:
        SpecError: the first setting whose value is refused.
    """
    for name in SETTINGS:
        setting(name)
