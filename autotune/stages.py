"""The tuning stages as library functions: ``tune``, ``tune_worker``, ``verify``.

They take keyword arguments with the CLI's defaults (``device="auto"``: the first GPU, else the
CPU; ``precision="auto"``), each tuning option declared once with its default in
``autotune.search.driver.options.TuningOptions``, return the tuning records and raise
``autotune.errors`` subclasses;
the CLI's handlers (``autotune/commands/search.py``) only parse arguments, call these and print.
They sit above ``autotune.search`` and ``autotune.bundles``: ``autotune.BundleGen``
(``autotune.pipeline``) tunes with ``tune``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import ConfigError, SpecError
from autotune.search.driver.options import TuneOptions, TuningOptions
from autotune.utils import expand_path, read_yaml

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["TuneOptions", "TuningOptions", "check_tune_kwargs", "check_tuning", "find_bundles", "load_specs", "tune", "tune_worker",
           "verify"]

Progress = Callable[[str], None]
PathLike = str | os.PathLike[str]


def stderr_lines(line: str) -> None:
    """The default ``progress``: each line to stderr, at once."""
    print(line, file=sys.stderr, flush=True)


def _quiet(_line: str) -> None:
    return None


def load_specs(specs: Mapping[str, Any] | PathLike | None) -> dict[str, Any]:
    """Auto3DSeg ``gpu_customization_specs`` as a mapping, a YAML file or None -> a new dict ({} for None); one read
    from a file is a ``SpecsFile``, whose errors name the file.

    Raises:
        SpecError: the file cannot be read or its top level is not a mapping.
    """
    from autotune.search.strategies.space import SpecsFile

    if specs is None:
        return {}
    if isinstance(specs, SpecsFile):
        return SpecsFile(specs, specs.source)
    if isinstance(specs, Mapping):
        return dict(specs)
    loaded = read_yaml(expand_path(specs, SpecError), SpecError)
    if loaded is not None and not isinstance(loaded, Mapping):
        raise SpecError(f"{specs}: specs must be a mapping of 'universal' or algorithm names")
    return SpecsFile(loaded or {}, str(specs))  # its errors name the file


def tune(
    bundles: Sequence[PathLike],
    specs: Mapping[str, Any] | PathLike | None = None,
    *,
    summary_path: PathLike | None = None, workers_share: bool = False, write_back: bool = True,
    progress: Progress | None = stderr_lines,
    **options: Unpack[TuneOptions],
) -> list[dict[str, Any]]:
    """Tune ``bundles`` and write the tuned values (with the ``tuning:`` plan) into each.

    ``options`` are the tuning options (``TuningOptions``, where each one's default is declared; the CLI's
    ``--device``, ``--memory-limit``, ... are built from the same declaration).

    Args:
        bundles: bundle folders made by ``generate`` (folds of one algorithm share one search).
        specs: Auto3DSeg-style ``gpu_customization_specs`` (``universal`` or per algorithm:
            ``num_trials``, ``range_num_images_per_batch``, ``range_num_sw_batch_size``,
            ``validation_devices``), as a mapping or a YAML file.
        device: where probes run: ``auto`` (default: the first GPU, else the CPU), ``cpu`` or ``cuda:N``.
        memory_limit: bytes or a size such as ``"8GiB"``; default the device's total memory.
        storage: SQLAlchemy URL of the Optuna storage; default SQLite under ``studies/``.
        strategy: a ``Strategy`` object (``autotune.search.strategies``: ``FastStrategy()``,
            ``FastStrategy(estimates_only=True)``, ``TpeStrategy()`` or a subclass of one's own) or the name of a
            shipped one: ``fast`` (default), ``tpe`` (the Auto3DSeg baseline) or ``estimate`` (no probes).
        objective: ``max-batch`` (default: the largest batch that fits) or ``throughput`` (the fastest that fits).
        handoff: the batch handed to training: ``goodput`` (default: the template's batch unless the largest fit
            is measured faster to a target accuracy by more than the noise) or ``largest`` (the search's batch).
        margin: share of the limit kept free (default 0.10).
        timeout: seconds before a probe is killed (default 300).
        precision: ``auto`` (default: mixed precision where the device runs it natively), ``fp32``, ``bf16`` or
            ``fp16``.
        target_gpu: with ``strategy="estimate"``: a catalogue GPU to plan for, e.g. ``a100-80gb``.
        target_memory: with ``strategy="estimate"``: the memory of a GPU not in the catalogue.
        summary_path: where to write the JSON summary (``{"results": [...]}``).
        workers_share: other workers tune from the same storage (see ``tune_worker``).
        write_back: write the tuned values into the bundles (False: only return and store them).
        probe_env: extra environment for the probe children.
        progress: called with one line per step; None for silence.

    Returns:
        One record per bundle: ``bundle``, ``status`` (``tuned``, ``infeasible`` or ``unsupported``),
        the tuned values, the measured peak and the limit.

    Raises:
        SpecError: bad specs, strategy, objective, hand-off, margin, precision, target or memory limit.
        ConfigError: a bundle is missing or malformed. StorageError: the storage cannot be used.
        TypeError: an option that is not one (as for any unexpected keyword argument).
    """
    from autotune.device import resolve_device
    from autotune.precision import precision_scope
    from autotune.search import SearchSettings, resolve_target, search_bundles

    chosen = TuningOptions.of(options)
    with precision_scope(chosen.precision):
        chosen = chosen.replace(device=resolve_device(chosen.device))
        target = resolve_target(chosen.strategy, chosen.target_gpu, chosen.target_memory, chosen.device)
        settings = SearchSettings(chosen, target=target, workers_share=workers_share, write_back=write_back)
        return search_bundles(list(bundles), load_specs(specs), settings, progress or _quiet, summary_path)


def check_tuning(specs: Mapping[str, Any] | PathLike | None, algos: Sequence[str], **options: Any) -> None:
    """``tune``'s specs and options for bundles of ``algos`` checked, the storage as far as it can be without a
    write, writing nothing: ``run`` asks this before its analysis writes the first file.

    Raises:
        What ``tune`` raises for them (SpecError, StorageError).
    """
    from autotune.device import resolve_device
    from autotune.precision import precision_scope
    from autotune.search import SearchSettings, check_method, resolve_target

    chosen = TuningOptions.of({k: v for k, v in options.items() if k in TuningOptions.names()})
    with precision_scope(chosen.precision):
        chosen = chosen.replace(device=resolve_device(chosen.device))
        target = resolve_target(chosen.strategy, chosen.target_gpu, chosen.target_memory, chosen.device)
        check_method(load_specs(specs), algos, SearchSettings(chosen, target=target))


def check_tune_kwargs(kwargs: Mapping[str, Any], where: str = "tune") -> TuningOptions:
    """``tune``'s keyword arguments checked before any work: the tuning options among them (the others are
    ``tune``'s own, such as ``summary_path`` and ``progress``).

    Raises:
        TypeError: a name that is neither (as for any unexpected keyword argument).
    """
    import inspect

    own = {p.name for p in inspect.signature(tune).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    return TuningOptions.of({k: v for k, v in kwargs.items() if k not in own}, where)


def find_bundles(work_dir: PathLike, algos: str | Sequence[str] | None = None) -> list[str]:
    """Bundle folders under ``work_dir`` (those holding ``configs/hyper_parameters.yaml``), sorted.

    Raises:
        ConfigError: no such folder, an unknown algorithm, or no bundle in it.
    """
    from autotune.bundles.templates import list_templates
    from autotune.facade.bundlegen import parse_algos

    root = Path(work_dir)
    if not root.is_dir():
        raise ConfigError(f"{root}: work folder not found; run 'autotune generate' first")
    bundles = sorted(str(p.parent.parent) for p in root.glob("*/configs/hyper_parameters.yaml"))
    if algos:
        wanted = set(parse_algos(algos, list_templates()))
        bundles = [b for b in bundles if Path(b).name.rsplit("_", 1)[0] in wanted]
    if not bundles:
        raise ConfigError(f"{root}: no bundles found; run 'autotune generate --work-dir {root}' first")
    return bundles


def tune_worker(
    work_dir: PathLike,
    algos: str | Sequence[str] | None = None,
    specs: Mapping[str, Any] | PathLike | None = None,
    *,
    progress: Progress | None = stderr_lines,
    **options: Unpack[TuneOptions],
) -> list[dict[str, Any]]:
    """Tune the bundles in ``work_dir`` together with other workers on the same storage.

    Each tuning key is searched by one worker at a time; a worker that dies is taken over
    once its heartbeat is stale. ``options`` are ``tune``'s (``storage``, ``device``, ...).

    Raises:
        ConfigError: no bundles in ``work_dir``; and what ``tune`` raises.
    """
    return tune(find_bundles(work_dir, algos), specs, workers_share=True, progress=progress, **options)


def verify(
    bundle: PathLike,
    *,
    device: str = TuningOptions.device,
    memory_limit: int | str | None = None,
    storage: str | None = TuningOptions.storage,
    timeout: float = TuningOptions.timeout,
    retune: bool = True,
    precision: str = TuningOptions.precision,
    probe_env: Mapping[str, str] | None = TuningOptions.probe_env,
    progress: Progress | None = stderr_lines,
) -> dict[str, Any]:
    """Probe a tuned (or planned) bundle on ``device``; set its provenance to ``measured`` when the plan holds.

    Returns:
        The report: ``holds`` (bool), ``estimate_error``, and ``retuned`` (the new tuning record)
        when the plan failed and ``retune`` is set.

    Raises:
        ConfigError: the bundle was never tuned. SpecError: the limit is above the device's memory.
    """
    from autotune.bundles.config import load_bundle
    from autotune.device import resolve_device
    from autotune.precision import precision_scope
    from autotune.search import verify_plan

    with precision_scope(precision):
        return verify_plan(load_bundle(bundle), device=resolve_device(device), memory_limit=memory_limit,
                           storage=storage, timeout=timeout, retune=retune, probe_env=probe_env,
                           say=progress or _quiet)
