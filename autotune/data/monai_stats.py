"""MONAI Auto3DSeg's statistics: per-case with ``DataAnalyzer``, summarised with ``SegSummarizer``.

``DataAnalyzer.get_all_case_stats`` computes one statistics dict per case and then summarises
the list with ``SegSummarizer.summarize`` (adding ``n_cases``). ``case_stats`` runs it on the
cases given (only the new or changed ones, when the others are cached); ``summarize`` takes
the same step over the per-case dicts of all cases, in datalist order. The per-case values
are plain lists and numbers already, so per-case dicts kept as JSON summarise to the same
``stats_summary`` that ``DataAnalyzer`` gives for the whole list with the same torch thread count
(a float32 mean over a case's voxels rounds differently with another; ``tests/data`` checks this).
MONAI and torch are imported inside the functions.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.errors import DataError
from autotune.utils import bars_enabled, plain_data

__all__ = ["ANALYZER", "ANALYZER_SETTINGS", "case_stats", "monai_version", "summarize"]

logger = logging.getLogger(__name__)

ANALYZER = "monai.apps.auto3dseg.DataAnalyzer"
# DataAnalyzer's own defaults, spelled out: the same go to SegSummarizer, and the per-case cache
# is dropped when they change.
ANALYZER_SETTINGS: dict[str, Any] = {"image_key": "image", "label_key": "label", "average": True, "do_ccp": False,
                                     "hist_bins": 0, "hist_range": [-500, 500], "histogram_only": False}
_MONAI_LOGGERS = ("monai.apps.auto3dseg.data_analyzer", "monai.auto3dseg", "monai.apps.auto3dseg")


def case_stats(entries: list[dict[str, Any]], source: Path, progress: bool) -> list[dict[str, Any]]:
    """Per-case statistics of ``entries`` from ``DataAnalyzer`` on the CPU, as plain data, in order.

    Args:
        entries: Training entries (``image``, ``label``, absolute paths).
        source: The dataset's input, for messages.
        progress: Show DataAnalyzer's progress bar.

    Raises:
        DataError: The analyzer failed, or skipped a case (it logs such a case and goes on).
    """
    from monai.apps.auto3dseg import DataAnalyzer
    from monai.apps.auto3dseg import data_analyzer as analyzer_module
    from tqdm import tqdm

    datalist = {"training": [{"image": e["image"], "label": e["label"]} for e in entries]}
    failures: list[str] = []
    bar = functools.partial(tqdm, desc="analyzing", unit="case", file=sys.stderr, disable=not bars_enabled(progress),
                            leave=False)
    with _quiet_monai(failures), _patched(analyzer_module, "tqdm", bar), _torch_threads(1), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            # worker=0 and one torch thread: the per-case statistics are many small ops; loader processes
            # and intra-op threads only add overhead (160 hippocampus cases: 3.4 s with one thread, 30 s
            # with two on a busy 2-core machine).
            analyzer = DataAnalyzer(datalist, "", output_path="", device="cpu", worker=0, **ANALYZER_SETTINGS)
            raw = analyzer.get_all_case_stats()
        except Exception as exc:
            logger.debug("DataAnalyzer failed", exc_info=True)
            cause = _root_cause(exc)  # MONAI wraps loader errors in "applying transform <...>"
            raise DataError(f"{source}: MONAI DataAnalyzer failed ({type(cause).__name__}: {cause}); fix "
                            "or remove the file it names, or run with -v for details") from exc
    by_case = plain_data(raw.get("stats_by_cases") or [], str_keys=True, str_other=True)
    if len(by_case) != len(entries):
        first = failures[0] if failures else "no reason given"
        raise DataError(f"{source}: MONAI DataAnalyzer could only process {len(by_case)} of {len(entries)} cases "
                        f"(first problem: {first}); fix or remove those cases")
    return list(by_case)


def summarize(by_case: list[dict[str, Any]]) -> dict[str, Any]:
    """``stats_summary`` of the per-case statistics, as ``DataAnalyzer.get_all_case_stats`` writes it."""
    from monai.auto3dseg import SegSummarizer

    settings = {key: value for key, value in ANALYZER_SETTINGS.items() if key not in ("image_key", "label_key")}
    summarizer = SegSummarizer(ANALYZER_SETTINGS["image_key"], ANALYZER_SETTINGS["label_key"], **settings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary = summarizer.summarize(by_case)
    summary["n_cases"] = len(by_case)
    return dict(plain_data(summary, str_keys=True, str_other=True))


def monai_version() -> str:
    import monai

    return str(monai.__version__)


class _Collect(logging.Handler):
    """Keeps DataAnalyzer's 'Unable to process data ...' lines, which it logs instead of raising."""

    def __init__(self, failures: list[str]) -> None:
        super().__init__(logging.INFO)
        self.failures = failures

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Unable to process"):
            self.failures.append(" ".join(message.split()))


@contextlib.contextmanager
def _quiet_monai(failures: list[str]) -> Iterator[None]:
    """Silence MONAI's INFO logging (it has its own handlers) but keep the per-case failures."""
    saved = []
    collect = _Collect(failures)
    for name in _MONAI_LOGGERS:
        log = logging.getLogger(name)
        saved.append((log, log.handlers[:], log.level, log.propagate))
        log.handlers = [collect]
        log.setLevel(logging.INFO)
        log.propagate = False
    try:
        yield
    finally:
        for log, handlers, level, propagate in saved:
            log.handlers, log.propagate = handlers, propagate
            log.setLevel(level)


@contextlib.contextmanager
def _torch_threads(count: int) -> Iterator[None]:
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@contextlib.contextmanager
def _patched(module: Any, name: str, value: Any) -> Iterator[None]:
    """Swap DataAnalyzer's progress bar for one that follows ``progress`` (it has no switch)."""
    original = getattr(module, name, None)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


def _root_cause(exc: BaseException) -> BaseException:
    seen = {id(exc)}
    while (inner := exc.__cause__ or exc.__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        exc = inner
    return exc
