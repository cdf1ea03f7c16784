"""Data analysis: validate a dataset and write ``datastats.yaml`` with MONAI Auto3DSeg's statistics.

``analyze`` writes these files into the work folder:

- ``datalist.json``: the Auto3DSeg datalist, absolute paths, a fold per training case;
- ``data_src.yaml``: an Auto3DSeg input.yaml pointing at that datalist;
- ``datastats.yaml``: the ``stats_summary`` MONAI's ``DataAnalyzer`` writes (same keys and
  values) plus an ``autotune`` block that records the content hash the statistics were
  computed from and the integrity warnings (``autotune.data.integrity``);
- ``datastats_by_case.json``: the per-case statistics, in datalist order;
- ``datastats_cache.json``: the per-case results by file digest (``autotune.data.case_cache``).

The statistics do not depend on the folds: a run with the same cases and other folds only
rewrites ``datalist.json`` and ``data_src.yaml``. A run with new or changed cases reads and
analyses only those; the summary is taken over all cases again.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.checks.tree import leaves
from autotune.data.case_cache import CASE_CACHE, CaseCache
from autotune.data.datalist import (
    DataSource,
    load_data_source,
    write_data_src_config,
    write_datalist,
)
from autotune.data.integrity import check_dataset, check_duplicates, log_warnings
from autotune.data.monai_stats import ANALYZER, ANALYZER_SETTINGS, case_stats, monai_version, summarize
from autotune.data.validate import CaseInfo, check_cases
from autotune.errors import AutotuneError, DataError, HostWriteError, InputError
from autotune.files import atomic_write_json, atomic_write_yaml
from autotune.utils import expand_path, read_json, read_yaml

__all__ = ["AnalysisResult", "PendingAnalysis", "analyze", "prepare_analysis", "content_hash", "DATASTATS", "DATALIST",
           "DATA_SRC"]

logger = logging.getLogger(__name__)

DATASTATS = "datastats.yaml"
DATASTATS_BY_CASE = "datastats_by_case.json"
DATALIST = "datalist.json"
DATA_SRC = "data_src.yaml"
# names what the statistics and the checks mean; change it when either changes, so that
# datastats.yaml files written under the other meaning are analysed again
_HASH_VERSION = "autotune-datastats-4"


@dataclass
class AnalysisResult:
    """Where ``analyze`` wrote its files and whether it had anything to do.

    Attributes:
        datastats: ``datastats.yaml``.
        datalist: ``datalist.json`` (absolute paths and folds).
        data_src: ``data_src.yaml`` (Auto3DSeg input.yaml form).
        skipped: True if the statistics were already up to date.
        content_hash: The hash the statistics belong to (see ``content_hash``).
        n_cases: Number of training cases.
        warnings: The integrity warnings, one line each (also logged, and kept in datastats.yaml).
        cases_read: Cases whose files were read and analysed in this run (the others came from
            ``datastats_cache.json``, or the statistics were up to date).
    """

    datastats: Path
    datalist: Path
    data_src: Path
    skipped: bool
    content_hash: str
    n_cases: int
    warnings: list[str] = field(default_factory=list)
    cases_read: int = 0


def content_hash(source: DataSource) -> str:
    """SHA-256 over what the statistics depend on, cheap enough to compute on every run.

    Covers the normalised datalist without its folds (absolute paths, modality, channels,
    name, class names, labels, sigmoid) and each training file's size and modification time
    (``mtime_ns``). File contents are not read: hashing every volume of a large CT dataset
    takes a while, and a rewritten file gets a new mtime (the per-case cache goes by content).
    Folds are left out: the statistics are the same whatever the split. A missing file is
    recorded as missing (``check_cases`` reports it).
    """
    training = []
    for entry in source.training:
        images = entry["image"] if isinstance(entry["image"], list) else [entry["image"]]
        training.append({"image": [_file_stamp(path) for path in images], "label": _file_stamp(entry["label"])})
    payload = {
        "version": _HASH_VERSION,
        "modality": source.modality,
        "num_channels": source.num_channels,
        "name": source.name,
        "class_names": source.class_names,
        "labels": source.labels,
        "sigmoid": source.sigmoid,
        "dataroot": str(source.dataroot),
        "training": training,
        "testing": [entry["image"] for entry in source.testing],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()


def analyze(input: str | Path, work_dir: str | Path, num_fold: int = 5, force: bool = False,
            progress: bool = True) -> AnalysisResult:
    """Load, validate and analyse a dataset; write datalist.json, data_src.yaml and datastats.yaml.

    Every check runs before the first write (``prepare_analysis``, then ``PendingAnalysis.write``): a refused
    dataset leaves the work folder as it was.

    Args:
        input: An input.yaml, a datalist .json or a Decathlon task folder.
        work_dir: Folder for the outputs (created if needed, said in one line).
        num_fold: Folds to assign when the datalist does not give them.
        force: Read and analyse every case, even when datastats.yaml is up to date.
        progress: Print what is happening and show progress bars (stderr).

    Returns:
        Where the files are and whether the analysis was skipped as up to date.

    Raises:
        InputError: The input or work folder is unusable, or its labels and class_names disagree.
        DataError: An image or label is missing, unreadable or inconsistent, a file is listed twice,
            a label holds an undeclared value, every label is empty, or the analyzer failed.
    """
    return prepare_analysis(input, work_dir, num_fold=num_fold, force=force, progress=progress).write()


@dataclass
class PendingAnalysis:
    """An analysis checked and computed, not yet written: ``write`` writes it; until then the work folder is as
    it was. ``datastats()`` is what ``datastats.yaml`` holds (or will hold).

    Attributes:
        source: The data source, folds assigned.
        result: What ``write`` returns (its paths are where the files go).
        cache: The per-case results, to save (None when the statistics are up to date).
        keys: The case digests the cache keeps.
        statistics: ``datastats.yaml``'s content; None when up to date (read from the file).
        by_case: The per-case statistics to write (None when up to date).
        progress: Print what is happening.
    """

    source: DataSource
    result: AnalysisResult
    cache: CaseCache | None = None
    keys: list[str | None] = field(default_factory=list)
    statistics: dict[str, Any] | None = None
    by_case: list[dict[str, Any]] | None = None
    progress: bool = True

    @property
    def work(self) -> Path:
        return self.result.datastats.parent

    def datastats(self) -> dict[str, Any]:
        """What ``datastats.yaml`` holds once written (read from the file when it is up to date)."""
        if self.statistics is not None:
            return self.statistics
        data = read_yaml(self.result.datastats, error=DataError)
        return data if isinstance(data, dict) else {}

    def write(self) -> AnalysisResult:
        """Write the files (the work folder created if needed, said in one line); returns the result."""
        from autotune.files import make_folder

        result = self.result
        if self.statistics is None:  # up to date: only the lists, where the folds changed
            if _lists_differ(self.source, result):
                _write_lists(self.source, result)
                _say(self.progress, f"{result.datalist.name} written with {self.source.num_fold} fold(s)")
            return result
        make_folder(self.work, "the work folder")
        result.datastats.unlink(missing_ok=True)  # stale from here on: new datalist, statistics not yet written
        written: list[Path] = []  # whole once written (each through the write path): a refusal names them
        try:
            write_datalist(self.source, result.datalist)
            written.append(result.datalist)
            write_data_src_config(self.source, result.datalist, result.data_src)
            written.append(result.data_src)
            if self.cache is not None:
                self.cache.save(self.keys)
                written.append(self.cache.path)
            atomic_write_json(self.work / DATASTATS_BY_CASE, self.by_case)
            written.append(self.work / DATASTATS_BY_CASE)
            atomic_write_yaml(result.datastats, self.statistics)  # written last: its presence means it finished
        except HostWriteError as exc:
            kept = ", ".join(str(path) for path in written)
            raise exc.with_outcome(kept=f"{kept} (whole; {result.datastats.name} not written)" if kept else "") from exc
        _say(self.progress, f"wrote {result.datastats}")
        return result


def prepare_analysis(input: str | Path, work_dir: str | Path, num_fold: int = 5, force: bool = False,
                     progress: bool = True) -> PendingAnalysis:
    """Everything ``analyze`` does but the writes: load, check every case and the dataset, compute the
    statistics of the cases the cache lacks. Raises what ``analyze`` raises, having written nothing."""
    from autotune.files import check_creatable

    source = load_data_source(input, num_fold=num_fold)
    work = Path(os.path.abspath(expand_path(work_dir, InputError, "work dir", "an absolute path")))
    check_creatable(work, "the work dir", InputError)
    result = AnalysisResult(datastats=work / DATASTATS, datalist=work / DATALIST, data_src=work / DATA_SRC,
                            skipped=False, content_hash=content_hash(source), n_cases=len(source.training))
    pending = PendingAnalysis(source=source, result=result, progress=progress)
    block = None if force else _up_to_date_block(result.datastats, result.content_hash)
    if block is not None:
        _keep_statistics(source, result, block, progress)
        return pending
    cache = CaseCache(work / CASE_CACHE, cache_settings()) if force else \
        CaseCache.load(work / CASE_CACHE, cache_settings())
    pending.cache = cache
    summary, pending.by_case, pending.keys = _analyse(source, result, cache, progress)
    pending.statistics = {
        "stats_summary": summary,
        "autotune": {
            "content_hash": result.content_hash,
            "input": str(source.source),
            "n_cases": result.n_cases,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "monai_version": monai_version(),
            "analyzer": ANALYZER,
            "warnings": result.warnings,
        },
    }
    return pending


def _analyse(source: DataSource, result: AnalysisResult, cache: CaseCache,
             progress: bool) -> tuple[dict[str, Any], list[dict[str, Any]], list[str | None]]:
    """Check the cases and the dataset, compute the statistics of the cases ``cache`` lacks (writing nothing);
    returns the summary, the per-case statistics of all cases and the case digests."""
    check_duplicates(source)  # before reading any file: a duplicate is wrong whatever the files hold
    keys = [cache.case_key(entry) for entry in source.training]
    known = {index: info for index, (key, entry) in enumerate(zip(keys, source.training, strict=True))
             if (info := cache.info(key, entry)) is not None}
    unchanged = f" ({len(known)} unchanged: from {CASE_CACHE})" if known else ""
    _say(progress, f"analyzing {result.n_cases} cases{unchanged} ...")
    infos = check_cases(source, progress=progress, known=known)
    result.warnings = check_dataset(source, infos)
    log_warnings(result.warnings)
    by_case, result.cases_read = _case_statistics(source, keys, infos, cache, progress)
    return summarize(by_case), by_case, keys


def _case_statistics(source: DataSource, keys: list[str | None], infos: list[CaseInfo], cache: CaseCache,
                     progress: bool) -> tuple[list[dict[str, Any]], int]:
    """Per-case statistics of every case, in datalist order: from ``cache`` where it has them, else from
    MONAI's DataAnalyzer (recorded in ``cache``); and how many were computed."""
    found = [cache.stats(key, entry) for key, entry in zip(keys, source.training, strict=True)]
    new = [index for index, stats in enumerate(found) if stats is None]
    if new:
        computed = case_stats([source.training[index] for index in new], source.source, progress)
        for index, stats in zip(new, computed, strict=True):
            _refuse_non_finite_stats(stats, infos[index].image[0])
            found[index] = stats
            cache.put(keys[index], infos[index], stats)
    return [stats for stats in found if stats is not None], len(new)


def _refuse_non_finite_stats(stats: dict[str, Any], image: str) -> None:
    """Refuse a case whose statistics hold NaN or infinity although its voxels are finite (values so large that
    MONAI's float32 statistics overflow): datastats.yaml, and the normalisation generated from it, would be NaN."""
    for path, value in leaves(stats):
        if isinstance(value, float) and not math.isfinite(value):
            raise DataError(f"{image}: MONAI's statistics of this case are not finite ({path} is {value}): its "
                            "intensities are too large for float32 statistics; rescale the image or remove the case")


def _keep_statistics(source: DataSource, result: AnalysisResult, block: dict[str, Any], progress: bool) -> None:
    """Statistics up to date: take the warnings they were written with (the lists are written, where the folds
    changed, by ``PendingAnalysis.write``)."""
    result.skipped = True
    result.warnings = [str(line) for line in block.get("warnings") or []]
    _say(progress, f"{result.datastats}: up to date ({result.n_cases} cases, hash {result.content_hash[:12]}); "
                   "use --force to redo")
    log_warnings(result.warnings)


def _write_lists(source: DataSource, result: AnalysisResult) -> None:
    """Write datalist.json (absolute paths, folds) and data_src.yaml (the rest of the source) for ``source``."""
    write_datalist(source, result.datalist)
    write_data_src_config(source, result.datalist, result.data_src)


def _lists_differ(source: DataSource, result: AnalysisResult) -> bool:
    """Whether datalist.json is missing or lists other cases or folds than ``source``, or data_src.yaml is
    missing (its other fields are covered by the content hash)."""
    try:
        current = read_json(result.datalist, error=DataError) if result.datalist.is_file() else None
    except AutotuneError:
        current = None
    return current != source.as_datalist() or not result.data_src.is_file()


def _up_to_date_block(path: Path, digest: str) -> dict[str, Any] | None:
    """The ``autotune`` block of ``path`` if its statistics belong to ``digest``, else None."""
    if not path.is_file():
        return None
    try:
        data = read_yaml(path, error=DataError)
    except AutotuneError as exc:
        logger.warning("%s; analysing again", exc)
        return None
    block = data.get("autotune") if isinstance(data, dict) else None
    if isinstance(block, dict) and "stats_summary" in data and block.get("content_hash") == digest:
        return block
    return None


def cache_settings() -> dict[str, Any]:
    """What the per-case results depend on besides the files."""
    return {"monai": monai_version(), "analyzer": ANALYZER, "settings": ANALYZER_SETTINGS}


def _file_stamp(path: str) -> list[Any]:
    """``[path, size, mtime_ns]``; size and mtime are None for a missing file."""
    try:
        stat = os.stat(path)
    except OSError:
        return [path, None, None]
    return [path, stat.st_size, stat.st_mtime_ns]


def _say(progress: bool, message: str) -> None:
    logger.info(message)
    if progress:
        print(message, file=sys.stderr, flush=True)
