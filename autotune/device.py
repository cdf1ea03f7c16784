"""The one place that turns a ``--device`` value into a device name.

``auto`` (every command's default) is the first visible GPU, ``cuda:0``, when there is
one, else ``cpu``. torch is imported only to answer ``auto``.
"""

from __future__ import annotations

__all__ = ["AUTO", "resolve_device"]

AUTO = "auto"


def resolve_device(name: str | None) -> str:
    """``cpu``, ``cuda`` or ``cuda:N`` unchanged; ``auto`` or None: ``cuda:0`` if a GPU is visible, else ``cpu``."""
    if name not in (None, "", AUTO):
        return str(name)
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"
