"""The one write path: every file autotune writes goes through here, atomically.

A write goes to a temp file in the target's own folder (so the rename cannot cross file
systems), is flushed and fsync'd, renamed over the target, and the folder is fsync'd so the
rename itself survives a power loss. On any failure, a signal included, the temp file is
removed and the old file is left as it was.

When the host refuses the write (no space, quota exceeded, read-only file system, no
permission) the failure becomes one ``HostWriteError`` line: what was being written, where,
about how many bytes it needed and how many are free. ``torch.save`` is written through a
file object this module owns, so the ``OSError`` under torch's own ``RuntimeError``
("unexpected pos ...") is seen and named.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from autotune.errors import HostWriteError
from autotune.utils import format_bytes, plain_data

__all__ = [
    "HOST_REFUSALS",
    "exception_chain",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_json",
    "atomic_write_yaml",
    "atomic_save_torch",
    "host_refusal",
    "refused",
    "sizes_note",
    "free_bytes",
    "make_folder",
    "check_creatable",
    "tensor_bytes",
    "fsync_folder",
    "in_the_way",
    "IN_THE_WAY_FIX",
]

# The errors by which a host refuses a write, with the words the one line uses.
HOST_REFUSALS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
}
# What torch's zip writer says when a write under it failed (the OSError is lost on a path target).
_TORCH_WRITE_FAILURES = ("inline_container", "unexpected pos", "PytorchStreamWriter failed", "file write failed")
_NEARLY_FULL_BYTES = 1 << 20  # below this much free space a failed torch write counts as a full disk
IN_THE_WAY_FIX = "move it away (or write elsewhere)"  # what to do when a folder stands where a file goes


class _RecordingFile:
    """A binary file that remembers the ``OSError`` a write or flush raised (torch hides it)."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self.handle.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        try:
            self.handle.flush()
        except OSError as exc:
            self.error = exc
            raise


def free_bytes(folder: str | os.PathLike[str]) -> int | None:
    """Free bytes on the file system that holds ``folder`` (its nearest existing parent); None if unknown."""
    path = Path(folder).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return int(shutil.disk_usage(path).free)
    except OSError:
        return None


def _missing_top(path: Path) -> Path | None:
    """The highest folder of ``path`` that does not exist yet (``path`` itself when only it is missing); None
    when ``path`` exists."""
    top = None
    while not path.exists() and path != path.parent:
        top, path = path, path.parent
    return top


def check_creatable(folder: str | os.PathLike[str], what: str, error: type[Exception]) -> None:
    """Refuse, before anything is written, a folder that can neither be used nor created: the path (or the
    nearest part of it that exists) is a file, or the nearest existing folder may not be written.

    Raises:
        error: one line naming ``what``, the path and what to do.
    """
    path = Path(folder).absolute()
    if path.exists() and not path.is_dir():
        raise error(f"{path}: exists and is not a folder; give a folder as {what}")
    top = _missing_top(path)
    if top is None:
        return
    parent = top.parent
    if not parent.is_dir():
        raise error(f"{path}: cannot create {what} here: {parent} is not a folder; give another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise error(f"{path}: cannot create {what} here: {parent} may not be written; give another path")


def make_folder(folder: str | os.PathLike[str], what: str, note: str = "") -> Path:
    """``folder``, created with its missing parents when it does not exist; a folder that had to be created is
    said in one line on stderr (``created the work folder /abs/path``), so a folder made by a typo or a path
    read otherwise than meant (``sqlite:////x`` is the absolute ``/x``) is seen; ``note`` ends that line.
    Returns it, absolute.

    Raises:
        HostWriteError: the host refused to create it.
    """
    import sys

    path = Path(os.path.abspath(Path(folder).expanduser()))
    top = _missing_top(path)
    if top is None:
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno in HOST_REFUSALS:
            raise refused(exc, what, path) from exc
        raise
    parents = f" (and the folders above it from {top})" if top != path else ""
    print(f"created {what} {path}{parents}{f' {note}' if note else ''}", file=sys.stderr, flush=True)
    return path


def fsync_folder(folder: str | os.PathLike[str]) -> None:
    """Flush a folder's entries (after a rename into it) to the disk."""
    fd = os.open(str(folder), os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # some file systems cannot fsync a folder; the rename stands
            raise
    finally:
        os.close(fd)


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what caused it (``__cause__``, else ``__context__``), each once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def host_refusal(exc: BaseException, folders: tuple[str | os.PathLike[str], ...] = ()) -> OSError | None:
    """The host's refusal behind ``exc``: an ``OSError`` with an errno of ``HOST_REFUSALS`` in its
    chain (cause or context), or, for torch's writer error that lost it, ENOSPC when one of
    ``folders`` is nearly full. None when ``exc`` is something else."""
    for current in exception_chain(exc):
        if isinstance(current, OSError) and current.errno in HOST_REFUSALS:
            return current
    if isinstance(exc, RuntimeError) and any(m in str(exc) for m in _TORCH_WRITE_FAILURES):
        for folder in folders:
            free = free_bytes(folder)
            if free is not None and free < _NEARLY_FULL_BYTES:
                return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder))
    return None


def sizes_note(needed_bytes: int | None, free: int | None) -> str:
    """``needs about 4.70 MiB, 1.21 MiB free there`` (either part left out when unknown)."""
    parts = [f"needs about {format_bytes(needed_bytes)}" if needed_bytes else "",
             f"{format_bytes(free)} free there" if free is not None else ""]
    return ", ".join(p for p in parts if p)


def refused(error: OSError, what: str, path: str | os.PathLike[str], needed_bytes: int | None = None) -> HostWriteError:
    """The one-line ``HostWriteError`` for ``error`` refusing ``what`` at ``path``."""
    return HostWriteError(what=what, path=str(path), reason=HOST_REFUSALS.get(error.errno or 0, str(error)),
                          sizes=sizes_note(needed_bytes, free_bytes(Path(path).parent)))


def _temp_beside(path: Path) -> Path:
    """A new empty file ``.NAME.XXXXXXXX.tmp`` beside ``path``, with the permissions a plain ``open`` gives
    (0666 less the umask; ``tempfile.mkstemp`` would make every output private to its owner)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue


def in_the_way(path: Path) -> str:
    """What stands where ``path`` is to be written, in words: a folder in its place, or a file in place of one
    of its folders; '' when nothing does (a symlink in its place is replaced, as any file)."""
    if path.is_dir() and not path.is_symlink():
        return "a folder is in its place"
    for parent in path.parents:
        if parent.exists():
            return "" if parent.is_dir() else f"{parent} is a file, not a folder"
    return ""


def _blocked(what: str, path: Path, reason: str) -> HostWriteError:
    return HostWriteError(what=what, path=str(path), reason=reason,
                          then=f"{IN_THE_WAY_FIX}, then run the same command again")


def _commit(tmp: Path, path: Path) -> None:
    os.replace(tmp, path)
    fsync_folder(path.parent)


def atomic_write(path: str | os.PathLike[str], write: Callable[[Any], None], *, what: str = "the file",
                 needed_bytes: int | None = None) -> Path:
    """Write ``path`` atomically: ``write(handle)`` fills a binary temp file beside it, which is
    flushed, fsync'd and renamed over ``path``; the folder is fsync'd. Returns ``path``.

    Raises:
        HostWriteError: the host refused the write, or a folder stands where the file goes (the temp file is
            gone, the old file intact).
    """
    path = Path(path)
    reason = in_the_way(path)
    if reason:
        raise _blocked(what, path, reason)
    try:
        tmp = _temp_beside(path)
    except OSError as exc:
        if exc.errno in HOST_REFUSALS:
            raise refused(exc, what, path, needed_bytes) from exc
        if isinstance(exc, (NotADirectoryError, FileExistsError)):  # a file took a folder's place meanwhile
            raise _blocked(what, path, in_the_way(path) or str(exc)) from exc
        raise
    recorder: _RecordingFile | None = None
    try:
        with open(tmp, "wb") as handle:
            recorder = _RecordingFile(handle)
            write(recorder)
            handle.flush()
            os.fsync(handle.fileno())
        _commit(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, (IsADirectoryError, NotADirectoryError)):  # a folder took the file's place meanwhile
            raise _blocked(what, path, in_the_way(path) or str(exc)) from exc
        cause = (recorder.error if recorder is not None else None) or host_refusal(exc)
        if isinstance(exc, Exception) and cause is not None and cause.errno in HOST_REFUSALS:
            raise refused(cause, what, path, needed_bytes) from exc
        raise
    return path


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, what: str = "the file") -> Path:
    """Write ``data`` to ``path`` atomically (see ``atomic_write``)."""
    return atomic_write(path, lambda handle: handle.write(data), what=what, needed_bytes=len(data))


def atomic_write_text(path: str | os.PathLike[str], text: str, *, what: str = "the file") -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (see ``atomic_write``)."""
    return atomic_write_bytes(path, text.encode("utf-8"), what=what)


def atomic_write_yaml(path: str | os.PathLike[str], data: Any, *, what: str = "the file") -> Path:
    """Dump ``data`` as plain YAML (block style, key order kept) and write it atomically."""
    return atomic_write_text(path, yaml.safe_dump(plain_data(data), sort_keys=False, default_flow_style=None),
                             what=what)


def atomic_write_json(path: str | os.PathLike[str], data: Any, *, what: str = "the file") -> Path:
    """Dump ``data`` as indented JSON and write it atomically."""
    return atomic_write_text(path, json.dumps(plain_data(data), indent=2, sort_keys=False) + "\n", what=what)


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors nested in ``obj`` (dicts, lists, tuples): about what ``torch.save`` writes."""
    if isinstance(obj, Mapping):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    if hasattr(obj, "untyped_storage") and hasattr(obj, "element_size"):
        return int(obj.numel()) * int(obj.element_size())
    return 0


def atomic_save_torch(path: str | os.PathLike[str], obj: Any, *, what: str = "the checkpoint") -> Path:
    """``torch.save(obj)`` to ``path`` atomically, through a file object this module owns.

    Raises:
        HostWriteError: the host refused the write.
    """
    import torch

    return atomic_write(path, lambda handle: torch.save(obj, handle), what=what, needed_bytes=tensor_bytes(obj))
