"""Where a calibration's fit holds: the domain it was fitted on, and whether a bundle lies inside it.

The device model's fitted part (cuDNN's workspace factor per template and phase,
``autotune.probe.device_model``) is measured on a few points: some templates, each at one patch and
volume size, in one precision, at a few batch sizes. Validated out of sample
(``autotune.calibrate.validate``), a factor predicts other batch sizes of the same network well, and
another template badly (the first GPU run's file applied UNet's factor to MONAI's DiNTS: 1.45x over).
So a calibration records what it was fitted on (``fit_domain``) and an estimate uses the fit only
inside it (``domain_check``): the same template from the same source (autotune's own ``dints`` is
not MONAI's ``dints``), the same network configuration (its hash), the same patch and validation
volume sizes and the same precision. Anything else is estimated by the raw estimator and the
allocator's rules alone, with the error bound the out-of-sample validation measured for such a case.

A calibration written before domains were recorded (version 2) is read as fitted on autotune's own
templates of those names: its factors never reach MONAI's templates.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.bundles.model import BundleConfig
    from autotune.probe.calibration_file import DomainEntry

__all__ = ["DomainCheck", "Place", "as_bundle_config", "bundle_domain", "domain_key", "fit_domain", "domain_check", "network_hash"]

OWN_SOURCE = "autotune"  # the family name of autotune's own templates (``autotune.families.own``)


def network_hash(network: Any) -> str:
    """A short hash of a network configuration (canonical JSON): two bundles with the same hash build the same
    network from the same template."""
    text = json.dumps(network, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def domain_key(source: str, template: str) -> str:
    """The key a domain is stored under: ``autotune:dints``, ``monai:dints``."""
    return f"{source}:{template}"


@dataclass(frozen=True)
class Place:
    """What places a bundle against a calibration's domain (``bundle_domain``): its template and source (the
    family), its network's hash, its patch and validation volume sizes and the precision it computes in."""

    template: str
    source: str
    network_hash: str
    roi_size: tuple[int, ...]
    infer_volume_shape: tuple[int, ...] | None
    precision: str

    @property
    def key(self) -> str:
        """``source:template``."""
        return domain_key(self.source, self.template)

    def as_dict(self) -> dict[str, Any]:
        """As plain data (a report's)."""
        return {"template": self.template, "source": self.source, "network_hash": self.network_hash,
                "roi_size": list(self.roi_size),
                "infer_volume_shape": list(self.infer_volume_shape) if self.infer_volume_shape else None,
                "precision": self.precision}


def as_bundle_config(config: BundleConfig | Mapping[str, Any]) -> BundleConfig:
    """``config`` as a ``BundleConfig``: a probe request's ``config`` (the bundle's view with the tunables'
    values in it, ``autotune.probe.runner.resolve_request``) is checked into one.

    Raises:
        ConfigError: the view is not a bundle config autotune reads.
    """
    from autotune.bundles.model import BundleConfig

    if isinstance(config, BundleConfig):
        return config
    view = dict(config)
    return BundleConfig.parse(view, str(view.get("bundle_root") or "bundle config"))


def bundle_domain(config: BundleConfig, device: str = "cuda:0") -> Place:
    """Where a bundle (its ``config``) lies: its template and source (the family), its network's hash, its patch
    and validation volume sizes and the precision it computes in on ``device``."""
    from autotune.families import family_for
    from autotune.precision import resolve_precision

    volume = config.infer_volume_shape
    return Place(template=config.algo, source=str(family_for(config).name),
                 network_hash=network_hash(config.network.as_dict()), roi_size=tuple(config.roi_size),
                 infer_volume_shape=tuple(volume) if volume else None,
                 precision=resolve_precision(config.amp, device).name)


def fit_domain(points: Iterable[tuple[Place, int | None, int | None]]) -> dict[str, dict[str, Any]]:
    """The domain of a fit from its points, each ``(place, n, m)``, as a calibration file holds it
    (``model.domain``): ``{"source:template": {template, source, network_hash, roi_sizes, infer_volume_shapes,
    precision, phases, n, m}}``.

    Raises:
        ValueError: two points of one template with different networks or precisions (one fit cannot span
            them: calibrate them as separate templates).
    """
    out: dict[str, dict[str, Any]] = {}
    for place, n, m in points:
        known = out.get(place.key)
        if known is None:
            known = out[place.key] = {"template": place.template, "source": place.source,
                                      "network_hash": place.network_hash, "precision": place.precision,
                                      "roi_sizes": [], "infer_volume_shapes": [], "phases": ["train", "infer"],
                                      "n": [], "m": []}
        for field in ("network_hash", "precision"):
            if known[field] != getattr(place, field):
                raise ValueError(f"the points of {place.key} differ in {field} ({known[field]} against "
                                 f"{getattr(place, field)}): one fit cannot span them")
        for field, value in (("roi_sizes", place.roi_size), ("infer_volume_shapes", place.infer_volume_shape)):
            if value and list(value) not in known[field]:
                known[field].append([int(v) for v in value])
        for field, value in (("n", n), ("m", m)):
            if value is not None and int(value) not in known[field]:
                known[field] = sorted({*known[field], int(value)})
    return out


@dataclass(frozen=True)
class DomainCheck:
    """Whether a bundle lies in a calibration's domain: ``inside``; ``key`` the domain it was held against
    (None: no domain of its template and source); ``why`` one phrase a person can check."""

    inside: bool
    key: str | None
    why: str


def domain_check(domain: Mapping[str, DomainEntry] | None, factors: Mapping[str, Any] | None,
                 place: Place) -> DomainCheck:
    """Hold ``place`` (``bundle_domain``) against a calibration's checked ``domain`` (None: a file from before
    domains were recorded, read by ``factors``' template names as autotune's own). The batch sizes are not part
    of the domain: how a fit carries to other batch sizes of its network is what leave-one-scale-out validates,
    and its bound applies."""
    if not factors:
        return DomainCheck(False, None, "the calibration has no device model")
    key = place.key
    if domain is None:  # before domains: autotune's own templates by name, nothing else known
        if place.source == OWN_SOURCE and place.template in factors:
            return DomainCheck(True, key, f"{key} by name (the calibration records no domain: written before they "
                                          "were)")
        fitted = ", ".join(sorted(domain_key(OWN_SOURCE, t) for t in factors)) or "nothing"
        return DomainCheck(False, None, f"{key} is not among the templates the fit was measured on ({fitted})")
    own = domain.get(key)
    if own is None or place.template not in factors:
        fitted = ", ".join(sorted(domain)) or "nothing"
        return DomainCheck(False, None, f"{key} is not among the templates the fit was measured on ({fitted})")
    checks = (
        (place.network_hash == own.network_hash,
         f"its network ({place.network_hash}) is not the one fitted ({own.network_hash})"),
        (place.precision == own.precision, f"it computes in {place.precision}, the fit in {own.precision}"),
        (list(place.roi_size) in own.roi_sizes,
         f"its patch {_shape(place.roi_size)} is not one fitted ({_shapes(own.roi_sizes)})"),
        (place.infer_volume_shape is None or list(place.infer_volume_shape) in own.infer_volume_shapes,
         f"its validation volume {_shape(place.infer_volume_shape)} is not one fitted "
         f"({_shapes(own.infer_volume_shapes)})"),
    )
    for ok, why in checks:
        if not ok:
            return DomainCheck(False, key, f"{key}: {why}")
    return DomainCheck(True, key, f"{key}, its network, patch {_shape(place.roi_size)} and {place.precision} "
                                  "as fitted")


def _shape(value: Any) -> str:
    return "x".join(str(v) for v in value) if value else "-"


def _shapes(values: Any) -> str:
    return ", ".join(_shape(v) for v in values or []) or "none recorded"
