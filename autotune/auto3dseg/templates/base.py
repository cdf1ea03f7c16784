"""The base class of MONAI's templates in autotune (``MonaiTemplate``) and the config reader it reads with.

Everything autotune does differently for one of MONAI's Auto3DSeg templates is a method or an attribute of
that template's ``MonaiTemplate`` subclass, one module per template in ``autotune.auto3dseg.templates``,
registered once in its registry (``autotune.auto3dseg.templates``). The shared modules of
``autotune.auto3dseg`` (``view``, ``build``, ``workload``, ``writeback``, ``launcher``, ``bundlegen``) and the
MONAI family (``autotune.families.monai``) ask the registry for a bundle's template and call these; none of
them tells the templates apart by name.

This module imports nothing of ``autotune.auto3dseg`` (the template modules and ``recognise`` sit on it), nor
torch or MONAI at import time.
"""

from __future__ import annotations

import contextlib
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from autotune.errors import ConfigError
from autotune.utils import plain_data

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

__all__ = ["MonaiTemplate", "ConfigReader", "TemplateVersion", "KnownVersion", "known_version", "file_sha256"]

#: one version of a template: the ``configs/`` files it writes and ``scripts/<file>`` -> SHA-256
KnownVersion = tuple[tuple[str, ...], Mapping[str, str]]


def known_version(configs: tuple[str, ...], files: Mapping[str, str]) -> KnownVersion:
    """A version's entry in ``MonaiTemplate.versions`` (as ``benchmarks/monai_template_hashes.py`` prints it)."""
    return tuple(configs), dict(files)


@dataclass(frozen=True)
class TemplateVersion:
    """One version of one template: its name, version, config file names and file hashes."""

    name: str
    version: str
    configs: tuple[str, ...]
    files: Mapping[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class ConfigReader:
    """A bundle's configs as MONAI's ``ConfigParser`` resolves them, each failure one line naming the key.

    Args:
        parser: MONAI's ``ConfigParser`` over the bundle's ``configs/`` (``autotune.auto3dseg.view.read_parser``).
        where: the ``configs/`` folder, for messages.
    """

    def __init__(self, parser: Any, where: Path) -> None:
        self.parser = parser
        self.where = where

    def has(self, key: str) -> bool:
        """True when the configs hold ``key`` (``a#b`` for a nested one)."""
        return key in self.parser

    def get(self, key: str, default: Any = None) -> Any:
        """``key`` resolved (expressions and references evaluated); ``default`` when the configs lack it."""
        if key not in self.parser:
            return default
        try:
            return self.parser.get_parsed_content(key)
        except Exception as exc:  # noqa: BLE001 - MONAI raises several kinds for a bad expression
            raise ConfigError(f"{self.where}: MONAI cannot resolve key {key!r} ({type(exc).__name__}: {exc})") from exc

    def raw(self, key: str) -> Any:
        """``key`` as written (not resolved); None when the configs lack it."""
        return self.parser.get(key) if key in self.parser else None

    def section(self, key: str) -> dict[str, Any]:
        """A ``_target_`` section resolved to plain data: ``{"name": target, "args": {...}}``."""
        try:
            resolved = self.parser.get_parsed_content(key, instantiate=False).get_config()
        except Exception as exc:  # noqa: BLE001
            raise ConfigError(f"{self.where}: MONAI cannot resolve section {key!r} ({type(exc).__name__}: {exc})"
                              ) from exc
        args = {k: v for k, v in dict(resolved).items() if k != "_target_"}
        return {"name": str(resolved.get("_target_")).rsplit(".", 1)[-1], "args": plain_data(args, str_other=True)}

    def xyz(self, value: Any, key: str, kind: type = int) -> list[Any]:
        """``value`` (read from ``key``) as three numbers of ``kind``."""
        if not (isinstance(value, (list, tuple)) and len(value) == 3):
            raise ConfigError(f"{self.where}: key {key!r} must be three numbers, got {value!r}")
        return [kind(v) for v in value]


class MonaiTemplate(ABC):
    """One of MONAI's Auto3DSeg templates: what autotune reads, builds, runs and writes for its bundles.

    The contract, for each bundle recognised as this template (``autotune.auto3dseg.recognise``):

    - ``name``: the template's name, as MONAI's ``BundleAlgo`` and the recognised version give it;
    - ``versions``: the versions autotune knows, by the SHA-256 of their scripts (how a bundle is recognised:
      ``autotune.auto3dseg.recognise``; computed from the templates by ``benchmarks/monai_template_hashes.py``);
    - ``spec_aliases``: other keys MONAI's own template reads its ``gpu_customization_specs`` under;
    - ``keys``: each tunable (``autotune.tunables``) -> the ``hyper_parameters.yaml`` keys (``a#b``) it is
      written to;
    - ``prepare_parser``: changes to MONAI's parser before anything is resolved (DiNTS's architecture code);
    - ``view_values``: the plain values of the view (``autotune.auto3dseg.view.load_view``): batch, roi,
      channels, sliding window, learning rate, the ``network``/``loss``/``optimizer`` sections, ...;
    - ``updates``: the write-back, autotune's plain updates -> ``hyper_parameters.yaml`` keys and values;
    - ``build``: (network, loss, optimizer section, training accuracy) as the template's scripts build them,
      the optimizer section a MONAI ``ConfigItem`` (``instantiate(params=...)``); ``static_topology``: paths
      the estimator's fake tensors can run; ``placed``: the network after its move to the device;
    - ``training_loop``: a generator running one loader batch of the template's loop per ``next``;
      ``validates_without_gradients``: the loop leaves no gradients for validation;
    - ``validate``: one validation case as the template runs it during training;
    - ``cpu_context``: the context its ``train.py`` runs in on the CPU (None: as it is);
    - ``generation_context``: the context around MONAI's generation of its bundles (None: none needed).

    An instance is stateless; the methods import torch and MONAI when called.
    """

    #: the template's name (``BundleAlgo.name``, the first part of a version's key)
    name: ClassVar[str]
    #: version (``MONAI_ALGO_HASH``) -> its config files and script hashes (``known_version``)
    versions: ClassVar[Mapping[str, KnownVersion]] = {}
    #: other names MONAI's own template reads its ``gpu_customization_specs`` under (its spelling)
    spec_aliases: ClassVar[tuple[str, ...]] = ()
    #: tunable -> the keys of ``configs/hyper_parameters.yaml`` it is written to
    keys: ClassVar[Mapping[str, tuple[str, ...]]]
    #: True when the template's training loop leaves the parameters without gradients (``param.grad = None``)
    validates_without_gradients: ClassVar[bool] = False

    def prepare_parser(self, parser: Any, root: Path, device: str, arch_sha256: str | None) -> None:
        """Change MONAI's ``parser`` over the bundle at ``root`` before anything is resolved, for ``device``
        (default: nothing to change)."""
        return None

    @abstractmethod
    def view_values(self, reader: ConfigReader) -> dict[str, Any]:
        """The plain values the search, the probe and the estimator read (see ``load_view``)."""

    @abstractmethod
    def updates(self, view: Mapping[str, Any], updates: Mapping[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
        """``hyper_parameters.yaml`` key (``a#b``) -> plain value for autotune's ``updates`` (``raw``: the file)."""

    def static_topology(self, parser: Any) -> None:
        """Make the network's data-dependent branches plain values, for the estimator's fake tensors (default:
        it has none)."""
        return None

    @abstractmethod
    def build(self, parser: Any, config: BundleConfig) -> tuple[Any, Any, Any, Any]:
        """(network, loss, optimizer section, accuracy) as the template builds them (accuracy None: none)."""

    def placed(self, model: Any, config: BundleConfig) -> Any:
        """The network as the template leaves it once on its device (a memory format, ...)."""
        return model

    @abstractmethod
    def training_loop(self, model: Any, loss_fn: Any, optimizer: Any, accuracy: Any, batch: Any,
                      num_patches_per_iter: int, amp_dtype: Any, config: BundleConfig) -> Iterator[None]:
        """The template's training loop over ``batch`` (one loader batch per iteration)."""

    @abstractmethod
    def validate(self, model: Any, volume: Any, label: Any, config: BundleConfig, sw_batch_size: int,
                 device: Any, amp_dtype: Any, accuracy: Any, score: bool) -> Any:
        """One validation case; ``score`` False: the sliding window's output alone."""

    def cpu_context(self) -> contextlib.AbstractContextManager[None] | None:
        """The context ``scripts/train.py`` runs in on the CPU (None: it runs as it is)."""
        return None

    def generation_context(self, algos: Any, tune_kwargs: Mapping[str, Any],
                           target_gpu_memory: Callable[[str], int] | None) -> contextlib.AbstractContextManager[None] | None:
        """The context around MONAI's generation of ``algos`` (MONAI's ``BundleAlgo`` objects, this template's
        among them) for ``autotune.tune``'s ``tune_kwargs`` (None: nothing needed)."""
        return None
