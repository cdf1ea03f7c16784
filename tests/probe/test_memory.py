"""OOM classification, peak RSS, the CUDA allocator's peaks and limit, and the CUDA allowance helpers
(the tensor tracker's tests are in ``test_tracker.py``)."""

from __future__ import annotations

import pytest
import torch

from autotune import device
from autotune.probe import memory
from autotune.probe.allowances import NO_ALLOWANCE, CudaAllowance, allowance_for, apply_allowance


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (torch.OutOfMemoryError("anything at all"), True),  # the type decides
        (MemoryError(), True),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"), True),
        (RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 8 bytes"), True),
        (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), True),
        (RuntimeError("CUDA error: out of memory"), True),
        (RuntimeError("Given groups=1, weight of size [8, 1, 3, 3, 3], expected input to have 1 channels"), False),
        (ValueError("out of memory"), False),  # not an allocator failure, whatever it says
        (KeyError("oom"), False),
    ],
)
def test_is_oom_error(exc: BaseException, expected: bool) -> None:
    assert memory.is_oom_error(exc) is expected


def test_rss_and_device_facts() -> None:
    memory.reset_peak_rss()
    assert memory.peak_rss_bytes() > 10 * 1024**2
    assert device.total_ram_bytes() and device.total_ram_bytes() > memory.peak_rss_bytes()
    assert device.device_total_memory("cpu") == device.total_ram_bytes()
    assert device.device_info("cpu") == {"device": "cpu", "device_name": "cpu",
                                         "device_total_memory": device.total_ram_bytes()}
    assert device.device_name("cpu") and device.gpu_name("cpu") is None and device.nvml_used_bytes("cpu") is None
    assert 0 < device.available_ram_bytes() <= device.total_ram_bytes()


def test_proc_field_bytes_reads_kib_lines(tmp_path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t  2048 kB\nVmRSS:\t1024 kB\n", encoding="ascii")
    assert device.proc_field_bytes(str(status), "VmHWM") == 2048 * 1024
    assert device.proc_field_bytes(str(status), "VmSwap") is None
    assert device.proc_field_bytes(str(tmp_path / "missing"), "VmHWM") is None


def test_nvml_handle_maps_cuda_indices_to_physical_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    uuids = ["GPU-aaaa", "GPU-bbbb", "GPU-cccc"]
    nvml = SimpleNamespace(nvmlDeviceGetCount=lambda: 3, nvmlDeviceGetHandleByIndex=lambda i: f"handle{i}",
                           nvmlDeviceGetUUID=lambda handle: uuids[int(handle[-1])])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert device.nvml_handle(nvml, 0) == "handle2" and device.nvml_handle(nvml, 1) == "handle0"
    assert device.nvml_handle(nvml, 0, uuid="bbbb") == "handle1", "a UUID wins over the index"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb")
    assert device.nvml_handle(nvml, 0) == "handle0", "UUIDs in CUDA_VISIBLE_DEVICES: no index mapping"


def test_apply_allowance() -> None:
    allowance = CudaAllowance(context_bytes=1000, cudnn_workspace_bytes=100, allocator_slack_fraction=0.5)
    assert apply_allowance(2000, allowance) == 2000 * 1.5 + 100 + 1000
    assert apply_allowance(2000, allowance, include_context=False) == 2000 * 1.5 + 100
    assert apply_allowance(12345, NO_ALLOWANCE) == 12345
    assert allowance_for("cpu") == NO_ALLOWANCE
    assert allowance_for("cuda:1").context_bytes > 0
    with pytest.raises(ValueError):
        apply_allowance(-1, allowance)


def test_cuda_helpers_with_a_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA helpers are the CPU code with the device swapped: check that each asks the device it
    was given, in the right order, and computes the fraction from that device's memory.

    The stand-ins answer per device (cuda:1 and cuda:2 differ), so a helper that read another
    device, swapped reserved and allocated, or skipped the synchronise would fail here.
    """
    from collections.abc import Callable
    from types import SimpleNamespace

    totals = {1: 80 * 2**30, 2: 16 * 2**30}
    reserved = {"cuda:1": 3 * 2**30, "cuda:2": 5 * 2**30}
    allocated = {"cuda:1": 2 * 2**30, "cuda:2": 4 * 2**30}
    calls: list[tuple[str, object]] = []

    def properties(dev: torch.device | int) -> SimpleNamespace:
        index = dev if isinstance(dev, int) else torch.device(dev).index  # torch takes either
        calls.append(("properties", f"cuda:{index}"))
        return SimpleNamespace(total_memory=totals[index])

    def peak(table: dict[str, int], name: str) -> Callable[..., int]:
        def read(dev: object = None) -> int:
            calls.append((name, str(dev)))
            return table[str(dev)]
        return read

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, dev: calls.append(("fraction", (fraction, str(dev)))))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda dev=None: calls.append(("sync", str(dev))))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda dev=None: calls.append(("reset", str(dev))))
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", peak(reserved, "reserved"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", peak(allocated, "allocated"))

    assert memory.cuda_set_memory_limit("cuda:1", 40 * 2**30) == 0.5
    assert memory.cuda_set_memory_limit("cuda:2", 4 * 2**30) == 0.25  # the same limit is a share of *its* card
    assert memory.cuda_set_memory_limit("cuda:2", 100 * 2**30) == 1.0  # never more than the device
    assert calls == [("properties", "cuda:1"), ("fraction", (0.5, "cuda:1")),
                     ("properties", "cuda:2"), ("fraction", (0.25, "cuda:2")),
                     ("properties", "cuda:2"), ("fraction", (1.0, "cuda:2"))]

    calls.clear()
    memory.cuda_reset_peaks("cuda:2")
    assert calls == [("sync", "cuda:2"), ("reset", "cuda:2")], "synchronise first, then reset that device"
    calls.clear()
    assert memory.cuda_peaks("cuda:2") == {"cuda_max_memory_reserved": 5 * 2**30,
                                           "cuda_max_memory_allocated": 4 * 2**30}
    assert calls[0] == ("sync", "cuda:2"), "pending kernels finish before the peaks are read"
    assert sorted(calls[1:]) == [("allocated", "cuda:2"), ("reserved", "cuda:2")]


def test_peak_rss_rises_with_an_allocation_and_resets() -> None:
    """``peak_rss_bytes`` sees a 256 MiB allocation, and ``reset_peak_rss`` forgets it once freed
    (the probe resets before each phase so that each phase reports its own peak)."""
    if not memory.reset_peak_rss():
        pytest.skip("/proc/self/clear_refs cannot be written here: the peak cannot be reset")
    size = 256 * 2**20
    before = memory.peak_rss_bytes()
    block = b"\x01" * size  # written, so resident
    with_block = memory.peak_rss_bytes()
    del block
    assert with_block - before >= 0.9 * size, (before, with_block)
    assert memory.reset_peak_rss()
    after_reset = memory.peak_rss_bytes()
    assert after_reset <= with_block - 0.5 * size, (with_block, after_reset)
