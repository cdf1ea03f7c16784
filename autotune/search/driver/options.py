"""The tuning options, declared once: each one's name, type, default, command-line checker and help.

Everything that takes them is built from ``TuningOptions``:

- the command line: ``autotune.commands.search.add_tuning_args`` adds ``--<name>`` for each option
  with a flag (``add_option_args``), its ``default``, ``type=`` checker and ``help`` from here, and
  ``tuning_options`` reads them back by the same names;
- the stages' keyword arguments: ``autotune.tune`` and ``tune_worker`` (``autotune/stages.py``),
  ``run`` and ``autotune.BundleGen.generate(gpu_customization=True, **tune_kwargs)``
  (``autotune/pipeline.py``) take them as ``**options`` (typed by ``TuneOptions``) and make a
  ``TuningOptions`` of them, which refuses an unknown name as Python would;
- the search: ``SearchSettings`` (``autotune.search.driver.bundles``) holds a ``TuningOptions``
  and the ``Session`` (``autotune.search.driver.session``) its checked strategy and values.

``--precision`` is every command's (``autotune.commands.add_precision_arg``, through
``AUTOTUNE_PRECISION``), so the tuning options declare it for the library only, as ``probe_env``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from autotune.checks import options as types

if TYPE_CHECKING:  # pragma: no cover
    from autotune.search.strategies.base import Strategy

__all__ = ["DEFAULT_TIMEOUT", "TuneOptions", "TuningOptions", "add_option_args", "option_flag"]

DEFAULT_TIMEOUT = 300.0


def _option(default: Any, help: str | None = None, type: Callable[[str], Any] | None = None) -> Any:
    """A field of ``TuningOptions``: ``help`` None keeps it off the command line."""
    return field(default=default, metadata={"help": help, "type": type})


@dataclass(frozen=True)
class TuningOptions:
    """How to tune (``autotune.tune``'s keyword arguments; see there for each)."""

    device: str = _option("auto", "where probes run: cpu or cuda:N (default: the first GPU if there is one, else cpu)",
                          types.device)
    memory_limit: int | str | None = _option(None, "e.g. 8GiB; default the device's total memory", types.size)
    storage: str | None = _option(None, "the Optuna storage: an SQLAlchemy URL, grpc://HOST:PORT (autotune proxy) or journal:///PATH (default sqlite under studies/)",
                                  types.storage)
    # a name (the command line's) or a ``Strategy`` object (``autotune.search.strategies``), resolved once by
    # ``autotune.search.strategies.registry.strategy_of``
    strategy: str | Strategy = _option("fast", "fast (default), tpe (Auto3DSeg baseline) or estimate (no probes)")
    objective: str = _option("max-batch", "max-batch (default: the largest batch that fits) or throughput (the "
                             "fastest that fits; a smaller batch wins only if its advantage survives a repeated "
                             "measurement)")
    handoff: str = _option("goodput", "the batch handed to training: goodput (default: the template's batch unless "
                           "the largest fit is measured faster to a target accuracy, see docs/handoff.md) or "
                           "largest (the largest fit)")
    margin: float = _option(0.10, "share of the limit kept free (default 0.10)", types.fraction())
    timeout: float = _option(DEFAULT_TIMEOUT, "seconds before a probe is killed (default 300)", types.seconds())
    target_gpu: str | None = _option(None, "with --strategy estimate: a catalogue GPU, e.g. a100-80gb")
    target_memory: str | None = _option(None, "with --strategy estimate: memory of a GPU not in the catalogue",
                                        types.size_text)
    precision: str = _option("auto")
    probe_env: Mapping[str, str] | None = _option(None)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every option's name, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def cli_names(cls) -> tuple[str, ...]:
        """The options the command line takes (those with a help text), in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata["help"] is not None)

    @classmethod
    def of(cls, options: Mapping[str, Any], where: str = "tune") -> TuningOptions:
        """``options`` (keyword arguments) as ``TuningOptions``; the others keep their defaults.

        Raises:
            TypeError: a name that is not an option, as Python says it for a keyword argument.
        """
        unknown = sorted(set(options) - set(cls.names()))
        if unknown:
            raise TypeError(f"{where}() got unexpected keyword arguments: {', '.join(unknown)}")
        return cls(**options)

    def replace(self, **changes: Any) -> TuningOptions:
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)


# ``TuningOptions``' fields as keyword arguments (``**options: Unpack[TuneOptions]``), each optional
TuneOptions = TypedDict(  # type: ignore[misc]  # built from the one declaration
    "TuneOptions", {f.name: f.type for f in dataclasses.fields(TuningOptions)}, total=False)


def option_flag(name: str) -> str:
    """The command-line flag of option ``name`` (``memory_limit`` -> ``--memory-limit``)."""
    return "--" + name.replace("_", "-")


def add_option_args(group: Any, names: tuple[str, ...]) -> None:
    """Add the options ``names`` (each with a help text) to an argparse ``group``: flag, default, checker, help."""
    declared = {f.name: f for f in dataclasses.fields(TuningOptions)}
    for name in names:
        one = declared[name]
        if one.metadata["help"] is None:
            raise ValueError(f"tuning option {name} has no command-line flag")
        extra = {"type": one.metadata["type"]} if one.metadata["type"] is not None else {}
        group.add_argument(option_flag(name), default=one.default, help=one.metadata["help"], **extra)
