"""The interface every template family implements (``TemplateFamily``).

The probe, the estimator, the search, the hand-off and training ask a bundle's family (``family_of`` a
folder, ``family_for`` a loaded view: ``autotune.families.registry``) instead of testing a format or a
template's name. A family answers for the bundles it recognises:

- what it is: ``recognises`` (a folder), ``reads`` (a view it made);
- its view: ``load_config``, the plain config checked against ``autotune.bundles.schema``;
- its parts: ``probe_parts`` (the probe's child: network, loss, optimizer, the training and validation
  steps) and ``fake_parts`` (the same under the estimator's ``FakeTensorMode``);
- its tunables: ``tunable_keys``, each tunable (``autotune.tunables``) to the config keys it is written to;
- the write-back: ``write_back``, tuned values into those keys, the ``tuning:`` record kept as provenance;
- training: ``trained_by_autotune`` and ``training_command``;
- generation: ``generates`` (a ``BundleGen`` templates argument) and ``bundle_generator``;
- the specs: ``template_names`` (the keys ``gpu_customization_specs`` may give) and ``spec_aliases``;
- the search's and the hand-off's hooks: ``calibrated_as`` (the template a calibration's stated edge bound
  was measured on, None: no calibration covers it), ``handoff_reference``, ``keeps_learning_rate_largest``
  and ``no_reference_reason``.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

__all__ = ["TemplateFamily"]


class TemplateFamily(ABC):
    """One family of templates (see the module docstring); an instance is stateless."""

    #: the family's name in messages (``autotune``, ``monai``)
    name: ClassVar[str]
    #: True when ``autotune train`` (``autotune.trainer``) trains its bundles; else ``training_command`` does
    trained_by_autotune: ClassVar[bool] = True
    #: why an edge found by the estimator is probed at N+1 although a calibration states a bound (None: the
    #: default reasons of the search's edge check)
    uncalibrated_reason: ClassVar[str | None] = None

    @abstractmethod
    def recognises(self, bundle: str | os.PathLike[str]) -> bool:
        """True when ``bundle`` (a folder, or its config file) is one of this family's bundles."""

    @abstractmethod
    def reads(self, config: BundleConfig) -> bool:
        """True when ``config`` was read by this family's ``load_config``."""

    @abstractmethod
    def load_config(self, bundle: str | os.PathLike[str]) -> BundleConfig:
        """The bundle's view: the plain config the stages read, checked (``bundle_root`` set).

        Raises:
            ConfigError: one line naming the file or the key.
        """

    @abstractmethod
    def write_back(self, bundle: str | os.PathLike[str], updates: Mapping[str, Any]) -> BundleConfig:
        """Write ``updates`` (plain keys: the tuned values, the loader batch, the learning rate, ``tuning``)
        into the bundle's own keys atomically, with the ``tuning:`` record as provenance; returns the view read
        back."""

    @abstractmethod
    def probe_parts(self, config: BundleConfig, device: Any, amp_dtype: Any) -> dict[str, Any]:
        """What the probe's child runs with on ``device`` (seeded): ``device``, ``model``, ``loss_fn``,
        ``optimizer``, ``amp_dtype``, ``scaler`` and the ``workload`` whose steps it runs (the functions of
        ``autotune.probe.workload``: ``make_loader_batches``, ``train_loader_batch``, ``make_volume``, ...)."""

    @abstractmethod
    def fake_parts(self, config: BundleConfig, compute: str, emulate: bool) -> tuple[Any, Any, Any, Any]:
        """(model, loss, optimizer, workload) for the estimator, inside its fake session, with fake parameters
        on ``compute``; ``emulate``: a CUDA target emulated on the CPU."""

    @abstractmethod
    def tunable_keys(self, config: BundleConfig) -> dict[str, tuple[str, ...]]:
        """Each tunable (``autotune.tunables``) the bundle exposes -> the config keys it is written to (``a#b``
        for a nested key), in this family's key table."""

    @abstractmethod
    def training_command(self, bundle: str | os.PathLike[str], memory_limit: str | None = None) -> list[str]:
        """The command line that trains ``bundle`` under ``memory_limit`` (a size such as ``8GiB``)."""

    @abstractmethod
    def template_names(self) -> tuple[str, ...]:
        """The names of the templates this family holds (the keys ``gpu_customization_specs`` may give)."""

    def spec_aliases(self) -> dict[str, str]:
        """A specs key in another spelling (MONAI's own template's) -> the template's name."""
        return {}

    def generates(self, templates: Any) -> bool:
        """True when ``templates`` (``BundleGen``'s ``templates_path_or_url``; None: autotune's) are this family's."""
        return False

    def bundle_generator(self, args: tuple[Any, ...], kwargs: Mapping[str, Any], tuner: Any) -> Any:
        """The family's own ``BundleGen`` over its templates, built from ``BundleGen``'s arguments and tuning with
        ``tuner`` (None: autotune's ``BundleGen`` generates them)."""
        return None

    def calibrated_as(self, config: BundleConfig) -> str | None:
        """The template whose calibrations' stated edge bound covers this bundle (None: none does: N+1 is
        probed)."""
        return config.algo or None

    def handoff_reference(self, config: BundleConfig) -> dict[str, Any] | None:
        """The batch the template itself states, kept in the hand-off's record (None: the bundle's
        ``batch_scaling`` block is autotune's own and needs no separate record)."""
        return None

    def keeps_learning_rate_largest(self, config: BundleConfig) -> bool:
        """True when ``--handoff largest`` keeps the template's learning rate (as MONAI's ``auto_scale_*`` does)."""
        return False

    def no_reference_reason(self, config: BundleConfig) -> str:
        """Why the bundle has no ``batch_scaling`` block, and what follows."""
        return "bundle has no batch_scaling block (no reference batch); regenerate it"
