"""Optuna storage, tuning keys and studies.

One study per tuning key: what makes a measurement reusable. Folds of one algorithm
share a key, so fold 1..4 reuse fold 0's result with no new trials. The default
storage is an SQLite file under ``studies/`` (no server); any SQLAlchemy URL works
(PostgreSQL for many workers). Passwords in URLs are never printed.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import HostWriteError, StorageError
from autotune.search.storage.backends import quiet_optuna

if TYPE_CHECKING:  # pragma: no cover
    import optuna

    from autotune.bundles.model import BundleConfig

__all__ = [
    "STORAGE_ENV",
    "TuningKey",
    "default_storage_url",
    "redact_url",
    "open_storage",
    "quiet_optuna",
    "check_storage",
    "make_key",
    "open_study",
    "trial_id",
]

STORAGE_ENV = "AUTOTUNE_STORAGE"


def default_storage_url() -> str:
    """``$AUTOTUNE_STORAGE``, else ``sqlite:///<cwd>/studies/autotune.db``."""
    from autotune.checks.environment import setting

    env = setting(STORAGE_ENV)
    if env is not None:
        return str(env)
    return f"sqlite:///{(Path.cwd() / 'studies' / 'autotune.db').resolve()}"


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***``; safe to print and log."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL sqlalchemy can parse: strip anything between ':' and '@'
        head, sep, tail = url.rpartition("@")
        if not sep:
            return url
        scheme, _, creds = head.partition("://")
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***@{tail}"


def open_storage(url: str | None = None, pool: int | str | None = None) -> optuna.storages.BaseStorage:
    """Open (and create) the Optuna storage at ``url``: an SQLAlchemy URL (Optuna's RDB storage),
    ``grpc://HOST:PORT`` (Optuna's gRPC storage proxy) or ``journal:///PATH`` (Optuna's journal file,
    ``autotune.search.storage.backends``). Workers coordinate through the storage's API alone
    (``autotune.search.storage.liveness``, ``claims``), so any of them serves many workers.

    ``pool``: the database connections this process keeps (a server only): a number N (at most N at once),
    ``none`` (one per call, closed after it), default ``$AUTOTUNE_STORAGE_POOL``, else SQLAlchemy's (up to 15).

    Raises:
        StorageError: the URL is malformed, its driver is missing, the database is unreachable, or
            it cannot be opened for any other reason (the message holds the redacted URL).
    """
    from autotune.search.storage.backends import open_grpc, open_journal, storage_kind

    quiet_optuna()
    url = url or default_storage_url()
    kind = storage_kind(url)
    if kind != "sql":
        return open_grpc(url) if kind == "grpc" else open_journal(url)
    shown = redact_url(url)
    return _open_rdb(url, shown, _engine_kwargs(url, shown, pool))


def _engine_kwargs(url: str, shown: str, pool: int | str | None) -> dict[str, Any]:
    """SQLAlchemy's engine options for ``url``; an SQLite file's folder is created here."""
    if url.startswith("sqlite:///"):
        path = _sqlite_path(url)
        if path is not None:
            from autotune.files import make_folder

            try:
                make_folder(path.parent, "the storage folder", f"(for {shown})")
            except (OSError, HostWriteError) as exc:
                reason = getattr(exc, "strerror", None) or str(exc)
                raise StorageError(f"storage {shown}: cannot create {path.parent} ({reason}); pass --storage") from exc
        return {"connect_args": {"timeout": 60}}
    if url.startswith(("postgresql", "mysql")):
        return {"pool_pre_ping": True, "connect_args": {"connect_timeout": 10}, **_pool_kwargs(pool)}
    return {}


def _open_rdb(url: str, shown: str, engine_kwargs: dict[str, Any]) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage at ``url``, or one ``StorageError`` line saying why not (``open_storage``)."""
    import sqlalchemy.exc

    try:
        for attempt in range(4):
            try:
                return _rdb_storage(url, shown, engine_kwargs)
            except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError, sqlalchemy.exc.OperationalError) as exc:
                # runs started together on an empty database race to create the tables (SQLite says "table ...
                # already exists" as an OperationalError)
                racing = not isinstance(exc, sqlalchemy.exc.OperationalError) or "already exists" in str(exc)
                if attempt == 3 or not racing:
                    raise
                time.sleep(0.25 * (attempt + 1))
        raise AssertionError("unreachable")
    except (StorageError, HostWriteError):
        raise  # one line already (a refused write, a storage error)
    except (sqlalchemy.exc.ArgumentError, ValueError) as exc:
        raise StorageError(f"storage {shown}: not a valid SQLAlchemy URL; e.g. sqlite:///studies/autotune.db") from exc
    except ImportError as exc:  # optuna re-raises the driver's ModuleNotFoundError as a plain ImportError
        missing = exc if isinstance(exc, ModuleNotFoundError) else exc.__cause__
        name = getattr(missing, "name", None)
        driver = f"driver {name!r}" if name else "the database driver"
        raise StorageError(f"storage {shown}: {driver} is not installed; pip install it") from exc
    except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.DBAPIError) as exc:
        from autotune.search.storage.refusals import refusal_error, storage_refusal

        refusal = storage_refusal(exc)
        if refusal is not None:  # creating the database or its tables on a full or read-only disk
            raise refusal_error(refusal, shown) from exc
        reason = str(getattr(exc, "orig", exc)).strip().splitlines()[0] if str(getattr(exc, "orig", exc)).strip() else ""
        reason = reason.replace(url, shown)
        _refuse_if_full(exc, shown)
        raise StorageError(f"storage {shown}: cannot connect ({reason[:160]}); check the server and the URL") from exc
    except Exception as exc:  # noqa: BLE001 - anything else that keeps it closed (a schema of another Optuna version)
        _refuse_if_full(exc, shown)  # Optuna says a refused connection in its commit as StorageInternalError
        reason = " ".join(str(exc).replace(url, shown).split())[:160]
        raise StorageError(f"storage {shown}: cannot be opened ({type(exc).__name__}: {reason}); check the URL, or "
                           "give another storage") from exc


def _refuse_if_full(exc: BaseException, shown: str) -> None:
    """Raise the one line for a server whose connections are all taken, when ``exc`` is that."""
    from autotune.search.storage.retry import full_server_error, is_full

    if is_full(exc):
        raise full_server_error(shown, "(too many clients)") from exc


def _pool_kwargs(pool: int | str | None) -> dict[str, Any]:
    """SQLAlchemy's pool options for ``pool`` (see ``open_storage``)."""
    from autotune.checks.environment import setting

    pool = setting("AUTOTUNE_STORAGE_POOL") if pool is None else pool
    if pool is None:
        return {}
    if str(pool) == "none":
        import sqlalchemy.pool

        return {"poolclass": sqlalchemy.pool.NullPool}
    return {"pool_size": int(pool), "max_overflow": 0, "pool_timeout": 600}


def _sqlite_path(url: str) -> Path | None:
    """The file of an SQLite URL, absolute (``sqlite:///rel.db`` is relative to the working folder,
    ``sqlite:////abs.db`` absolute); None for an in-memory database."""
    from sqlalchemy.engine import make_url

    try:
        database = make_url(url).database
    except Exception:  # noqa: BLE001 - open_storage names a malformed URL
        return None
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(os.path.abspath(database))


def check_storage(url: str | None = None, *, must_exist: bool = False) -> None:
    """What opening the storage would refuse, found before anything is written, writing nothing itself: a
    malformed URL, a driver not installed, an SQLite or journal file that is a folder or whose folder cannot be
    created, a file there that is not a storage of its kind (``autotune.search.storage.kind``); a database server or a storage proxy is connected to (nothing is written there), so that one out
    of reach refuses now.

    Args:
        url: The storage URL (default ``default_storage_url()``).
        must_exist: Refuse an SQLite file that does not exist yet (a reader, such as the dashboard, creates
            no storage).

    Raises:
        StorageError: one line naming the storage (password hidden) and what to do.
    """
    import sqlalchemy
    import sqlalchemy.exc
    from sqlalchemy.engine import make_url

    from autotune.search.storage.backends import grpc_address, journal_path, storage_kind
    from autotune.search.storage.kind import check_journal_file, check_sqlite_file

    url = url or default_storage_url()
    if storage_kind(url) == "grpc":  # the proxy is asked whether it answers; nothing is written
        from autotune.search.storage.backends import open_grpc

        grpc_address(url)
        open_grpc(url).close()
        return
    if storage_kind(url) == "journal":
        _check_file(url, journal_path(url), must_exist, "journal file", "autotune.log")
        check_journal_file(url, journal_path(url))
        return
    shown = redact_url(url)
    try:
        parsed = make_url(url)
        parsed.get_dialect().import_dbapi()
    except ImportError as exc:
        raise StorageError(f"storage {shown}: driver {getattr(exc, 'name', None) or 'of the database'!r} is not "
                           "installed; pip install it") from exc
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy raises ArgumentError, NoSuchModuleError, ValueError
        raise StorageError(f"storage {shown}: not a valid SQLAlchemy URL; e.g. sqlite:///studies/autotune.db") from exc
    if parsed.get_backend_name() == "sqlite":
        path = _sqlite_path(url)
        if path is not None:
            _check_file(shown, path, must_exist, "database file", "autotune.db")
            check_sqlite_file(shown, path)
        return
    engine = sqlalchemy.create_engine(url, connect_args={"connect_timeout": 10})
    try:
        with engine.connect():
            pass
    except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.DBAPIError) as exc:
        reason = " ".join(str(getattr(exc, "orig", exc)).replace(url, shown).split())[:160]
        raise StorageError(f"storage {shown}: cannot connect ({reason}); check the server and the URL") from exc
    finally:
        engine.dispose()


def _check_file(shown: str, path: Path, must_exist: bool, what: str, example: str) -> None:
    """Refuse a storage file that is a folder, that is missing when it must exist, or whose folder cannot be
    created or written."""
    if path.is_dir():
        raise StorageError(f"storage {shown}: {path} is a folder; give the {what}, e.g. {path}/{example}")
    if must_exist and not path.is_file():
        raise StorageError(f"storage {shown}: no such {what} {path}; give the --storage that tuning "
                           "wrote to (the default is studies/autotune.db in the folder tune ran from)")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        why = "is not a folder" if not folder.is_dir() else "may not be written"
        raise StorageError(f"storage {shown}: cannot create the {what} there: {folder} {why}; give another "
                           "--storage")


def _rdb_storage(url: str, shown: str, engine_kwargs: dict[str, Any]) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage at ``url`` whose calls say a full disk as such; on a database server, one whose
    calls also ride out a restart (``autotune.search.storage.retry``)."""
    from autotune.search.storage.retry import rdb_storage_class

    storage = rdb_storage_class(retry=not url.startswith("sqlite"))(url, engine_kwargs=engine_kwargs)
    storage.shown_url = shown
    return storage


@dataclass(frozen=True)
class TuningKey:
    """Everything a measurement depends on; equal keys share one study."""

    algo: str
    template_version: int
    roi_size: tuple[int, ...]
    infer_volume_shape: tuple[int, ...]
    input_channels: int
    output_classes: int
    precision: str
    network_hash: str
    device_name: str
    device_total_memory: int
    memory_limit: int
    torch_version: str
    monai_version: str
    strategy: str
    objective: str = "max-batch"
    # how the key's studies hold their trials: one study per phase (training batch, inference point), so a
    # study's trials share one unit and its best trial is the phase's answer; tpe's joint study values a
    # point N + sw / SW_SCALE. Part of the digest: a study laid out otherwise is never read as this one.
    layout: str = "phase-studies"
    # bf16 on the CPU computes the loss's ops in float32 (autotune.autocast), which changes what a step
    # holds: such keys say so, so a study measured before never answers for them ('' for every other key)
    autocast: str = ""

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["roi_size"] = list(self.roi_size)
        data["infer_volume_shape"] = list(self.infer_volume_shape)
        if not self.autocast:
            del data["autocast"]  # the digests of the keys it does not concern stay as they were
        return data

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()[:12]

    @property
    def study_name(self) -> str:
        """The key's study: training trials (fast, estimate) or joint trials (tpe); it holds the result."""
        return f"autotune-{self.algo}-{self.strategy}-{self.digest}"

    @property
    def infer_study_name(self) -> str:
        """The study of the inference trials (sw batch, validation device) of the fast and estimate searches."""
        return f"{self.study_name}-infer"


def _section_hash(config: BundleConfig) -> str:
    """Network, loss and optimizer settings change memory: hash them into the key (each section as the bundle
    writes it, a default left out, so that a key's digest does not move with the model's defaults)."""
    parts: dict[str, Any] = {name: section.model_dump(exclude_unset=True)
                             for name, section in (("network", config.network), ("loss", config.loss),
                                                   ("optimizer", config.optimizer))}
    parts["num_crops_per_image"] = config.num_crops_per_image
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def make_key(config: BundleConfig, device: Mapping[str, Any], memory_limit: int, strategy: str,
             objective: str = "max-batch", joint: bool = False) -> TuningKey:
    """The tuning key of a bundle config on a device under a memory limit, for a strategy and objective.

    ``strategy``: its name in the key (``Strategy.key_name``); ``joint``: one trial sizes both phases in the
    key's study (``Strategy.joint``), else the phases have studies of their own."""
    import monai
    import torch

    from autotune.precision import for_config

    device_name = str(device.get("device") or "cpu")
    precision = for_config(config, device_name).name
    return TuningKey(
        algo=config.algo,
        template_version=config.template_version or 0,
        roi_size=tuple(config.roi_size),
        infer_volume_shape=tuple(config.infer_volume_shape or config.roi_size),
        input_channels=config.input_channels,
        output_classes=config.output_classes,
        precision=precision,
        network_hash=_section_hash(config),
        device_name=str(device["device_name"]),
        device_total_memory=int(device["device_total_memory"]),
        memory_limit=int(memory_limit),
        torch_version=str(torch.__version__),
        monai_version=str(monai.__version__),
        strategy=strategy,
        objective=objective,
        layout="joint-n-sw" if joint else "phase-studies",
        autocast="cpu-loss-fp32" if precision != "fp32" and device_name.startswith("cpu") else "",
    )


def open_study(
    storage: optuna.storages.BaseStorage, key: TuningKey, sampler: optuna.samplers.BaseSampler | None = None,
    phase: str | None = None, metric: str | None = None,
) -> optuna.Study:
    """Create or load a study of ``key``; the key is stored as the study's user attribute ``tuning_key``.

    ``phase``: ``train`` (the key's study, the default), ``infer`` (its sibling ``<name>-infer``) or ``joint``
    (one trial sizes both phases: ``Strategy.phase`` of a tpe search). ``metric``: the name
    of the trial values (the dashboard's axis), set when the study is created.
    """
    import optuna

    phase = phase or "train"
    study = optuna.create_study(
        storage=storage,
        study_name=key.infer_study_name if phase == "infer" else key.study_name,
        direction="maximize",
        sampler=sampler,
        load_if_exists=True,
    )
    if metric and not study.metric_names:
        study.set_metric_names([metric])
    attrs = study.user_attrs
    if "phase" not in attrs:
        study.set_user_attr("phase", phase)
    if "tuning_key" not in attrs:  # one attribute (the dashboard shows it whole): one write, not one per field
        study.set_user_attr("tuning_key", key.as_dict())
    return study


def trial_id(storage: optuna.storages.BaseStorage, study: optuna.Study, number: int) -> int:
    """The storage's id of trial ``number`` of ``study`` (what ``BaseStorage`` methods take)."""
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name), number)
