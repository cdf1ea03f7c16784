"""Profiling and records: NVTX ranges, the NVML sampler, metrics.csv/.json and curves.png.

NVTX ranges (``data``, ``forward``, ``loss``, ``backward``, ``optimizer``) are placed with
hooks on the model, the loss and the optimizer, so the training step itself stays the
shared ``autotune.step.train_step`` that the probe measures. Without CUDA they cost nothing.
"""

from __future__ import annotations

import csv
import io
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from autotune.files import atomic_write_bytes, atomic_write_json, atomic_write_text

__all__ = ["NvtxRanges", "GpuMonitor", "MetricsLog", "plot_curves", "start_line", "epoch_line", "fmt", "BASE_COLUMNS"]

log = logging.getLogger(__name__)

BASE_COLUMNS = (
    "epoch", "loss", "mean_dice", "epoch_s", "train_s", "data_wait_s", "data_wait_share",
    "samples", "samples_per_s", "lr", "nonfinite_steps", "val_s", "elapsed_s", "world_size", "rank_samples",
    "train_peak_bytes", "train_peak_allocated_bytes", "val_peak_bytes", "val_peak_allocated_bytes",
    "micro_batches", "sw_batch", "validation_device",
)


class NvtxRanges:
    """NVTX ranges for the training step, or a recorder of their names (tests), or nothing.

    Args:
        enabled: emit ranges (only meaningful on CUDA).
        record: keep the names of the ranges opened, in order (``self.opened``).
    """

    def __init__(self, enabled: bool, record: bool = False) -> None:
        self.enabled = enabled or record
        self.record = record
        self.opened: list[str] = []
        self._handles: list[Any] = []
        self._open: dict[str, int] = {}
        self._start: Callable[[str], int] | None = None
        self._end: Callable[[int], None] | None = None
        if enabled:
            import torch

            # range_start/range_end are not tied to a thread, unlike push/pop: backward may
            # run in autograd's device threads.
            self._start, self._end = torch.cuda.nvtx.range_start, torch.cuda.nvtx.range_end

    def start(self, name: str) -> None:
        """Open range ``name`` (closing one of the same name left open)."""
        if not self.enabled:
            return
        self.end(name)
        if self.record:
            self.opened.append(name)
        self._open[name] = self._start(name) if self._start is not None else 0

    def end(self, name: str) -> None:
        """Close range ``name`` if it is open."""
        range_id = self._open.pop(name, None)
        if range_id is not None and self._end is not None:
            self._end(range_id)

    @contextmanager
    def range(self, name: str) -> Iterator[None]:
        """``with ranges.range("data"): ...``"""
        self.start(name)
        try:
            yield
        finally:
            self.end(name)

    def attach(self, model: Any, optimizer: Any) -> None:
        """Hook ``forward`` on the model and ``optimizer`` on the optimizer's step."""
        if not self.enabled:
            return
        self._handles += [
            model.register_forward_pre_hook(lambda *_: (self.end("backward"), self.start("forward"))[0]),
            model.register_forward_hook(lambda *_: self.end("forward")),
            optimizer.register_step_pre_hook(lambda *_: (self.end("backward"), self.start("optimizer"))[0]),
            optimizer.register_step_post_hook(lambda *_: self.end("optimizer")),
        ]

    def wrap_loss(self, loss_fn: Callable[..., Any]) -> Callable[..., Any]:
        """The loss inside a ``loss`` range; its gradient hook opens ``backward`` when backward starts."""
        if not self.enabled:
            return loss_fn

        def traced(*args: Any, **kwargs: Any) -> Any:
            with self.range("loss"):
                loss = loss_fn(*args, **kwargs)
            if getattr(loss, "requires_grad", False):
                loss.register_hook(lambda grad: (self.start("backward"), grad)[1])
            return loss

        return traced

    def detach(self) -> None:
        """Remove the hooks and close what is open."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for name in list(self._open):
            self.end(name)


class GpuMonitor:
    """A thread sampling GPU utilisation and memory with NVML into ``gpu_monitor.csv``.

    A no-op when ``device`` is not CUDA or NVML cannot be used (the reason is logged).
    """

    def __init__(self, path: Path, device: str, interval_s: float = 1.0) -> None:
        self.path = Path(path)
        self.device = str(device)
        self.interval_s = max(0.05, float(interval_s))
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> GpuMonitor:
        """Start sampling (returns self)."""
        if not self.device.startswith("cuda"):
            return self
        try:
            import pynvml
            import torch

            from autotune.device import nvml_handle

            pynvml.nvmlInit()
            index = torch.device(self.device).index or 0
            handle = nvml_handle(pynvml, index, uuid=str(torch.cuda.get_device_properties(index).uuid))
        except Exception as exc:  # noqa: BLE001 - monitoring is optional
            log.warning("GPU monitor off: NVML not usable (%s)", exc)
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, args=(pynvml, handle), name="gpu-monitor", daemon=True)
        self._thread.start()
        return self

    def _run(self, pynvml: Any, handle: Any) -> None:
        try:
            self._sample(pynvml, handle)
        except OSError as exc:  # a full disk ends the samples, not the training (the CSV is a running log)
            log.warning("GPU monitor stopped: cannot write %s (%s)", self.path, exc)

    def _sample(self, pynvml: Any, handle: Any) -> None:
        t0 = time.monotonic()
        with open(self.path, "w", newline="", encoding="utf-8") as handle_csv:
            writer = csv.writer(handle_csv)
            writer.writerow(["time_s", "gpu_util_pct", "mem_util_pct", "mem_used_bytes", "mem_total_bytes"])
            while not self._stop.is_set():
                try:
                    util = pynvml.nvmlDeviceGetUtilizationRates(handle)
                    mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
                except Exception as exc:  # noqa: BLE001
                    log.warning("GPU monitor stopped: %s", exc)
                    return
                writer.writerow([f"{time.monotonic() - t0:.2f}", util.gpu, util.memory, mem.used, mem.total])
                handle_csv.flush()
                self.samples += 1
                self._stop.wait(self.interval_s)

    def stop(self) -> None:
        """Stop sampling and close the file."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


class MetricsLog:
    """Per-epoch records, rewritten atomically as ``metrics.csv`` and ``metrics.json`` after each epoch."""

    def __init__(self, folder: Path, class_names: Sequence[str], enabled: bool = True) -> None:
        self.folder = Path(folder)
        self.dice_columns = [f"dice_{name}" for name in class_names]
        self.columns = [*BASE_COLUMNS[:2], *self.dice_columns, *BASE_COLUMNS[2:]]
        self.rows: list[dict[str, Any]] = []
        self.enabled = enabled

    def load(self, up_to_epoch: int) -> None:
        """Take the rows of an earlier run (for ``--resume``), keeping epochs <= ``up_to_epoch``."""
        import json

        path = self.folder / "metrics.json"
        if path.is_file():
            rows = json.loads(path.read_text(encoding="utf-8")).get("rows", [])
            self.rows = [r for r in rows if int(r.get("epoch", 0)) <= up_to_epoch]

    def add(self, row: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> None:
        """Append ``row`` and rewrite the files (``extra`` goes to the JSON's top level)."""
        self.rows.append(dict(row))
        if self.enabled:
            self.write(extra or {})

    def write(self, extra: Mapping[str, Any]) -> None:
        """Write metrics.csv and metrics.json."""
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=self.columns, extrasaction="ignore")
        writer.writeheader()
        for row in self.rows:
            writer.writerow({k: _csv_value(row.get(k)) for k in self.columns})
        atomic_write_text(self.folder / "metrics.csv", buffer.getvalue(), what="the metrics")
        atomic_write_json(self.folder / "metrics.json", {"columns": self.columns, **extra, "rows": self.rows},
                          what="the metrics")


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return value


def plot_curves(rows: Sequence[Mapping[str, Any]], path: Path, title: str = "") -> Path | None:
    """Draw loss, validation Dice and epoch time per epoch into ``path`` (PNG, Agg backend)."""
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [r["epoch"] for r in rows]
    validated = [r for r in rows if r.get("mean_dice") is not None]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    # fixed margins: tight_layout would measure every label first and doubles the drawing time
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.14, top=0.8 if title else 0.88, wspace=0.2)
    axes[0].plot(epochs, [r["loss"] for r in rows], marker=".")
    axes[0].set(title="training loss", xlabel="epoch")
    for key in [k for k in (validated or rows)[-1] if k.startswith("dice_")]:
        axes[1].plot([r["epoch"] for r in validated], [r.get(key) for r in validated], marker=".", label=key[5:])
    axes[1].plot([r["epoch"] for r in validated], [r["mean_dice"] for r in validated], "k-", marker="o",
                 label="mean")
    axes[1].set(title="validation Dice", xlabel="epoch", ylim=(0, 1))
    axes[1].legend(fontsize="small")
    axes[2].plot(epochs, [r["epoch_s"] for r in rows], marker=".", label="epoch")
    axes[2].plot(epochs, [r["data_wait_s"] for r in rows], marker=".", label="waiting for data")
    axes[2].set(title="seconds", xlabel="epoch")
    axes[2].legend(fontsize="small")
    if title:
        fig.suptitle(title)
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=90)
    plt.close(fig)
    return atomic_write_bytes(path, image.getvalue(), what="the training curves")


def fmt(value: float | None, digits: int = 4) -> str:
    """``value`` with ``digits`` decimals, ``-`` for None."""
    return "-" if value is None else f"{value:.{digits}f}"


def start_line(mode: str, ctx: Any, data: Any, precision_line: str, lr: float, schedule: str = "") -> str:
    """The line printed before the first epoch: mode, device, split, cache, loader, precision, steps, rate,
    and how the schedule's length is set (``ctx``: the run's ``DistContext``; ``data``: its
    ``autotune.trainer.setup.DataSetup``)."""
    opts, plan = data.opts, data.plan
    return (f"{mode} mode on {ctx.device} x{ctx.world_size}: {data.split_note}; cache {opts.cache_place()}"
            f"{' (' + opts.cache_note + ')' if opts.cache_note else ''}, "
            f"{opts.loader_name()}, "
            f"{precision_line}, {plan.steps_per_epoch} steps/epoch of {plan.batch} patches, lr {lr:.3g}"
            f"{f' (ramp over {plan.warmup_steps} steps)' if plan.warmup_steps else ''}"
            f"{'; ' + schedule if schedule else ''}")


def epoch_line(row: Mapping[str, Any], total: int, best: float | None, best_epoch: int) -> str:
    """The one-line summary printed after each epoch."""
    dice = f"dice {fmt(row['mean_dice'])} (best {fmt(best)} @{best_epoch})" if row["mean_dice"] is not None else ""
    skipped = f" ({row['nonfinite_steps']} non-finite steps skipped)" if row.get("nonfinite_steps") else ""
    return (f"epoch {row['epoch']}/{total} loss {row['loss']:.4f} {dice} {row['epoch_s']:.1f}s "
            f"(data wait {100 * row['data_wait_share']:.1f}%) {row['samples_per_s']:.1f} samples/s "
            f"lr {row['lr']:.2e}{skipped}").replace("  ", " ")
