"""``BundleGen``: from data stats and a data source config to one bundle per (algorithm, fold).

Shaped like MONAI's ``monai.apps.auto3dseg.BundleGen``:

    gen = BundleGen(work_dir, algos=["segresnet", "dints"], data_stats_filename=..., data_src_cfg_name=...)
    gen.generate(work_dir, num_fold=5, gpu_customization=True, gpu_customization_specs={...})
    gen.get_bundles()

``gpu_customization`` calls the generator's tuner; this package has none of its own
(``autotune.pipeline`` imports this package, not the other way round): for autotune's templates,
``autotune.BundleGen`` makes ``autotune.pipeline.AutotuneBundleGen``, this class with
``autotune.tune`` as its tuner.

A bundle is a folder ``<algo>_<fold>/`` holding ``configs/hyper_parameters.yaml``
(plain data, filled from the stats), ``bundle.json`` (template name and version,
the datastats hash, the fold) and ``scripts/infer.py`` (MONAI's ``InferClass`` entry,
two lines that import autotune's). Training outputs inside an existing bundle are kept
when it is regenerated; the generated files are replaced atomically.

``get_history()`` gives MONAI-shaped items whose ``algo_instance`` trains, scores and
predicts (``autotune.facade.algo.AutotuneAlgo``), so MONAI's ``AlgoEnsembleBuilder``
and ``AlgoEnsembleBestN`` work on them.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.bundles.config import CONFIG_RELPATH, check_bundle_config
from autotune.bundles.override_keys import check_override_keys
from autotune.bundles.render import deep_merge, render_config
from autotune.bundles.templates import list_templates, load_overrides, load_template
from autotune.checks import refuse_non_finite
from autotune.errors import ConfigError
from autotune.files import atomic_write_json, atomic_write_text, atomic_write_yaml
from autotune.utils import expand_path, look_up_option, read_yaml
from autotune.version import __version__

__all__ = ["BundleGen", "BUNDLE_META", "RenderedBundle", "Tuner", "data_src_entry", "parse_algos"]

log = logging.getLogger(__name__)
# tuner(bundle folders, gpu_customization_specs (a mapping, a YAML file or None), **options) -> one record per bundle
Tuner = Callable[..., list[dict[str, Any]]]
BUNDLE_META = "bundle.json"
INFER_SCRIPT = Path("scripts") / "infer.py"
# What MONAI's BundleAlgo.get_inferer and AlgoEnsembleBuilder look for in a bundle.
_INFER_SCRIPT_TEXT = '''"""Inference entry of this bundle for MONAI Auto3DSeg (``BundleAlgo.get_inferer`` loads ``InferClass``).

Written by ``autotune generate``; the work is done by autotune (as ``autotune infer`` does).
"""

from autotune.facade.algo import InferClass

__all__ = ["InferClass"]
'''


def parse_algos(algos: str | Sequence[str] | None, valid: Sequence[str]) -> list[str]:
    """``None`` (all), a name, a comma-separated string or a list -> checked list of names."""
    if algos is None:
        return list(valid)
    names = [a.strip() for a in algos.split(",")] if isinstance(algos, str) else [str(a).strip() for a in algos]
    names = [n for n in names if n]
    if not names:
        raise ConfigError(f"no algorithm named; valid: {', '.join(valid)}")
    return [look_up_option(n, valid, "algorithm") for n in dict.fromkeys(names)]


def _file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _bundle_meta(name: str, algo: str, template: Mapping[str, Any], stats_hash: str, fold: int,
                 num_fold: int) -> dict[str, Any]:
    """What ``bundle.json`` records: the template and its version, the statistics' hash, the fold, when and by what."""
    return {
        "identifier": name,
        "template": algo,
        "template_version": template["version"],
        "template_path": template["path"],
        "datastats_hash": stats_hash,
        "fold": fold,
        "num_fold": num_fold,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "autotune_version": __version__,
    }


@dataclass(frozen=True)
class RenderedBundle:
    """A bundle filled and checked, not yet written: its name, algorithm, fold, folder, config and ``bundle.json``."""

    name: str
    algo: str
    fold: int
    path: Path
    config: dict[str, Any]
    meta: dict[str, Any]


def data_src_entry(source: Any, datalist: Path) -> dict[str, Any]:
    """What a config takes from the data source (``render_config``'s ``data_src``), its datalist at ``datalist``."""
    return {"name": source.name, "modality": source.modality, "datalist": str(datalist),
            "dataroot": str(source.dataroot), "class_names": source.class_names, "sigmoid": source.sigmoid}


class BundleGen:
    """Generate bundles for the named algorithms from data stats.

    Args:
        algo_path: the work folder (where ``datastats.yaml`` and ``data_src.yaml`` live by default).
        algos: ``None`` for every template, a name, a comma-separated string or a list.
        templates_path: folder of ``<algo>/template.yaml``; default the shipped ``algorithm_templates/``.
            ``templates_path_or_url`` (MONAI's name) is taken too. MONAI's own templates are not this class's:
            ``autotune.BundleGen`` (``family="auto"`` or ``"monai"``) makes ``autotune.auto3dseg.MonaiBundleGen`` for them.
        data_stats_filename: the ``datastats.yaml`` written by ``autotune analyze``.
        data_src_cfg_name: the data source config (``data_src.yaml`` from ``analyze``, or an
            Auto3DSeg ``input.yaml``).
        tuner: what ``generate(gpu_customization=True)`` calls with the bundle folders, the specs
            and the extra keyword arguments. This package does not tune (``autotune.pipeline``
            imports it): ``autotune.BundleGen`` gives this class ``autotune.tune`` as its tuner.

    Raises:
        ConfigError: an unknown algorithm (the valid names are listed) or a missing file.
    """

    tuner: Tuner | None = None

    def __init__(
        self,
        algo_path: str | os.PathLike[str] = ".",
        algos: str | Sequence[str] | None = None,
        templates_path: str | os.PathLike[str] | None = None,
        data_stats_filename: str | os.PathLike[str] | None = None,
        data_src_cfg_name: str | os.PathLike[str] | None = None,
        tuner: Tuner | None = None,
        templates_path_or_url: str | os.PathLike[str] | None = None,
    ) -> None:
        if tuner is not None:
            self.tuner = tuner
        templates_path = templates_path or templates_path_or_url  # MONAI's name for it
        self.algo_path = expand_path(algo_path).resolve()
        self.templates_path = templates_path
        self.algos = parse_algos(algos, list_templates(templates_path))
        self.data_stats_filename = expand_path(data_stats_filename or self.algo_path / "datastats.yaml").resolve()
        self.data_src_cfg_name = expand_path(data_src_cfg_name or self.algo_path / "data_src.yaml").resolve()
        self._bundles: list[dict[str, Any]] = []
        self._history: list[dict[str, Any]] = []

    def _source(self, num_fold: int) -> Any:
        """The data source ``data_src_cfg_name`` describes, its folds checked against ``num_fold``."""
        from autotune.data.datalist import load_data_source
        from autotune.data.source import check_folds

        source = load_data_source(self.data_src_cfg_name, num_fold=num_fold)
        check_folds(source, num_fold, reanalyse=f"autotune analyze --num-fold {num_fold}")
        return source

    def generate(
        self,
        output_folder: str | os.PathLike[str] | None = None,
        num_fold: int = 5,
        gpu_customization: bool = False,
        gpu_customization_specs: Mapping[str, Any] | str | os.PathLike[str] | None = None,
        overrides: Mapping[str, Any] | str | os.PathLike[str] | None = None,
        **tune_kwargs: Any,
    ) -> list[dict[str, Any]]:
        """Write ``<output_folder>/<algo>_<fold>/`` for every algorithm and fold; tune them if asked.

        Args:
            output_folder: where bundles go (default ``algo_path``).
            num_fold: folds 0..num_fold-1 get a bundle each.
            gpu_customization: run the tuner on the generated bundles (one study per
                tuning key, so folds share one search).
                Raises ConfigError where this BundleGen has no tuner.
            gpu_customization_specs: Auto3DSeg-style specs (``universal`` or per algorithm:
                ``num_trials``, ``range_num_images_per_batch``, ``range_num_sw_batch_size``), as a
                mapping or a YAML file (as ``--specs`` takes them).
            overrides: plain data merged into every config, as a mapping, a preset name
                (``"tiny"``) or a YAML file, as ``--overrides`` takes them; a key naming an
                algorithm (e.g. ``{"dints": {...}}``) applies to that algorithm only.
            **tune_kwargs: passed to the tuner (for ``autotune.tune``: device, memory_limit,
                storage, strategy, ...).

        Returns:
            The generated bundles, as ``get_bundles()`` returns them.
        """
        if not isinstance(num_fold, int) or isinstance(num_fold, bool) or num_fold < 1:
            raise ConfigError(f"num_fold must be a positive integer, got {num_fold!r}")
        tuner = self.tuner if gpu_customization else None
        if gpu_customization and tuner is None:
            raise ConfigError(
                "this BundleGen has no tuner for gpu_customization; use autotune.BundleGen, or pass tuner=autotune.tune"
            )
        out = expand_path(output_folder).resolve() if output_folder else self.algo_path
        stats, stats_hash = self._read_stats()
        source = self._source(num_fold)
        # the bundles point at one resolved datalist (absolute paths, folds fixed), written with them
        datalist = self.algo_path / "datalist.json"
        rendered = self.render(out, stats, stats_hash, data_src_entry(source, datalist), num_fold, overrides)
        from autotune.data.datalist import write_datalist

        write_datalist(source, datalist)
        self.write(rendered)
        if tuner is not None:
            tuner([b["path"] for b in self._bundles], gpu_customization_specs, **tune_kwargs)
        return self.get_bundles()

    def render(self, out: Path, stats: Mapping[str, Any], stats_hash: str, data_src: Mapping[str, Any], num_fold: int,
               overrides: Mapping[str, Any] | str | os.PathLike[str] | None) -> list[RenderedBundle]:
        """Every bundle's config and record, filled and checked, none written: a template that does not fit the
        data, or overrides that break a config, refuse before the first file.

        Raises:
            ConfigError: naming the bundle and the key at fault.
        """
        per_algo = self._overrides_per_algo(overrides)
        rendered = []
        for algo in self.algos:
            template = load_template(algo, self.templates_path)
            for fold in range(num_fold):
                view = render_config(template, stats, dict(data_src), fold, num_fold, per_algo[algo],
                                     datastats_path=str(self.data_stats_filename))
                name = f"{algo}_{fold}"
                check_bundle_config(view, f"{name} (generated)")
                rendered.append(RenderedBundle(name, algo, fold, out / name, view,
                                               _bundle_meta(name, algo, template, stats_hash, fold, num_fold)))
        return rendered

    def write(self, rendered: Sequence[RenderedBundle]) -> list[dict[str, Any]]:
        """Write the bundles ``render`` filled (the output folder created if needed, said in one line); they
        become ``get_bundles()``."""
        from autotune.files import make_folder

        self._bundles = []
        if rendered:
            make_folder(rendered[0].path.parent, "the bundles' folder")
        for bundle in rendered:
            path = self._write_bundle(bundle.path, bundle.config, bundle.meta)
            self._bundles.append({"identifier": bundle.name, "algo": bundle.algo, "fold": bundle.fold,
                                  "path": str(path)})
            log.info("generated %s", path)
        return self.get_bundles()

    def _read_stats(self) -> tuple[dict[str, Any], str]:
        """The datastats file and its content hash (the file's digest where it records none).

        Raises:
            ConfigError: the file is missing, not a datastats file, or holds NaN or infinity.
        """
        stats = read_yaml(self.data_stats_filename, ConfigError)
        if not isinstance(stats, dict):
            raise ConfigError(f"{self.data_stats_filename}: not a datastats file; run 'autotune analyze' first")
        refuse_non_finite(stats, str(self.data_stats_filename))  # NaN statistics would fill NaN into every bundle
        stats_hash = str((stats.get("autotune") or {}).get("content_hash") or _file_hash(self.data_stats_filename))
        return stats, stats_hash

    def _overrides_per_algo(self, overrides: Mapping[str, Any] | str | os.PathLike[str] | None) -> dict[str, Any]:
        """The overrides each algorithm's configs get: the common keys, merged with those under its name."""
        overrides = load_overrides(overrides, self.templates_path)
        check_override_keys(overrides, self.algos, overrides.source, self.templates_path)  # unknown keys refuse here
        templates = list_templates(self.templates_path)
        common = {k: v for k, v in overrides.items() if k not in self.algos and k not in templates}
        return {algo: deep_merge(common, overrides[algo]) if isinstance(overrides.get(algo), Mapping) else dict(common)
                for algo in self.algos}

    @staticmethod
    def _write_bundle(target: Path, view: dict[str, Any], meta: dict[str, Any]) -> Path:
        """Write a new bundle by renaming a finished temp folder into place; for an existing
        bundle replace the two generated files atomically and keep everything else."""
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir():
            atomic_write_yaml(target / CONFIG_RELPATH, view)
            atomic_write_json(target / BUNDLE_META, meta)
            atomic_write_text(target / INFER_SCRIPT, _INFER_SCRIPT_TEXT)
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            atomic_write_yaml(tmp / CONFIG_RELPATH, view)
            atomic_write_json(tmp / BUNDLE_META, meta)
            atomic_write_text(tmp / INFER_SCRIPT, _INFER_SCRIPT_TEXT)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return target

    def get_bundles(self) -> list[dict[str, Any]]:
        """The bundles of the last ``generate``: dicts with identifier, algo, fold and path."""
        return [dict(b) for b in self._bundles]

    def get_history(self) -> list[dict[str, Any]]:
        """The bundles of the last ``generate`` as MONAI's ``BundleGen.get_history()`` gives them.

        Each item has MONAI's ``AlgoKeys``: ``identifier``, ``algo_instance`` (an
        ``autotune.facade.algo.AutotuneAlgo`` with MONAI's ``Algo`` interface: ``train``,
        ``get_score``, ``predict``, ``get_output_path``), ``is_trained`` and ``best_metric``
        (kept current by ``algo_instance.train()`` and re-read at each call). The same
        list is returned each time, as MONAI does. Imports torch and MONAI.
        """
        from autotune.facade.algo import AutotuneAlgo

        paths = [b["path"] for b in self._bundles]
        if [str(h["algo_instance"].get_output_path()) for h in self._history] != paths:
            self._history[:] = [AutotuneAlgo(b["path"], name=b["identifier"]).history_item() for b in self._bundles]
        for item in self._history:
            item["algo_instance"].refresh_history()
        return self._history
