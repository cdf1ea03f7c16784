"""Imported once by the probe fork server (``autotune.probe.isolation``): everything a probe
imports, so each forked child starts with it loaded. Nothing here may initialise CUDA or
start threads: a child forked after either would inherit a broken state."""

from __future__ import annotations

import monai  # noqa: F401
import monai.inferers  # noqa: F401
import monai.losses  # noqa: F401
import monai.networks.nets  # noqa: F401
import monai.optimizers  # noqa: F401
import torch  # noqa: F401
import torch._dynamo  # noqa: F401  (building an optimizer imports it, and sympy: ~3 s a child otherwise)

import autotune.build  # noqa: F401
import autotune.bundles.model  # noqa: F401  (the child parses its request's config: pydantic)
import autotune.probe.memory  # noqa: F401
import autotune.probe.tracker  # noqa: F401
import autotune.probe.trial  # noqa: F401
import autotune.step  # noqa: F401

