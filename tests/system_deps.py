"""Tests that need a system package (PostgreSQL, headless Chromium) skip where it is missing,
with the reason, and FAIL instead when ``AUTOTUNE_REQUIRE_SYSTEM_DEPS`` is set (``.ci/run``
sets it: a CI run must not pass by skipping them). ``AUTOTUNE_REQUIRE_POSTGRES``, the older
switch, still makes the PostgreSQL tests required.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

__all__ = ["REQUIRE_ENV", "required", "unavailable"]

REQUIRE_ENV = "AUTOTUNE_REQUIRE_SYSTEM_DEPS"


def required(*also: str) -> bool:
    """True when ``AUTOTUNE_REQUIRE_SYSTEM_DEPS`` (or one of the variables ``also``) is set to
    something other than empty or ``0``."""
    return any(os.environ.get(name, "") not in ("", "0") for name in (REQUIRE_ENV, *also))


def unavailable(what: str, reason: str, *also: str) -> NoReturn:
    """Skip the test because ``what`` is missing, or fail it when the system dependencies are required.

    Args:
        what: the missing thing, e.g. "PostgreSQL test server".
        reason: why it is missing and how to get it.
        also: further environment variables that make it required (besides ``REQUIRE_ENV``).
    """
    message = f"{what} unavailable: {reason}"
    if required(*also):
        names = " or ".join((REQUIRE_ENV, *also))
        pytest.fail(f"{message} ({names} is set: this test must run here)", pytrace=False)
    pytest.skip(message)
