"""The scaffold every benchmark script uses: its arguments (``--out``, ``--report-only``), the load
sampler, the JSON it writes and the tables it prints, and the marked table blocks of BENCHMARKS.md.

A script is ``python -m benchmarks.NAME``; its ``main`` builds its parser with :func:`parser`, adds
its own options, and ends in :func:`report`, which either measures (and writes ``--out``) or, with
``--report-only``, reads ``--out``; either way it prints the script's tables.

A benchmark's wall times mean little without the machine's load *during* the run, so each
measured run is wrapped in :class:`LoadSampler`, which reads ``os.getloadavg()`` every few
seconds in a thread and reports min/mean/max over the run (``LoadSampler.summary``). The load average does not
see a virtual machine's host taking the cores away, so the sampler also reports the share of the CPU time that
the hypervisor stole over the run (``/proc/stat``'s steal column; None where the system has none).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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
#: ``/proc/stat``: its first line sums every CPU's time in clock ticks
PROC_STAT = Path("/proc/stat")
#: the checkout the benchmarks run from
REPO = Path(__file__).resolve().parents[1]
#: where the benchmarks' result JSON is committed
RESULTS = Path(__file__).resolve().parent / "results"
#: the Decathlon hippocampus set, beside the checkout (``../shared/datasets``)
HIPPOCAMPUS = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "Task04_Hippocampus"


def cpu_ticks(path: Path | None = None) -> tuple[int, int] | None:
    """(stolen, all) clock ticks of every CPU since boot, from ``/proc/stat``'s ``cpu`` line (user, nice, system,
    idle, iowait, irq, softirq, steal: guest time is inside user's), or None where it cannot be read."""
    try:
        fields = (path or PROC_STAT).read_text().split("\n", 1)[0].split()
        ticks = [int(v) for v in fields[1:9]]
    except (OSError, ValueError, IndexError):
        return None
    if fields[0] != "cpu" or len(ticks) < 8:
        return None
    return ticks[7], sum(ticks)


def steal_fraction(start: tuple[int, int] | None, end: tuple[int, int] | None) -> float | None:
    """The share of the CPU time between two ``cpu_ticks`` readings that the hypervisor stole (0 to 1)."""
    if start is None or end is None or end[1] <= start[1]:
        return None
    return round(max(0, end[0] - start[0]) / (end[1] - start[1]), 3)


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
        self._ticks: list[tuple[int, int] | None] = [None, None]  # at the start and at the stop

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
        self._ticks[0] = cpu_ticks()
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
            self._ticks[1] = cpu_ticks()
        return self.summary()

    def summary(self) -> dict[str, Any]:
        """``{"min", "mean", "max", "samples", "seconds", "interval_s"}`` of the 1-minute load average, and
        ``steal``: the share of the CPU time stolen by the hypervisor since the start (None: not readable)."""
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
            "steal": steal_fraction(self._ticks[0], self._ticks[1] if self._ended is not None else cpu_ticks()),
        }

    def __enter__(self) -> LoadSampler:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def cpu_name() -> str:
    """The processor's model name (``/proc/cpuinfo``), else ``platform``'s answer."""
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


def parser(doc: str | None, out: str | None = None, report_only: bool = True) -> argparse.ArgumentParser:
    """A benchmark's argument parser: ``doc`` (its module docstring) as the help, ``--out`` (its result JSON,
    ``benchmarks/results/OUT`` unless given) and ``--report-only`` (print the tables of ``--out``, measure nothing)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if out is not None:
        p.add_argument("--out", type=Path, default=RESULTS / out, help=f"the result JSON (default: results/{out})")
    if report_only:
        p.add_argument("--report-only", action="store_true", help="print the tables of --out and measure nothing")
    return p


def command(module: str, argv: list[str] | None = None) -> str:
    """The command line that ran benchmark ``module`` (``benchmarks.NAME``), as the result JSON records it."""
    import sys

    return " ".join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])


def environment(**extra: Any) -> dict[str, Any]:
    """The machine a benchmark measured: the CPU, its cores, torch's threads and the versions; with ``extra``."""
    import torch

    return {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), **extra}


def report(args: argparse.Namespace, measure: Callable[[], Any], *tables: Callable[[Any], str]) -> Any:
    """A benchmark's last step: with ``--report-only`` the report read from ``args.out``, else ``measure()``
    written there; each of ``tables`` printed from it (a blank line between them). Returns the report."""
    out = Path(args.out)
    if getattr(args, "report_only", False):
        result = read_json(out)
    else:
        result = measure()
        write_json(out, result)
    print("\n\n".join(table(result) for table in tables))
    return result


def generate_bundles(data: Path | str, work: Path, algos: str | list[str], num_fold: int = 1,
                     analyze_folds: int | None = None, overrides: Any = None) -> dict[str, Path]:
    """Analyse ``data`` into ``work`` (``analyze_folds`` folds, default ``num_fold``) and generate the bundles of
    ``algos`` there, ``num_fold`` folds each, with ``overrides``; each algorithm's fold-0 bundle."""
    from autotune.data.analyze import analyze
    from autotune.facade.bundlegen import BundleGen

    res = analyze(data, work, num_fold=analyze_folds or num_fold, progress=False)
    gen = BundleGen(work, algos=algos, data_stats_filename=res.datastats, data_src_cfg_name=res.data_src)
    return {b["algo"]: Path(b["path"]) for b in gen.generate(work, num_fold=num_fold, overrides=overrides)
            if b["fold"] == 0}


def full_size_bundles(root: Path, dataset: str, algos: list[str]) -> dict[str, Path]:
    """The full-size bundles (no preset) of ``algos`` under ``root``, one fold: on the demo data (``dataset``
    "demo": ``autotune demo-data``'s defaults, made under ``root``) or on the hippocampus set."""
    from autotune.data.synthetic import make_demo_dataset

    source = make_demo_dataset(root / "demo-data") if dataset == "demo" else HIPPOCAMPUS
    return generate_bundles(source, root / f"work-{dataset}", algos)


def first_cases(data: Path, cases: int, root: Path) -> Path:
    """A datalist of the first ``cases`` training cases of the Decathlon set ``data``, written to
    ``root/datalist.json`` (absolute paths); its path."""
    dataset = json.loads((data / "dataset.json").read_text())
    datalist = {"training": [{"image": str((data / e["image"]).resolve()), "label": str((data / e["label"]).resolve())}
                             for e in dataset["training"][:cases]]}
    (root / "datalist.json").write_text(json.dumps(datalist))
    return root / "datalist.json"


def fresh_copy(bundle: Path, dest: Path) -> Path:
    """``bundle`` copied to ``dest`` (replacing what was there) without its trained models; ``dest``."""
    import shutil

    shutil.rmtree(dest, ignore_errors=True)
    return Path(shutil.copytree(bundle, dest, ignore=shutil.ignore_patterns("model_fold*")))


def run_logged(argv: list[str], log: Path, **env: str) -> None:
    """Run ``argv`` with this checkout importable (and ``env`` added), its output to ``log``; exit naming the
    command and the log if it fails."""
    import subprocess

    with open(log, "w") as handle:
        code = subprocess.call(argv, stdout=handle, stderr=subprocess.STDOUT,
                               env={**os.environ, "PYTHONPATH": str(REPO), **env})
    if code != 0:
        raise SystemExit(f"failed (exit {code}): {' '.join(argv)}; see {log}")


def metrics_rows(bundle: Path) -> list[dict[str, Any]]:
    """The per-epoch rows of fold 0's ``metrics.json`` in a trained ``bundle``."""
    return read_json(bundle / "model_fold0" / "metrics.json")["rows"]


def first_at(rows: list[dict[str, Any]], dice: float) -> dict[str, Any] | None:
    """The first validated row of ``rows`` whose mean Dice reaches ``dice``."""
    return next((r for r in rows if r.get("mean_dice") is not None and r["mean_dice"] >= dice), None)


def cell(value: Any, spec: str = ".3f", missing: str = "-") -> str:
    """A table cell: ``value`` formatted by ``spec``, ``missing`` where it is None."""
    return missing if value is None else format(value, spec)


def load_cell(load: dict[str, Any]) -> str:
    """A load summary (:meth:`LoadSampler.summary`) as "mean (min-max)", "-" where nothing was sampled."""
    return f"{load['mean']:.1f} ({load['min']:.1f}-{load['max']:.1f})" if load.get("samples") else "-"


def new_database(server_url: str, prefix: str) -> tuple[str, str]:
    """A new, empty PostgreSQL database named ``prefix`` and a random suffix on the server at ``server_url``;
    its URL (password kept) and its name."""
    import uuid

    import sqlalchemy
    from sqlalchemy.engine import make_url

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    engine = sqlalchemy.create_engine(server_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return make_url(server_url).set(database=name).render_as_string(hide_password=False), name


#: one line of a Dice plot: its label, the wall times and the Dice at each
Line = tuple[str, list[float], list[float]]


def dice_plot(path: Path, panels: list[tuple[str, list[Line]]], xlabel: str, target: float | None = None,
              stop: float | None = None, ylabel: str = "validation mean Dice") -> None:
    """Validation Dice against wall time as a PNG at ``path``: one panel per (title, lines) side by side, one
    line per (label, xs, ys); ``target`` dashed across each panel, ``stop`` (the runs' end) dashed down."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4.2), squeeze=False)
    for ax, (title, lines) in zip(axes[0], panels, strict=True):
        for label, xs, ys in lines:
            ax.plot(xs, ys, marker="o", ms=3, label=label)
        if target is not None:
            ax.axhline(target, color="grey", lw=0.8, ls="--")
        if stop is not None:
            ax.axvline(stop, color="grey", lw=1, ls="--")
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel, ylim=(0, 1))
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
