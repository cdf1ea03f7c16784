"""A small catalogue of GPUs to plan for with ``--strategy estimate --target-gpu NAME``.

Memory is each card's total as NVIDIA lists it (MiB as nvidia-smi reports a typical
board); none of these was measured on this project's machines. The CUDA allowances come
from ``autotune.probe.allowances``: a calibration measured on that card when one ships (see
``autotune.probe.calibration``), else the device model with the shipped H200 calibration's
workspace factors, marked as not measured on that card.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.errors import SpecError
from autotune.utils import look_up_option, parse_bytes

if TYPE_CHECKING:  # pragma: no cover
    from autotune.search.strategies.base import Strategy

__all__ = ["CATALOGUE", "resolve_target"]

MiB = 1024**2
# name -> (marketing name, total memory in bytes)
CATALOGUE: dict[str, tuple[str, int]] = {
    "v100-16gb": ("Tesla V100 16GB", 16384 * MiB),
    "v100-32gb": ("Tesla V100 32GB", 32768 * MiB),
    "t4": ("Tesla T4", 15360 * MiB),
    "a10": ("NVIDIA A10", 23028 * MiB),
    "l4": ("NVIDIA L4", 23034 * MiB),
    "rtx4090": ("GeForce RTX 4090", 24564 * MiB),
    "a100-40gb": ("NVIDIA A100 40GB", 40960 * MiB),
    "a100-80gb": ("NVIDIA A100 80GB", 81920 * MiB),
    "h100-80gb": ("NVIDIA H100 80GB", 81559 * MiB),
    "h200": ("NVIDIA H200", 143771 * MiB),
}


def resolve_target(
    strategy: str | Strategy, target_gpu: str | None, target_memory: str | None, device: str
) -> dict[str, Any] | None:
    """The target of an estimate-only plan, or None when planning for ``device`` itself.

    Raises:
        SpecError: a target without ``--strategy estimate`` (a strategy that probes), an unknown
            strategy or card (the valid names are listed), both options at once, or a bad size.
    """
    from autotune.search.strategies.registry import strategy_of

    if not strategy_of(strategy).estimates_only:
        if target_gpu or target_memory:
            raise SpecError("--target-gpu/--target-memory plan without probes: add --strategy estimate")
        return None
    if target_gpu and target_memory:
        raise SpecError("give --target-gpu or --target-memory, not both")
    if not target_gpu and not target_memory:
        return None
    if target_gpu:
        key = look_up_option(target_gpu.lower(), list(CATALOGUE), "target GPU", SpecError)
        name, total = CATALOGUE[key]
    else:
        key, total = "custom", parse_bytes(target_memory or "", "--target-memory")
        name = f"GPU with {target_memory}"
    from dataclasses import asdict

    from autotune.probe import allowance_for, default_allowance

    allowance = allowance_for("cuda:0", gpu_name=name) if key != "custom" else default_allowance()
    return {"catalogue": key, "name": name, "memory": total, "allowances": asdict(allowance), "device": "cuda:0"}
