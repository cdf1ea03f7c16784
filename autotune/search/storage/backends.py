"""The storages a study may live in besides an SQL database: Optuna's gRPC storage proxy and its journal file.

- ``grpc://HOST:PORT``: a ``GrpcStorageProxy``, the client of a proxy server
  (``optuna.storages.run_grpc_proxy_server``, started with ``autotune proxy``) that holds the
  database connections for every worker. Thousands of workers cost the database one pool.
- ``journal:///PATH``: a ``JournalStorage`` over a ``JournalFileBackend``, an append-only log with a
  file lock; for workers that share a file system whose locks work (one host, or NFS with working
  locks), with no database server at all.

Every worker coordinates through Optuna's storage API alone (``autotune.search.storage.liveness`` and
``claims``), so the same worker runs on an SQLAlchemy URL, on the proxy and on a journal. A proxy that
is briefly gone (restarted) is ridden out like a database server (``autotune.search.storage.retry``).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import StorageError

if TYPE_CHECKING:  # pragma: no cover
    import optuna

__all__ = ["GRPC_SCHEME", "JOURNAL_SCHEME", "DEFAULT_PROXY_PORT", "storage_kind", "grpc_address", "journal_path",
           "open_grpc", "open_journal", "serve_proxy", "quiet_optuna"]

GRPC_SCHEME = "grpc://"
JOURNAL_SCHEME = "journal://"
DEFAULT_PROXY_PORT = 13000  # Optuna's default for run_grpc_proxy_server
READY_SECONDS = 10.0


def quiet_optuna() -> None:
    """Keep Optuna's INFO lines and its experimental-feature warnings out of the progress output."""
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def storage_kind(url: str) -> str:
    """``grpc``, ``journal`` or ``sql`` (an SQLAlchemy URL)."""
    if url.startswith(GRPC_SCHEME):
        return "grpc"
    if url.startswith(JOURNAL_SCHEME):
        return "journal"
    return "sql"


def grpc_address(url: str) -> tuple[str, int]:
    """(host, port) of ``grpc://HOST:PORT``.

    Raises:
        StorageError: no host, or a port that is not 1-65535.
    """
    host, _, port_text = url[len(GRPC_SCHEME):].rpartition(":")
    host = host.strip("[]")
    if not host or "/" in host or "@" in host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise StorageError(f"storage {url}: not a proxy address; give grpc://HOST:PORT, e.g. grpc://db-node:13000")
    return host, int(port_text)


def journal_path(url: str) -> Path:
    """The file of ``journal:///PATH`` (``journal://rel.log`` is relative to the working folder), absolute.

    Raises:
        StorageError: no path.
    """
    import os

    rest = url[len(JOURNAL_SCHEME):]
    if not rest.strip("/"):
        raise StorageError(f"storage {url}: no journal file; give journal:///PATH, e.g. journal:///shared/autotune.log")
    return Path(os.path.abspath(rest))


def _is_rpc_error(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] == "grpc" and callable(getattr(exc, "code", None))


def _rpc_failure(exc: BaseException, shown: str) -> StorageError:
    code = getattr(exc.code(), "name", str(exc.code()))  # type: ignore[attr-defined]
    details = " ".join(str(getattr(exc, "details", lambda: "")() or "").split())[:160]
    return StorageError(f"storage {shown}: the storage proxy answered {code} ({details}); see the proxy's log")


@functools.lru_cache(maxsize=1)
def _grpc_class() -> type:
    """``GrpcStorageProxy`` whose calls ride out a proxy that is briefly gone (UNAVAILABLE is retried with the
    database retry budget) and turn any other failure of the proxy into one ``StorageError``."""
    from optuna.storages import GrpcStorageProxy

    from autotune.search.storage.retry import retrying

    def wrap(method: Any) -> Any:
        @functools.wraps(method)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return retrying(lambda: method(self, *args, **kwargs), self.shown_url)
            except Exception as exc:
                if _is_rpc_error(exc):
                    raise _rpc_failure(exc, self.shown_url) from exc
                raise

        return call

    skip = {"close", "wait_server_ready", "remove_session", "check_trial_is_updatable"}
    methods = {name: wrap(getattr(GrpcStorageProxy, name)) for name in dir(GrpcStorageProxy)
               if not name.startswith("_") and name not in skip and callable(getattr(GrpcStorageProxy, name))}
    return type("RetryingGrpcStorageProxy", (GrpcStorageProxy,), methods)


def open_grpc(url: str) -> optuna.storages.BaseStorage:
    """The ``GrpcStorageProxy`` of ``grpc://HOST:PORT``, once its proxy answers.

    Raises:
        StorageError: grpcio is not installed, or no proxy answers there within 10 s.
    """
    host, port = grpc_address(url)
    quiet_optuna()  # GrpcStorageProxy is experimental in Optuna 5.0: its warning is not the user's business
    try:
        import grpc  # noqa: F401
    except ImportError as exc:
        raise StorageError(f"storage {url}: the gRPC client is not installed; pip install 'autotune[grpc]'") from exc
    storage = _grpc_class()(host=host, port=port)
    storage.shown_url = url
    try:
        storage.wait_server_ready(timeout=READY_SECONDS)
    except ConnectionError as exc:
        storage.close()
        raise StorageError(f"storage {url}: no storage proxy answers there within {READY_SECONDS:g} s; start it "
                           "next to the database (autotune proxy --storage DATABASE_URL --port PORT) or check "
                           "the address") from exc
    return storage


def open_journal(url: str) -> optuna.storages.BaseStorage:
    """The ``JournalStorage`` of ``journal:///PATH`` (the file is created when missing).

    Raises:
        StorageError: the file or its folder cannot be created or read.
    """
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from autotune.errors import HostWriteError
    from autotune.files import make_folder

    path = journal_path(url)
    try:
        make_folder(path.parent, "the journal's folder", f"(for {url})")
        storage = JournalStorage(JournalFileBackend(str(path)))
    except (OSError, HostWriteError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise StorageError(f"storage {url}: cannot open the journal file {path} ({reason}); give another --storage") \
            from exc
    storage.shown_url = url  # type: ignore[attr-defined]
    return storage


def serve_proxy(storage: optuna.storages.BaseStorage, host: str, port: int, threads: int) -> None:
    """Serve ``storage`` through Optuna's gRPC storage proxy (``optuna.storages.run_grpc_proxy_server``) on
    ``host:port`` with ``threads`` request threads, until the process is stopped.

    The storage is wrapped in Optuna's in-process cache (``optuna.storages.get_storage``), as Optuna
    advises for a proxy: finished trials are read from the database once. The proxy holds at most
    ``threads`` database connections in use at a time, whatever the number of workers.

    Raises:
        StorageError: grpcio is not installed, or the address is taken or not this machine's.
    """
    import socket
    from concurrent.futures import ThreadPoolExecutor

    try:
        import grpc  # noqa: F401
    except ImportError as exc:
        raise StorageError("the gRPC proxy needs grpcio; pip install 'autotune[grpc]'") from exc
    import optuna

    # gRPC binds with SO_REUSEPORT, so a second proxy on a taken port would start and share it: ask first
    try:
        with socket.create_server((host.strip("[]"), port), family=_family(host)):
            pass
    except OSError as exc:
        raise StorageError(f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc}); choose "
                           "another port, or a host address of this machine") from exc
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="autotune-proxy")
    optuna.storages.run_grpc_proxy_server(optuna.storages.get_storage(storage), host=host, port=port,
                                          thread_pool=pool)


def _family(host: str) -> int:
    import socket

    return socket.AF_INET6 if ":" in host else socket.AF_INET
