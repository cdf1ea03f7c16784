"""The lean tensor tracker (``autotune.probe.tracker``): counting, frees, growth, the limit, fake tensors.

The tracker leans on two PyTorch internals; the first tests pin them, so an upgrade that
changes them fails here rather than giving wrong peaks.
"""

from __future__ import annotations

import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

from autotune.probe.memory import round_up
from autotune.probe.tracker import MemoryTracker, tensors_of


def test_storage_python_object_is_preserved_until_freed() -> None:
    x = torch.empty(1000)
    view = x.view(10, 100)
    storage = x.untyped_storage()
    assert view.untyped_storage() is storage  # views share one preserved storage object
    fired: list[int] = []
    ref = weakref.ref(storage, lambda _r: fired.append(1))
    del storage, x
    assert not fired  # the view keeps the storage alive
    del view
    assert fired and ref() is None


def test_dispatch_mode_sees_backward_ops() -> None:
    param = torch.zeros(1000, requires_grad=True)
    tracker = MemoryTracker()
    tracker.track([param])
    with tracker:
        loss = (param * 2).sum()
        loss.backward()
    # param 4096 and, in backward, the gradient 4096 plus the scalar seed 512 at least
    assert tracker.peak_bytes >= 4096 * 2 + 512
    grad_key = id(param.grad.untyped_storage())
    assert grad_key in tracker._live  # the gradient was allocated inside backward and counted
    tracker.stop()


def test_tracker_accounting_known_pattern() -> None:
    existing = torch.empty(256)  # 1024 bytes -> 1024
    tracker = MemoryTracker()
    assert tracker.track([existing, existing.view(16, 16)]) == 1024  # counted once
    with tracker:
        a = torch.empty(1000)  # 4000 -> 4096
        b = torch.empty(10)  # 40 -> 512
        a_view = a[10:20]  # a view allocates nothing
        assert tracker.current_bytes == 1024 + 4096 + 512
        del a  # the view keeps the storage
        assert tracker.current_bytes == 1024 + 4096 + 512
        del a_view
        assert tracker.current_bytes == 1024 + 512
        c = torch.zeros(2000, dtype=torch.float16)  # 4000 -> 4096
        c.add_(1)  # in place: nothing new
        empty = torch.empty(0)  # 0 bytes
    assert tracker.current_bytes == 1024 + 512 + 4096
    assert tracker.peak_bytes == 1024 + 4096 + 512
    tracker.reset_peak()
    assert tracker.peak_bytes == tracker.current_bytes
    tracker.stop()
    del b, c, empty
    assert tracker.current_bytes == 1024 + 512 + 4096  # frees after stop() are not counted


def test_tracker_counts_storage_growth() -> None:
    tracker = MemoryTracker()
    with tracker:
        out = torch.empty(0)
        torch.add(torch.zeros(0), 1, out=out)
        before = tracker.current_bytes
        torch.ones(1000, out=out)  # out= resizes the storage to 4000 bytes
    assert tracker.current_bytes - before >= 4096 - 512
    tracker.stop()


def test_tracker_limit_raises_at_the_crossing_op() -> None:
    tracker = MemoryTracker(limit_bytes=10_000)
    kept = []
    with pytest.raises(torch.OutOfMemoryError, match="exceeds the memory limit"):
        with tracker:
            for _ in range(10):
                kept.append(torch.empty(1024))  # 4096 each: the third crosses 10 000
    assert len(kept) == 2
    assert tracker.peak_bytes == 3 * 4096
    tracker.stop()


def test_tracker_device_filter_and_fake_tensors() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    tracker = MemoryTracker("cpu")
    with FakeTensorMode():
        with tracker:
            on_cpu = torch.empty(1000)  # fake, counted: 4096
            on_meta = torch.empty(10_000, device="meta")  # other device: ignored
            assert on_cpu.untyped_storage().nbytes() == 4000
    assert tracker.peak_bytes == 4096
    del on_cpu, on_meta
    assert tracker.current_bytes == 0
    tracker.stop()


def test_round_up_and_tensors_of() -> None:
    assert round_up(0) == 0
    assert round_up(1) == 512
    assert round_up(512) == 512
    assert round_up(513) == 1024
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    found = tensors_of(model, optimizer, [torch.ones(1)], {"x": torch.ones(2)})
    # weight, bias, their grads, two momentum buffers, two inputs
    assert len(found) == 8


def test_set_reserved_counts_held_bytes_and_stops_at_the_limit() -> None:
    tracker = MemoryTracker(limit_bytes=10_000)
    assert tracker.set_reserved(4000) == 4096  # rounded up as a storage is
    assert tracker.set_reserved(1000) == 1024  # replaces the previous reservation
    with pytest.raises(torch.OutOfMemoryError, match="exceeds the memory limit"):
        tracker.set_reserved(20_000)
    assert tracker.peak_bytes == round_up(20_000)


def test_only_the_tracker_fake_session_and_preload_import_torch_when_imported() -> None:
    """The tracker and the fake session import torch at their top, so they are only imported lazily;
    every other probe module, and every name ``autotune.probe`` offers but the tracker's, must load
    without torch (``autotune --help`` stays instant). The tracker's names load it on first use."""
    probe = Path(__file__).resolve().parents[2] / "autotune" / "probe"
    names = sorted(f"autotune.probe.{p.stem}" for p in probe.glob("*.py")
                   if p.stem not in ("tracker", "fake", "preload", "__init__"))
    code = (f"import sys, importlib\nfor name in {names!r}:\n    importlib.import_module(name)\n"
            "import autotune.probe as probe\n"
            "eager = [getattr(probe, n) for n in probe.__all__ if n not in ('MemoryTracker', 'tensors_of')]\n"
            "print(sorted(m for m in ('torch', 'monai', 'numpy') if m in sys.modules))\n"
            "print(probe.MemoryTracker.__module__, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["[]", "autotune.probe.tracker True"]
