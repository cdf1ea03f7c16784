"""The one place for device facts: which device ``--device`` means, its name, its memory, host RAM.

``auto`` (every command's default) is the first visible GPU, ``cuda:0``, when there is
one, else ``cpu``. A GPU's total memory is torch's figure (``get_device_properties``):
the allocator's memory fraction is a fraction of it, and the tuning key records it.
NVML (optional, ``pynvml``) answers what CUDA cannot: memory in use by every process,
read without creating a CUDA context. torch is imported only inside the functions.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "AUTO",
    "resolve_device",
    "check_device",
    "device_info",
    "device_name",
    "gpu_name",
    "device_total_memory",
    "total_ram_bytes",
    "available_ram_bytes",
    "proc_field_bytes",
    "nvml_handle",
    "nvml_used_bytes",
]

AUTO = "auto"


def resolve_device(name: str | None) -> str:
    """``cpu``, ``cuda`` or ``cuda:N`` unchanged; ``auto`` or None: ``cuda:0`` if a GPU is visible, else ``cpu``."""
    if name not in (None, "", AUTO):
        return str(name)
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def check_device(device: str, local_rank: int = 0, distributed: bool = False) -> str:
    """``cpu`` or ``cuda:N`` for a ``--device`` value, checked against what is visible (with
    ``distributed``, the GPU of ``local_rank``: one GPU per local rank).

    Raises:
        SpecError: not cpu/cuda/cuda:N, CUDA not available, or no such GPU.
    """
    from autotune.errors import SpecError

    kind = str(device).split(":")[0]
    if kind not in ("cpu", "cuda"):
        raise SpecError(f"--device {device!r}: give cpu, cuda or cuda:N")
    if kind == "cpu":
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        raise SpecError(f"--device {device!r}: CUDA is not available here; use --device cpu")
    index = local_rank if distributed else (int(str(device).split(":")[1]) if ":" in str(device) else 0)
    if index >= torch.cuda.device_count():
        raise SpecError(f"--device {device!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
    return f"cuda:{index}"


def device_info(device: str) -> dict[str, Any]:
    """``device`` (``cpu`` or ``cuda:N``, the index made explicit), ``device_name`` and
    ``device_total_memory`` (bytes): the device facts a tuning key records.

    Raises:
        SpecError: a CUDA device where CUDA is not available.
    """
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            from autotune.errors import SpecError

            raise SpecError(f"device {device!r}: CUDA is not available here; use --device cpu")
        index = dev.index or 0
        return {"device": f"cuda:{index}", "device_name": str(torch.cuda.get_device_name(index)),
                "device_total_memory": device_total_memory(f"cuda:{index}")}
    return {"device": "cpu", "device_name": "cpu", "device_total_memory": int(total_ram_bytes() or 0)}


def gpu_name(device: str) -> str | None:
    """The name of the visible GPU ``device`` names; None on the CPU or where no GPU is visible."""
    if not str(device).startswith("cuda"):
        return None
    import torch

    try:
        if torch.cuda.is_available():
            return str(torch.cuda.get_device_name(torch.device(device)))
    except (RuntimeError, AssertionError, ValueError):
        pass
    return None


def device_name(device: str) -> str:
    """A readable name of ``device``: the GPU's name, or the CPU model."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return str(torch.cuda.get_device_name(dev))
    return _cpu_name()


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "cpu"


def device_total_memory(device: str) -> int | None:
    """Total memory of ``device``, bytes: torch's figure for a GPU, physical RAM for the CPU."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return total_ram_bytes()
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    return int(torch.cuda.get_device_properties(index).total_memory)


def total_ram_bytes() -> int | None:
    """Physical memory of this machine, bytes (None if unknown)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def available_ram_bytes() -> int:
    """Available RAM (``MemAvailable`` on Linux; total physical memory elsewhere; 0 if unknown)."""
    available = proc_field_bytes("/proc/meminfo", "MemAvailable")
    return available if available is not None else int(total_ram_bytes() or 0)


def proc_field_bytes(path: str, key: str) -> int | None:
    """A ``key:  123 kB`` line of a Linux ``/proc`` file (``/proc/meminfo``, ``/proc/self/status``)
    in bytes; None where the file or the line is missing."""
    try:
        with open(path, encoding="ascii") as handle:
            for line in handle:
                if line.startswith(f"{key}:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def nvml_handle(pynvml: Any, index: int, uuid: str | None = None) -> Any:
    """NVML's handle of CUDA device ``index``. NVML numbers GPUs physically and CUDA_VISIBLE_DEVICES
    may renumber them: the GPU whose UUID contains ``uuid`` when given (torch's
    ``get_device_properties(index).uuid``), else ``index`` mapped through CUDA_VISIBLE_DEVICES when
    it lists indices. Needs ``pynvml.nvmlInit()`` first; raises what NVML raises."""
    if uuid is not None:
        for i in range(pynvml.nvmlDeviceGetCount()):
            candidate = pynvml.nvmlDeviceGetHandleByIndex(i)
            if str(uuid) in str(pynvml.nvmlDeviceGetUUID(candidate)):
                return candidate
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    physical = int(visible[index]) if index < len(visible) and visible[index].isdigit() else index
    return pynvml.nvmlDeviceGetHandleByIndex(physical)


def nvml_used_bytes(device: str) -> int | None:
    """Memory in use on CUDA ``device`` as NVML sees it (all processes, the CUDA context included);
    None on the CPU or where NVML is not available. Does not create a CUDA context."""
    if not str(device).startswith("cuda"):
        return None
    index = int(str(device).split(":")[1]) if ":" in str(device) else 0
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(nvml_handle(pynvml, index)).used)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - NVML is optional
        return None
