"""Checkers of where things are: devices, ports, hosts, paths and storage URLs.

Each is syntax and a cheap look (a host is resolved, a path is looked at); whether a device
is visible and a storage opens are decided where they are used (``autotune.device``,
``autotune.search.storage.study.open_storage``), which raise the same kind of one-line error.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from autotune.checks.values import Error, integer, refuse
from autotune.errors import ConfigError, SpecError

__all__ = ["device", "port", "host", "path", "expand_path", "storage_url", "PATH_KINDS"]

_DEVICE = re.compile(r"auto|cpu|cuda(?::[0-9]{1,3})?")
_HOST = re.compile(r"[A-Za-z0-9._:\[\]%-]{1,253}")
PATH_KINDS = ("file", "folder", "any")


def device(value: Any, where: str, *, error: Error = SpecError, auto: bool = True) -> str:
    """``cpu``, ``cuda``, ``cuda:N`` (or ``auto`` where allowed), in lower case."""
    rule = f"must be {'auto, ' if auto else ''}cpu, cuda or cuda:N"
    if not isinstance(value, str) or not _DEVICE.fullmatch(value.strip().lower()) \
            or (value.strip().lower() == "auto" and not auto):
        refuse(error, where, value, rule)
    return value.strip().lower()


def port(value: Any, where: str, *, error: Error = SpecError) -> int:
    """A TCP port to listen on: a whole number from 1 to 65535."""
    return integer(value, where, low=1, high=65535, error=error, unit="a TCP port")


def host(value: Any, where: str, *, error: Error = SpecError) -> str:
    """A host name or address that resolves (``127.0.0.1``, ``localhost``, ``0.0.0.0``, ``::1``)."""
    import socket

    if not isinstance(value, str) or not _HOST.fullmatch(value) or ".." in value:
        refuse(error, where, value, "must be a host name or an IP address, e.g. 127.0.0.1")
    try:
        socket.getaddrinfo(value.strip("[]"), None)
    except (OSError, UnicodeError, ValueError):
        refuse(error, where, value, "cannot be resolved to an address; give an IP address such as 127.0.0.1 or "
                                    "a name this machine resolves")
    return value


def expand_path(path: str | os.PathLike[str], error: Error = ConfigError, what: str = "path",
                instead: str = "the full path") -> Path:
    """``Path(path).expanduser()``; an unknown ``~user`` raises ``error`` instead of RuntimeError.

    The message reads ``{what} '{path}': cannot find the home folder of '~user'; give {instead}``.
    """
    path = Path(path)
    try:
        return path.expanduser()
    except RuntimeError as exc:
        raise error(f"{what} {str(path)!r}: cannot find the home folder of {path.parts[0]!r}; give {instead}") from exc


def path(value: Any, where: str, *, kind: str = "any", exists: bool = False, error: Error = ConfigError,
         instead: str = "the full path") -> Path:
    """A file-system path: text without NUL or other control characters, ``~`` expanded (an unknown ``~user``
    asks for ``instead``); with ``exists`` it must exist and be of ``kind`` (``file``, ``folder`` or ``any``)."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip() or any(ord(c) < 32 for c in value) or len(value) > 4096:
        refuse(error, where, value, "must be a path: non-empty text without control characters")
    result = expand_path(value, error, where or "path", instead)
    if exists:
        try:
            found = result.is_file() if kind == "file" else result.is_dir() if kind == "folder" else result.exists()
        except OSError:  # a name too long for the file system, a loop of links
            found = False
        if not found:
            refuse(error, where, value, f"no such {kind if kind != 'any' else 'file or folder'}; check the path")
    return result


def storage_url(value: Any, where: str, *, error: Error = SpecError) -> str:
    """An SQLAlchemy URL of a database dialect SQLAlchemy knows (``sqlite:///...``, ``postgresql+psycopg://...``),
    an Optuna storage proxy's ``grpc://HOST:PORT`` or a journal file's ``journal:///PATH``.

    The message never shows a password. Whether the storage opens is ``open_storage``'s to say.
    """
    rule = ("must be an SQLAlchemy URL, grpc://HOST:PORT or journal:///PATH, e.g. sqlite:///studies/autotune.db "
            "or postgresql+psycopg://user@host/db")
    if not isinstance(value, str) or not value.strip() or any(ord(c) < 32 for c in value) or len(value) > 4096:
        refuse(error, where, _redacted(value), rule)
    if value.startswith("grpc://"):
        host, _, port = value[len("grpc://"):].rpartition(":")
        if not host.strip("[]") or "/" in host or "@" in host or not port.isdigit() or not 1 <= int(port) <= 65535:
            refuse(error, where, value, "must be grpc://HOST:PORT, the address of a storage proxy, e.g. "
                                        "grpc://db-node:13000")
        return value
    if value.startswith("journal://"):
        if not value[len("journal://"):].strip("/"):
            refuse(error, where, value, "must be journal:///PATH, a journal file, e.g. journal:///shared/autotune.log")
        return value
    from sqlalchemy.engine import make_url

    try:
        url = make_url(value)
        url.get_dialect()
    except Exception:  # noqa: BLE001 - SQLAlchemy raises ArgumentError, NoSuchModuleError, ValueError, ...
        refuse(error, where, _redacted(value), rule)
    if url.get_backend_name() == "sqlite" and url.database and "\x00" in url.database:
        refuse(error, where, _redacted(value), rule)
    return value


def _redacted(value: Any) -> Any:
    """A URL with anything between ``://user:`` and ``@`` hidden; other values as they are."""
    if not isinstance(value, str):
        return value
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", value)
