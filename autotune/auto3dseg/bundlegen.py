"""MONAI's own ``BundleGen`` on MONAI's templates, with autotune as its GPU customisation.

``autotune.BundleGen(..., templates_path_or_url=<MONAI's algorithm_templates>)`` is a ``MonaiBundleGen``:
it generates MONAI's bundles through ``monai.apps.auto3dseg.BundleGen`` (the templates' own
``fill_template_config``, MONAI's layout, its ``get_history()`` of ``BundleAlgo`` objects for MONAI's
ensembles), and ``generate(..., gpu_customization=True, gpu_customization_specs=...)`` tunes them with
autotune's tuner instead of the templates' search (``num_trials`` is an upper bound, as for autotune's
own templates). Every other attribute is MONAI's ``BundleGen``'s. A template that sizes its batch from the
visible GPUs while it is generated (SwinUNETR's ``auto_scale``) is given the memory of the device autotune tunes
for (``generate``'s ``memory_limit``, ``device``, or the target GPU when planning), so it generates on a host
without a GPU too; the template's files stay as MONAI ships them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["MonaiBundleGen", "is_monai_templates", "monai_generation"]


def is_monai_templates(templates: str | os.PathLike[str] | None) -> bool:
    """True for MONAI's algorithm templates: a URL (MONAI downloads it) or a folder of ``<algo>/scripts/algo.py``."""
    if templates is None:
        return False
    text = str(templates)
    if text.startswith(("http://", "https://")):
        return True
    folder = Path(text).expanduser()
    return folder.is_dir() and any(p.is_file() for p in folder.glob("*/scripts/algo.py"))


@contextlib.contextmanager
def _generation_hooks(algos: Any, tune_kwargs: Mapping[str, Any],
                      target_gpu_memory: Callable[[str], int] | None) -> Iterator[None]:
    """The generation context (``MonaiTemplate.generation_context``) of every template being generated: a template
    whose ``fill_template_config`` reads the GPUs is given the memory of the device autotune tunes for."""
    from autotune.auto3dseg.templates import registered

    names = {getattr(algo, "name", None) for algo in algos or []}
    with contextlib.ExitStack() as stack:
        for template in registered():
            if template.name not in names:
                continue
            context = template.generation_context(algos, tune_kwargs, target_gpu_memory)
            if context is not None:
                stack.enter_context(context)
        yield


@contextlib.contextmanager
def monai_generation(**tune_kwargs: Any) -> Iterator[None]:
    """While inside, MONAI's own ``BundleGen`` (the one AutoRunner's generation step builds) gives the templates
    that size their batch from the visible GPUs while they are generated (SwinUNETR's ``auto_scale``) the memory
    of the device autotune tunes for, as ``MonaiBundleGen.generate`` does: ``memory_limit``, ``target_memory``,
    a ``cuda`` ``device``'s memory (``autotune.tune``'s arguments), else 16 GiB on a host without a GPU.
    Restored on the way out; the templates' files stay as MONAI ships them::

        with autotune.auto3dseg.monai_generation(memory_limit="16GiB"):
            AutoRunner(analyze=False, algo_gen=True, train=False, ensemble=False, **kw).run()

    Raises:
        SpecError: a bad size (``memory_limit``, ``target_memory``), when MONAI generates.
    """
    from monai.apps.auto3dseg.bundle_gen import BundleGen

    original = BundleGen.generate

    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _generation_hooks(self.algos, tune_kwargs, None):
            return original(self, *args, **kwargs)

    BundleGen.generate = generate  # type: ignore[method-assign]
    try:
        yield
    finally:
        BundleGen.generate = original  # type: ignore[method-assign]


class MonaiBundleGen:
    """MONAI's ``BundleGen`` whose ``gpu_customization`` is autotune's tuner (see the module docstring).

    Args:
        algo_path, algos, templates_path_or_url, data_stats_filename, data_src_cfg_name: MONAI's arguments
            (``templates_path`` is taken for ``templates_path_or_url``, as autotune's own BundleGen names it).
        tuner: called with the generated bundle folders, the specs and ``generate``'s extra keyword arguments
            (``autotune.tune``: device, memory_limit, storage, strategy, ...).
        target_gpu_memory: a catalogue GPU's name (``target_gpu``) -> its memory in bytes, for the templates that
            size their batch while they are generated (SwinUNETR's ``auto_scale``).
        **monai_kwargs: MONAI's other arguments (``mlflow_tracking_uri``, ``mlflow_experiment_name``).
    """

    def __init__(self, algo_path: str | os.PathLike[str] = ".", algos: Any = None,
                 templates_path_or_url: str | os.PathLike[str] | None = None,
                 data_stats_filename: str | os.PathLike[str] | None = None,
                 data_src_cfg_name: str | os.PathLike[str] | None = None, *,
                 templates_path: str | os.PathLike[str] | None = None, tuner: Callable[..., Any] | None = None,
                 target_gpu_memory: Callable[[str], int] | None = None, **monai_kwargs: Any) -> None:
        from monai.apps.auto3dseg import BundleGen

        if isinstance(algos, str) and "," in algos:  # autotune's comma-separated form
            algos = [a.strip() for a in algos.split(",") if a.strip()]
        source = templates_path_or_url or templates_path
        self._gen = BundleGen(algo_path=str(algo_path), algos=algos,
                              templates_path_or_url=str(source) if source is not None else None,
                              data_stats_filename=None if data_stats_filename is None else str(data_stats_filename),
                              data_src_cfg_name=None if data_src_cfg_name is None else str(data_src_cfg_name),
                              **monai_kwargs)
        self.tuner = tuner
        self.target_gpu_memory = target_gpu_memory

    def generate(self, output_folder: str | os.PathLike[str] = ".", num_fold: int = 5, gpu_customization: bool = False,
                 gpu_customization_specs: Mapping[str, Any] | None = None, allow_skip: bool = True,
                 **tune_kwargs: Any) -> list[str]:
        """MONAI's ``generate`` (without its own search), then autotune's tuner when ``gpu_customization``.

        Returns:
            The generated bundle folders.

        Raises:
            ConfigError: ``gpu_customization`` without a tuner; and what the tuner raises.
        """
        from autotune.errors import ConfigError

        if gpu_customization and self.tuner is None:
            raise ConfigError("this BundleGen has no tuner for gpu_customization; use autotune.BundleGen")
        with _generation_hooks(self._gen.algos, tune_kwargs, self.target_gpu_memory):
            self._gen.generate(str(output_folder), num_fold=num_fold, gpu_customization=False, allow_skip=allow_skip)
        bundles = self.bundle_paths()
        if gpu_customization:
            self.tuner(bundles, gpu_customization_specs, **tune_kwargs)
        return bundles

    def bundle_paths(self) -> list[str]:
        """The folders of the generated bundles, in MONAI's history order."""
        return [str(item["algo_instance"].get_output_path()) for item in self._gen.get_history()]

    def get_history(self) -> Sequence[dict[str, Any]]:
        """MONAI's history: ``identifier`` and ``algo_instance`` (MONAI's ``BundleAlgo``) per bundle."""
        return self._gen.get_history()

    def __getattr__(self, name: str) -> Any:
        if name == "_gen":
            raise AttributeError(name)
        return getattr(self._gen, name)
