"""The whole job as one library function, ``run``, and the ``generate`` stage.

    import autotune

    result = autotune.run("/data/Task04_Hippocampus", "work", algos="segresnet,dints", num_fold=2,
                          memory_limit="16GiB")
    result.tuned_bundles        # bundle folders holding tuned values
    result.tuning               # one tuning record per bundle (as autotune_summary.json holds)

Each function takes keyword arguments with the CLI's defaults, returns data and raises
``autotune.errors`` subclasses; the CLI's handlers in ``autotune/commands/`` only parse
arguments, call these and print. This module sits above ``autotune.bundles`` and
``autotune.search``: generating and tuning meet here (``BundleGen``, the factory of a
template family's generator whose ``gpu_customization`` tunes, is assembled here), so neither
package imports the other.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

from autotune.errors import SpecError
from autotune.facade.bundlegen import BundleGen as _BundleGen
from autotune.stages import (
    PathLike,
    Progress,
    TuneOptions,
    TuningOptions,
    check_tune_kwargs,
    check_tuning,
    stderr_lines,
    tune,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from autotune.bundles.templates import Overrides
    from autotune.families import TemplateFamily

__all__ = ["AutotuneBundleGen", "BundleGen", "GenerateOptions", "RunOptions", "RunResult", "generate", "generator_family",
           "run"]

SUMMARY_NAME = "autotune_summary.json"
_DONE = ("tuned", "unsupported")  # statuses of a bundle the tuner finished with


def _quiet(_line: str) -> None:
    return None


class AutotuneBundleGen(_BundleGen):
    """autotune's ``BundleGen`` over its own templates, ``generate(..., gpu_customization=True)`` tuning with
    ``autotune.tune``: what ``BundleGen`` makes for the ``autotune`` family.

    The same as ``autotune.facade.bundlegen.BundleGen`` (see there for the arguments) with
    ``tune`` as its tuner; ``generate``'s extra keyword arguments (``device``, ``memory_limit``,
    ``storage``, ``strategy``, ``progress``, ...) go to ``tune``: a name that is not one of its
    options (``autotune.stages.TuningOptions``) fails before any bundle is written.
    """

    tuner = staticmethod(tune)

    def generate(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        import inspect

        bound = inspect.signature(_BundleGen.generate).bind(self, *args, **kwargs).arguments
        if bound.get("gpu_customization"):  # the specs, options and storage refuse before any bundle is written
            tune_kwargs = bound.get("tune_kwargs") or {}
            check_tune_kwargs(tune_kwargs, "generate")
            check_tuning(bound.get("gpu_customization_specs"), self.algos, **tune_kwargs)
        return super().generate(*args, **kwargs)


def BundleGen(  # MONAI Auto3DSeg's class name: scripts written for MONAI call it as they call MONAI's
    algo_path: PathLike = ".",
    algos: str | Sequence[str] | None = None,
    templates_path_or_url: PathLike | None = None,
    data_stats_filename: PathLike | None = None,
    data_src_cfg_name: PathLike | None = None,
    *,
    family: str = "auto",
    templates_path: PathLike | None = None,
    **options: Any,
) -> Any:
    """MONAI Auto3DSeg's ``BundleGen``, called as MONAI's is: ``generate(..., gpu_customization=True)`` tunes with
    ``autotune.tune``.

    Which templates generate is ``family``: ``"autotune"`` gives an ``AutotuneBundleGen`` over autotune's
    templates, ``"monai"`` an ``autotune.auto3dseg.MonaiBundleGen`` (MONAI's own ``BundleGen``, its layout and
    ``get_history()``) over MONAI's; ``"auto"`` (the default) tells them from the templates
    (``generator_family``: a URL, or a folder of ``<algo>/scripts/algo.py``, is MONAI's), so a script written
    for MONAI's ``BundleGen`` keeps its call.

    Args:
        algo_path: the work folder (where ``datastats.yaml`` and ``data_src.yaml`` live by default).
        algos: ``None`` for every template, a name, a comma-separated string or a list.
        templates_path_or_url: the templates (MONAI's name for it; ``templates_path`` is taken too); None:
            autotune's shipped templates (for ``family="monai"``: MONAI's default download).
        data_stats_filename: the ``datastats.yaml`` written by ``autotune analyze``.
        data_src_cfg_name: the data source config (``data_src.yaml``, or an Auto3DSeg ``input.yaml``).
        family: ``"auto"``, ``"autotune"`` or ``"monai"`` (keyword only).
        **options: the generator's other arguments: ``tuner`` (default ``autotune.tune``); MONAI's
            ``mlflow_tracking_uri`` and ``mlflow_experiment_name`` for MONAI's templates.

    Raises:
        ConfigError: an unknown ``family`` or algorithm, or a missing file.
    """
    templates = templates_path_or_url if templates_path_or_url is not None else templates_path
    tuner = options.pop("tuner", tune)
    arguments = {"algo_path": algo_path, "algos": algos, "templates_path_or_url": templates,
                 "data_stats_filename": data_stats_filename, "data_src_cfg_name": data_src_cfg_name, **options}
    generator = generator_family(templates, family).bundle_generator(
        (), {**arguments, "target_gpu_memory": _target_gpu_memory}, tuner)
    if generator is not None:  # the family's own BundleGen (MONAI's templates: MONAI's), tuned by autotune
        return generator
    return AutotuneBundleGen(tuner=tuner, **arguments)


def generator_family(templates: PathLike | None, family: str = "auto") -> TemplateFamily:
    """The template family ``BundleGen`` generates with: the one named ``family``, or for ``"auto"`` the one whose
    templates ``templates`` are (MONAI's: a URL, or a folder of ``<algo>/scripts/algo.py``; else autotune's).

    Raises:
        ConfigError: ``family`` is neither ``"auto"`` nor a family's name (``autotune.families.FAMILIES``).
    """
    from autotune.families import FAMILIES, family_of_templates
    from autotune.utils import look_up_option

    named = {known.name: known for known in FAMILIES}
    if look_up_option(family, ["auto", *named], "BundleGen family") == "auto":
        return family_of_templates(templates)
    return named[family]


def _target_gpu_memory(name: str) -> int:
    """A catalogue GPU's memory (``target_gpu``), for MONAI's templates that size their batch when generated."""
    from autotune.search import resolve_target

    return int((resolve_target("estimate", name, None, "cpu") or {})["memory"])


def generate(
    input: PathLike,
    work_dir: PathLike,
    *,
    algos: str | Sequence[str] | None = None,
    num_fold: int = 5,
    templates: PathLike | None = None,
    overrides: Mapping[str, Any] | PathLike | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Analyse ``input`` into ``work_dir`` (skipped when up to date), then write ``<algo>_<fold>/`` bundles.

    Args:
        input: an ``input.yaml``, a datalist ``.json`` or a Decathlon task folder.
        work_dir: where ``datastats.yaml``, ``datalist.json`` and the bundles go.
        algos: None (every template), a name, a comma-separated string or a list.
        num_fold: folds 0..num_fold-1 get a bundle each.
        templates: a folder of ``<algo>/template.yaml`` (default the shipped templates).
        overrides: a preset name (``"tiny"``), a YAML file or a mapping merged into every config.
        progress: print what the analysis does (stderr).

    Returns:
        The bundles: dicts with ``identifier``, ``algo``, ``fold`` and ``path``.

    Raises:
        InputError / DataError: the dataset is unusable. ConfigError: an unknown algorithm or
        preset, or a template that does not fit the data. SpecError: a bad ``num_fold``.
    """
    from autotune.bundles.templates import load_overrides

    if not isinstance(num_fold, int) or isinstance(num_fold, bool) or num_fold < 1:
        raise SpecError(f"num_fold must be a positive integer, got {num_fold!r}")
    overrides = load_overrides(overrides)  # bad overrides fail before the analysis (and before it is imported)
    pending, gen = _checked_generation(input, work_dir, algos, num_fold, templates, progress, overrides)
    from autotune.facade.bundlegen import data_src_entry

    rendered = gen.render(gen.algo_path, pending.datastats(), pending.result.content_hash,
                          data_src_entry(pending.source, pending.result.datalist), num_fold, overrides)
    pending.write()  # every check has passed: the analysis, then the bundles
    return gen.write(rendered)


def _checked_generation(input: PathLike, work_dir: PathLike, algos: str | Sequence[str] | None, num_fold: int,
                        templates: PathLike | None, progress: bool, overrides: Overrides) -> tuple[Any, _BundleGen]:
    """The analysis checked and computed but not written, and the generator of the named algorithms; the folds
    checked against ``num_fold`` (a fold without a case refuses, before anything is written), and the overrides'
    keys against the templates (before the analysis reads a case)."""
    from autotune.bundles.override_keys import check_override_keys
    from autotune.data.analyze import DATA_SRC, DATASTATS, prepare_analysis
    from autotune.data.datalist import load_data_source
    from autotune.data.source import check_folds

    work = Path(work_dir)
    gen = _BundleGen(work, algos=algos, templates_path=templates, data_stats_filename=work / DATASTATS,
                     data_src_cfg_name=work / DATA_SRC)  # unknown algorithms or templates refuse here
    check_override_keys(overrides, gen.algos, overrides.source, templates)
    check_folds(load_data_source(input, num_fold=num_fold), num_fold)  # before any case is read
    return prepare_analysis(input, work, num_fold=num_fold, progress=progress), gen


class GenerateOptions(TypedDict, total=False):
    """``generate``'s keyword arguments (see there), as ``run`` passes them on."""

    algos: str | Sequence[str] | None
    num_fold: int
    templates: PathLike | None
    overrides: Mapping[str, Any] | PathLike | None


class RunOptions(GenerateOptions, TuneOptions, total=False):
    """``run``'s keyword arguments for ``generate`` and for ``tune``."""


@dataclass
class RunResult:
    """What ``run`` did.

    Attributes:
        work_dir: the work folder (``datastats.yaml``, ``datalist.json``, the bundles).
        bundles: the generated bundles (``identifier``, ``algo``, ``fold``, ``path``).
        tuning: one tuning record per bundle, as ``summary_path`` holds them.
        summary_path: ``<work_dir>/autotune_summary.json``.
        trained: identifier -> training summary (``best_metric``, ``model_dir``, ...) of each trained bundle.
    """

    work_dir: Path
    bundles: list[dict[str, Any]]
    tuning: list[dict[str, Any]]
    summary_path: Path
    trained: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every bundle tuned (or its template does not support tuning)."""
        return all(record.get("status") in _DONE for record in self.tuning)

    @property
    def tuned_bundles(self) -> list[str]:
        """The bundle folders that hold tuned values."""
        return [str(record["bundle"]) for record in self.tuning if record.get("status") == "tuned"]


def run(
    input: PathLike, work_dir: PathLike, *, specs: Mapping[str, Any] | PathLike | None = None, train: bool = False,
    epochs: int | None = None, max_time: float | str | None = None, folds: Collection[int] | None = None,
    progress: Progress | None = stderr_lines, on_tuned: Callable[[list[dict[str, Any]], Path], None] | None = None,
    **options: Unpack[RunOptions],
) -> RunResult:
    """The whole job: analyse, generate, tune, write ``autotune_summary.json``; with ``train``, train.

    Rerunning resumes: an up-to-date analysis is skipped and finished tuning points are read
    back from the storage.

    Args:
        input: an ``input.yaml``, a datalist ``.json`` or a Decathlon task folder.
        work_dir: where the analysis, the bundles and ``autotune_summary.json`` go.
        specs: the tuning specs, as ``tune`` takes them.
        train: train the bundles after tuning (on the tuning device).
        epochs: epochs per bundle (default the config's ``num_epochs``).
        max_time: time budget per bundle: seconds or a duration such as ``"30m"`` (checked first).
        folds: which folds to train (default all generated).
        progress: called with one line per step; None for silence (and no progress bars).
        on_tuned: called with the tuning records and the summary path when tuning ends, before
            any training (the CLI prints its table there).
        **options: ``generate``'s (``algos``, ``num_fold``, ``templates``, ``overrides``) and
            ``tune``'s keyword arguments (``device``, ``memory_limit``, ``storage``, ``strategy``,
            ``objective``, ``margin``, ``timeout``, ``target_gpu``, ...).

    Returns:
        A ``RunResult``: the bundles, their tuning records and, with ``train``, the training summaries.

    Raises:
        What ``generate``, ``tune`` and ``autotune.train`` raise (all ``AutotuneError``).
    """
    from autotune.device import resolve_device
    from autotune.precision import precision_scope
    from autotune.trainer.runner import parse_duration

    unknown = sorted(set(options) - RunOptions.__optional_keys__)
    if unknown:  # before the analysis, not after it when tune() would refuse them
        raise TypeError(f"run() got unexpected keyword arguments: {', '.join(unknown)}")
    say = progress or _quiet
    seconds = parse_duration(max_time) if max_time is not None else None
    with precision_scope(options.get("precision", TuningOptions.precision)):
        device = options["device"] = resolve_device(options.get("device", TuningOptions.device))
        generation = cast(GenerateOptions, {k: options.pop(k) for k in GenerateOptions.__optional_keys__ & set(options)})
        work = Path(work_dir)
        _check_before_generating(specs, generation, options, folds)
        say(f"[1/3] analysing {input}")
        bundles = generate(input, work, progress=progress is not None, **generation)
        say(f"[2/3] generated {len(bundles)} bundles in {work.resolve()}; tuning")
        records = tune([b["path"] for b in bundles], specs, summary_path=work / SUMMARY_NAME, progress=progress,
                       **cast(TuneOptions, options))
        result = RunResult(work, bundles, records, work / SUMMARY_NAME)
        if on_tuned is not None:
            on_tuned(records, result.summary_path)
        if train:
            say("[3/3] training the tuned bundles")
            _train_all(result, folds, device, epochs, seconds, progress is not None, say)
    return result


def _check_before_generating(specs: Mapping[str, Any] | PathLike | None, generation: Mapping[str, Any],
                             options: Mapping[str, Any], folds: Collection[int] | None) -> None:
    """What tuning and training will refuse (specs, options, the storage, folds not generated), asked before the
    analysis writes its first file."""
    from autotune.bundles.templates import list_templates
    from autotune.facade.bundlegen import parse_algos

    num_fold = int(generation.get("num_fold", 5))
    if folds and max(folds) >= num_fold:
        shown = ",".join(map(str, sorted(folds)))
        raise SpecError(f"--folds {shown}: fold {max(folds)} is not generated (--num-fold {num_fold} makes folds "
                        f"0-{num_fold - 1}); give folds below {num_fold}, or a larger --num-fold")
    algos = parse_algos(generation.get("algos"), list_templates(generation.get("templates")))
    check_tuning(specs, algos, **options)


def _train_all(result: RunResult, folds: Collection[int] | None, device: str, epochs: int | None,
               seconds: float | None, bars: bool, say: Progress) -> None:
    """Train ``result``'s bundles (those of ``folds``) one after another; their summaries go to ``result.trained``."""
    from autotune.trainer.runner import train as train_bundle

    for bundle in result.bundles:
        if folds is not None and bundle["fold"] not in folds:
            continue
        summary = train_bundle(bundle["path"], device=device, epochs=epochs, max_time=seconds, progress=bars)
        result.trained[bundle["identifier"]] = summary
        say(f"  {bundle['identifier']}: best mean Dice {summary.get('best_metric')}")
