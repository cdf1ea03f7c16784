"""The CUDA caching allocator's setting: one value for every process of a tune and of the training it plans.

PyTorch reads ``PYTORCH_CUDA_ALLOC_CONF`` once, when a process first allocates on a GPU; with
``expandable_segments:True`` the allocator grows one segment instead of adding a segment per large
request, which changes what ``max_memory_reserved`` holds for the same tensors. A tune measures
its probes under one setting, so training must run under the same one: the memory contract is one
setting everywhere. autotune therefore never sets it on its own: the tuner's probes, the MONAI
launcher and the trainer (and their children: DDP ranks, the probes' fork-server children) inherit
the environment they were started with, the tuning block records the value the probes ran under
(``alloc_conf``), and ``autotune train`` says in one line when the value it runs under differs.
The device model (``autotune.probe.device_model``) simulates the allocator under the value in force.

Whether ``expandable_segments:True`` lowers the reserved peaks of these templates has not been
measured on a GPU yet: the first GPU run ran without it (the check's next call A measures both).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["ALLOC_CONF_ENV", "alloc_conf", "expandable_segments", "differs"]

ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"


def alloc_conf(env: Mapping[str, str] | None = None) -> str | None:
    """The allocator setting in force (``PYTORCH_CUDA_ALLOC_CONF``), stripped; None when unset or empty."""
    value = (os.environ if env is None else env).get(ALLOC_CONF_ENV)
    value = value.strip() if value else ""
    return value or None


def expandable_segments(conf: str | None) -> bool:
    """True when ``conf`` turns expandable segments on (``expandable_segments:True``, case-insensitive)."""
    for part in (conf or "").split(","):
        key, _, value = part.partition(":")
        if key.strip().lower() == "expandable_segments":
            return value.strip().lower() == "true"
    return False


def differs(tuned: str | None, now: str | None) -> bool:
    """True when two settings differ in effect (expandable segments on in one only, or other options)."""
    norm = lambda c: ",".join(sorted(p.strip().lower() for p in (c or "").split(",") if p.strip()))  # noqa: E731
    return norm(tuned) != norm(now)
