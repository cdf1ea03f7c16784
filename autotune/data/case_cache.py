"""Per-case results of ``analyze`` kept between runs, keyed by the bytes of each case's files.

Checking a case and computing its statistics both read its image and label in full; on a large
dataset that is nearly all of ``analyze``'s time, and neither result changes while the files do
not. So ``analyze`` keeps, per case, the ``CaseInfo`` of the checks and MONAI's per-case
statistics in ``datastats_cache.json`` in the work folder, under a digest of the case's files
(the SHA-256 of each image file and of the label, in order). Adding cases then reads only the
new ones, and a changed file only its own case.

A file's SHA-256 is computed again only when its size or modification time (ns) differs from
those recorded with it, so an unchanged case costs one ``stat`` per file. The case entries are
dropped as a whole when MONAI's version, the analyzer settings or the cache format differ from
those recorded (the file digests are kept: they depend on the bytes alone); ``save`` keeps only
the cases and files of the dataset just analysed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from autotune.data.validate import CaseInfo
from autotune.errors import AutotuneError, DataError
from autotune.files import atomic_write_json
from autotune.utils import read_json

__all__ = ["CASE_CACHE", "CaseCache"]

logger = logging.getLogger(__name__)

CASE_CACHE = "datastats_cache.json"
FORMAT = "autotune-case-cache-2"  # names the entry layout (CaseInfo's fields) and the checks; change it with them
_PATH_KEYS = ("image_filepath", "label_filepath")  # MONAI's per-case statistics name the files; kept out
_CHUNK = 1 << 20


class CaseCache:
    """The per-case results of earlier runs: ``CaseInfo`` and MONAI's statistics, by case digest.

    Args:
        path: The cache file.
        settings: What the results depend on besides the files (MONAI's version, analyzer settings).
        files: Absolute path -> ``[size, mtime_ns, sha256]``.
        cases: Case digest -> ``{"info": ..., "stats": ...}``.
    """

    def __init__(self, path: Path, settings: dict[str, Any], files: dict[str, list[Any]] | None = None,
                 cases: dict[str, dict[str, Any]] | None = None) -> None:
        self.path = path
        self.settings = _plain(settings)
        self.files = files or {}
        self.cases = cases or {}
        self._seen: set[str] = set()

    @classmethod
    def load(cls, path: Path, settings: dict[str, Any]) -> CaseCache:
        """The cache at ``path``; without entries where the file is missing, unreadable or for other settings."""
        if not path.is_file():
            return cls(path, settings)
        try:
            data = read_json(path, error=DataError)
        except AutotuneError as exc:
            logger.warning("%s; analysing every case again", exc)
            return cls(path, settings)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return cls(path, settings)
        files = data.get("files") if isinstance(data.get("files"), dict) else {}
        same = data.get("settings") == _plain(settings) and isinstance(data.get("cases"), dict)
        return cls(path, settings, files, data["cases"] if same else {})

    def case_key(self, entry: dict[str, Any]) -> str | None:
        """The digest of a training entry's files; None when a file cannot be read (the checks report it)."""
        images = entry["image"] if isinstance(entry["image"], list) else [entry["image"]]
        digests = [self._file_digest(path) for path in images]
        label = self._file_digest(entry["label"])
        if label is None or None in digests:
            return None
        return hashlib.sha256(json.dumps({"image": digests, "label": label}).encode("utf-8")).hexdigest()

    def recorded_key(self, entry: dict[str, Any]) -> str | None:
        """The digest of a training entry's files where every file is recorded with its current size and
        modification time (nothing is read); None otherwise."""
        images = entry["image"] if isinstance(entry["image"], list) else [entry["image"]]
        digests = []
        for path in [*images, entry["label"]]:
            try:
                stat = os.stat(path)
            except OSError:
                return None
            known = self.files.get(path)
            if not (isinstance(known, list) and len(known) == 3 and known[:2] == [stat.st_size, stat.st_mtime_ns]):
                return None
            digests.append(str(known[2]))
        return hashlib.sha256(json.dumps({"image": digests[:-1], "label": digests[-1]}).encode("utf-8")).hexdigest()

    def info(self, key: str | None, entry: dict[str, Any]) -> CaseInfo | None:
        """The checked case recorded under ``key``, with ``entry``'s paths; None if there is none."""
        record = self.cases.get(key) if key else None
        if record is None:
            return None
        try:
            return _case_info(record["info"], entry)
        except (KeyError, IndexError, TypeError, ValueError):  # an entry this code did not write
            return None

    def stats(self, key: str | None, entry: dict[str, Any]) -> dict[str, Any] | None:
        """MONAI's per-case statistics recorded under ``key``, naming ``entry``'s files as MONAI does."""
        record = self.cases.get(key) if key else None
        if record is None or not isinstance(record.get("stats"), dict):
            return None
        first_image = entry["image"][0] if isinstance(entry["image"], list) else entry["image"]
        return {"image_filepath": first_image, "label_filepath": entry["label"], **record["stats"]}

    def put(self, key: str | None, info: CaseInfo, stats: dict[str, Any]) -> None:
        """Record a case's check result and statistics (nothing when its files could not be digested)."""
        if key is None:
            return
        self.cases[key] = {
            "info": {"shape": list(info.shape), "spacing": list(info.spacing), "channels": info.channels,
                     "label_values": list(info.label_values), "orientation": info.orientation},
            "stats": {name: value for name, value in stats.items() if name not in _PATH_KEYS},
        }

    def save(self, keep: list[str | None]) -> None:
        """Write the cache atomically, keeping the cases in ``keep`` and the files digested in this run."""
        cases = {key: self.cases[key] for key in dict.fromkeys(keep) if key is not None and key in self.cases}
        files = {path: stamp for path, stamp in self.files.items() if path in self._seen}
        atomic_write_json(self.path, {"format": FORMAT, "settings": self.settings, "files": files, "cases": cases})

    def _file_digest(self, path: str) -> str | None:
        """SHA-256 of the file, recomputed only when its size or mtime differs from the recorded one."""
        try:
            stat = os.stat(path)
        except OSError:
            return None
        self._seen.add(path)
        known = self.files.get(path)
        if isinstance(known, list) and len(known) == 3 and known[:2] == [stat.st_size, stat.st_mtime_ns]:
            return str(known[2])
        try:
            digest = _sha256(path)
        except OSError:
            return None
        self.files[path] = [stat.st_size, stat.st_mtime_ns, digest]
        return digest


def _case_info(fields: dict[str, Any], entry: dict[str, Any]) -> CaseInfo:
    """A ``CaseInfo`` from its recorded fields, with the paths ``entry`` gives now."""
    shape = [int(n) for n in fields["shape"]]
    spacing = [float(z) for z in fields["spacing"]]
    return CaseInfo(image=list(entry["image"]) if isinstance(entry["image"], list) else [entry["image"]],
                    label=entry["label"], shape=(shape[0], shape[1], shape[2]),
                    spacing=(spacing[0], spacing[1], spacing[2]), channels=int(fields["channels"]),
                    label_values=tuple(int(value) for value in fields["label_values"]),
                    orientation=str(fields["orientation"]))


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _plain(settings: dict[str, Any]) -> Any:
    """``settings`` as read back from JSON (tuples become lists), so they compare with the file's."""
    return json.loads(json.dumps(settings))
