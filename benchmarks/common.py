"""Shared helpers of the benchmark scripts: the load sampler, atomic JSON writes, and the
marked table blocks of BENCHMARKS.md.

A benchmark's wall times mean little without the machine's load *during* the run, so each
measured run is wrapped in :class:`LoadSampler`, which reads ``os.getloadavg()`` every few
seconds in a thread and reports min/mean/max over the run (``LoadSampler.summary``).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

#: How often the sampler reads the load average (seconds). The kernel updates it every 5 s.
DEFAULT_INTERVAL_S = 2.0


class LoadSampler:
    """Sample the 1-minute load average in a background thread while a run lasts.

    Use as a context manager around one measured run; ``summary()`` (also valid while it
    runs) gives the samples' min, mean and max, their count and the sampled seconds. The
    first sample is taken on entry and the last on exit, so even a run shorter than the
    interval has two samples.
    """

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.interval_s = interval_s
        self.samples: list[float] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._ended: float | None = None

    def _sample(self) -> None:
        with self._lock:
            self.samples.append(os.getloadavg()[0])

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self) -> LoadSampler:
        """Take the first sample and start the thread."""
        if self._thread is not None:
            raise RuntimeError("LoadSampler already started")
        self._started = time.monotonic()
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="load-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        """Stop the thread, take the last sample, and return ``summary()``."""
        if self._thread is None:
            raise RuntimeError("LoadSampler was not started")
        if self._ended is None:
            self._stop.set()
            self._thread.join()
            self._sample()
            self._ended = time.monotonic()
        return self.summary()

    def summary(self) -> dict[str, Any]:
        """``{"min", "mean", "max", "samples", "seconds", "interval_s"}`` of the 1-minute load average."""
        with self._lock:
            samples = list(self.samples)
        end = self._ended if self._ended is not None else time.monotonic()
        return {
            "min": round(min(samples), 2) if samples else None,
            "mean": round(statistics.fmean(samples), 2) if samples else None,
            "max": round(max(samples), 2) if samples else None,
            "samples": len(samples),
            "seconds": round(end - self._started, 1) if self._thread is not None else 0.0,
            "interval_s": self.interval_s,
        }

    def __enter__(self) -> LoadSampler:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def cpu_name() -> str:
    """The processor's model name (``/proc/cpuinfo``), else ``platform``'s answer."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON, atomically."""
    from autotune.files import atomic_write_text

    atomic_write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def read_or_run(out: Path, report_only: bool, run: Callable[[], Any], table: Callable[[Any], str]) -> int:
    """A benchmark's last step: its report measured now (``run``) and written to ``out``, or read from ``out``
    (``--report-only``); its table printed either way."""
    report = read_json(out) if report_only else run()
    if not report_only:
        write_json(out, report)
    print(table(report))
    return 0


def _block_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"^(<!-- table:{re.escape(name)} -->\n)(.*?)^(<!-- /table:{re.escape(name)} -->)$",
                      re.DOTALL | re.MULTILINE)


def block_names(text: str) -> list[str]:
    """The names of the ``<!-- table:NAME -->`` blocks in ``text``, in order (markers on lines of their own)."""
    return re.findall(r"^<!-- table:([\w.-]+) -->$", text, re.MULTILINE)


def read_block(text: str, name: str) -> str:
    """The content between ``<!-- table:NAME -->`` and ``<!-- /table:NAME -->``.

    Raises:
        KeyError: no such block, or its end marker is missing.
    """
    match = _block_pattern(name).search(text)
    if match is None:
        raise KeyError(f"no block <!-- table:{name} --> ... <!-- /table:{name} --> in the text")
    return match.group(2)


def replace_block(text: str, name: str, content: str) -> str:
    """``text`` with the block NAME's content replaced by ``content`` (ending in one newline).

    Raises:
        KeyError: no such block.
    """
    read_block(text, name)
    body = content.rstrip("\n") + "\n"
    return _block_pattern(name).sub(lambda m: m.group(1) + body + m.group(3), text, count=1)
