"""Faults injected into the probe's child on purpose, to test how each ending is recorded.

``AUTOTUNE_PROBE_FAULT`` holds comma-separated rules ``fault`` or
``fault@key=value[&key=value]``: out of memory, a segfault, a SIGKILL, a hang, or a plain
exception, when the trial's settings (and ``phase``) match. The runner checks the rules
before it starts a child (``parse_fault_rules``); the child fires them (``inject_fault``).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from typing import Any

__all__ = ["FAULT_ENV", "FAULTS", "parse_fault_rules", "inject_fault"]

FAULT_ENV = "AUTOTUNE_PROBE_FAULT"
FAULTS = ("oom", "segfault", "sigkill", "hang", "raise")


def parse_fault_rules(spec: str | None) -> list[tuple[str, dict[str, str]]]:
    """Parse ``AUTOTUNE_PROBE_FAULT``: comma-separated rules ``fault`` or ``fault@key=value[&key=value]``.

    Raises:
        ValueError: an unknown fault name or a condition without ``=``.
    """
    rules: list[tuple[str, dict[str, str]]] = []
    for raw in (spec or "").split(","):
        raw = raw.strip()
        if not raw:
            continue
        fault, _, cond_text = raw.partition("@")
        fault = fault.strip()
        if fault not in FAULTS:
            raise ValueError(f"{FAULT_ENV}: unknown fault {fault!r}; valid: {', '.join(FAULTS)}")
        conditions: dict[str, str] = {}
        for cond in filter(None, (c.strip() for c in cond_text.split("&"))):
            key, sep, value = cond.partition("=")
            if not sep:
                raise ValueError(f"{FAULT_ENV}: condition {cond!r} must be key=value")
            conditions[key.strip()] = value.strip()
        rules.append((fault, conditions))
    return rules


def inject_fault(rules: list[tuple[str, dict[str, str]]], context: Mapping[str, Any], phase: str | None) -> None:
    """Fire the first matching rule. With ``phase`` None (before the build and the heavy imports)
    only rules without a ``phase`` condition are checked; at a phase's start only rules naming it."""
    for fault, conditions in rules:
        if ("phase" in conditions) != (phase is not None):
            continue
        if all(str({**context, "phase": phase}.get(key)) == value for key, value in conditions.items()):
            if fault == "oom":
                import torch

                raise torch.OutOfMemoryError("injected fault: out of memory")
            if fault == "raise":
                raise ValueError("injected fault: raise")
            if fault == "segfault":
                os.kill(os.getpid(), signal.SIGSEGV)
            if fault == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            while True:  # "hang", and a fallback should a signal above be caught
                time.sleep(3600)
