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
from typing import Any

__all__ = ["DomainCheck", "bundle_domain", "domain_key", "fit_domain", "domain_check", "network_hash"]

OWN_SOURCE = "autotune"  # the family name of autotune's own templates (``autotune.families.own``)


def network_hash(network: Any) -> str:
    """A short hash of a network configuration (canonical JSON): two bundles with the same hash build the same
    network from the same template."""
    text = json.dumps(network, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def domain_key(source: str, template: str) -> str:
    """The key a domain is stored under: ``autotune:dints``, ``monai:dints``."""
    return f"{source}:{template}"


def bundle_domain(cfg: Mapping[str, Any], device: str = "cuda:0") -> dict[str, Any]:
    """What places a bundle (its view) against a calibration's domain: its template and source (the family), its
    network's hash, its patch and validation volume sizes and the precision it computes in on ``device``."""
    from autotune.families import family_for
    from autotune.precision import resolve_precision

    family = family_for(cfg)
    volume = cfg.get("infer_volume_shape")
    return {
        "template": str(cfg.get("algo")),
        "source": str(family.name),
        "network_hash": network_hash(cfg.get("network")),
        "roi_size": [int(v) for v in cfg.get("roi_size") or []],
        "infer_volume_shape": [int(v) for v in volume] if volume else None,
        "precision": resolve_precision(bool(cfg.get("amp", False)), device).name,
    }


def fit_domain(entries: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The domain of a fit from its points: each entry a ``bundle_domain`` with the point's ``n`` and ``m``.
    Returns ``{"source:template": {template, source, network_hash, roi_sizes, infer_volume_shapes, precision,
    phases, n, m}}``.

    Raises:
        ValueError: two points of one template with different networks or precisions (one fit cannot span
            them: calibrate them as separate templates).
    """
    out: dict[str, dict[str, Any]] = {}
    for entry in entries:
        key = domain_key(entry["source"], entry["template"])
        known = out.get(key)
        if known is None:
            known = out[key] = {"template": entry["template"], "source": entry["source"],
                                "network_hash": entry["network_hash"], "precision": entry["precision"],
                                "roi_sizes": [], "infer_volume_shapes": [], "phases": ["train", "infer"],
                                "n": [], "m": []}
        for field in ("network_hash", "precision"):
            if known[field] != entry[field]:
                raise ValueError(f"the points of {key} differ in {field} ({known[field]} against {entry[field]}): "
                                 "one fit cannot span them")
        for field, value in (("roi_sizes", entry.get("roi_size")), ("infer_volume_shapes", entry.get("infer_volume_shape"))):
            if value and list(value) not in known[field]:
                known[field].append([int(v) for v in value])
        for field in ("n", "m"):
            if entry.get(field) is not None and int(entry[field]) not in known[field]:
                known[field] = sorted({*known[field], int(entry[field])})
    return out


@dataclass(frozen=True)
class DomainCheck:
    """Whether a bundle lies in a calibration's domain: ``inside``; ``key`` the domain it was held against
    (None: no domain of its template and source); ``why`` one phrase a person can check."""

    inside: bool
    key: str | None
    why: str


def _legacy_domain(factors: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A calibration without a recorded domain: its factors' templates, as autotune's own, nothing else known."""
    return {domain_key(OWN_SOURCE, t): {"template": t, "source": OWN_SOURCE, "legacy": True} for t in factors}


def domain_check(domain: Mapping[str, Mapping[str, Any]] | None, factors: Mapping[str, Any] | None,
                 bundle: Mapping[str, Any]) -> DomainCheck:
    """Hold ``bundle`` (a ``bundle_domain``) against a calibration's ``domain`` (``fit_domain``; None: a file
    from before domains were recorded, read by ``factors``' template names as autotune's own). The batch sizes
    are not part of the domain: how a fit carries to other batch sizes of its network is what
    leave-one-scale-out validates, and its bound applies."""
    if not factors:
        return DomainCheck(False, None, "the calibration has no device model")
    domains = dict(domain) if domain else _legacy_domain(factors)
    key = domain_key(bundle["source"], bundle["template"])
    own = domains.get(key)
    if own is None or bundle["template"] not in factors:
        fitted = ", ".join(sorted(domains)) or "nothing"
        return DomainCheck(False, None, f"{key} is not among the templates the fit was measured on ({fitted})")
    if own.get("legacy"):
        return DomainCheck(True, key, f"{key} by name (the calibration records no domain: written before they were)")
    checks = (
        ("network_hash", bundle["network_hash"] == own.get("network_hash"),
         f"its network ({bundle['network_hash']}) is not the one fitted ({own.get('network_hash')})"),
        ("precision", bundle["precision"] == own.get("precision"),
         f"it computes in {bundle['precision']}, the fit in {own.get('precision')}"),
        ("roi_size", list(bundle["roi_size"]) in [list(r) for r in own.get("roi_sizes") or []],
         f"its patch {_shape(bundle['roi_size'])} is not one fitted ({_shapes(own.get('roi_sizes'))})"),
        ("infer_volume_shape", bundle.get("infer_volume_shape") is None
         or list(bundle["infer_volume_shape"]) in [list(v) for v in own.get("infer_volume_shapes") or []],
         f"its validation volume {_shape(bundle.get('infer_volume_shape'))} is not one fitted "
         f"({_shapes(own.get('infer_volume_shapes'))})"),
    )
    for _, ok, why in checks:
        if not ok:
            return DomainCheck(False, key, f"{key}: {why}")
    return DomainCheck(True, key, f"{key}, its network, patch {_shape(bundle['roi_size'])} and {bundle['precision']} "
                                  "as fitted")


def _shape(value: Any) -> str:
    return "x".join(str(v) for v in value) if value else "-"


def _shapes(values: Any) -> str:
    return ", ".join(_shape(v) for v in values or []) or "none recorded"
