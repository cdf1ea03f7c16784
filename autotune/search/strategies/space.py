"""Tuning specs, compatible with MONAI Auto3DSeg's ``gpu_customization_specs``.

Specs map ``universal`` or a template name to a mapping with:
    num_trials                  trials for the ``tpe`` strategy (Auto3DSeg's budget)
    range_num_images_per_batch  [min, max] patches per forward pass (see below)
    range_num_sw_batch_size     [min, max] sliding-window batch size
    validation_devices          which places to try for the validation volume: device, cpu
An algorithm's own entry overrides ``universal`` key by key. A key may name any template autotune
knows (its own ``segresnet``, ``dints``, ``unet``; MONAI's ``segresnet``, ``dints``, ``swinunetr``,
``segresnet2d``), tuned in this run or not, so one specs file serves every run; MONAI's SwinUNETR
template reads its specs under ``swunetr`` (sic), which autotune takes for ``swinunetr`` with a
warning naming the right key. Any other key is refused in one line listing the valid ones.
These are the keys MONAI's own ``customize_param_for_gpu`` reads (DiNTS's and SwinUNETR's
``num_trials``, ``range_num_images_per_batch``, ``range_num_sw_batch_size``); MONAI takes a
template's entry instead of ``universal`` as a whole, autotune key by key.

Auto3DSeg's DiNTS tunes ``num_images_per_batch``, but training splits each loader batch
into chunks of ``num_patches_per_iter``, so memory per forward pass is set by the
latter. autotune tunes patches per forward pass and reads ``range_num_images_per_batch``
as its range (``range_num_patches_per_iter`` is accepted as the clearer name); the
loader settings that produce the tuned value are written back with it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autotune.errors import SpecError
from autotune.families.registry import spec_aliases
from autotune.probe import VALIDATION_DEVICES
from autotune.search.strategies.objective import SW_SCALE
from autotune.tunables import BATCH, SW_BATCH, TUNABLES, VALIDATION_DEVICE, Tunable, spec_key_names
from autotune.utils import look_up_option

if TYPE_CHECKING:
    from autotune.bundles.model import BundleConfig

__all__ = ["AlgoSpec", "SPEC_KEYS", "SpecKeyWarning", "SpecsFile", "VALIDATION_DEVICES", "parse_specs",
           "spec_for"]

SPEC_KEYS = ("num_trials", *sorted(spec_key_names()))  # each tunable's (``autotune.tunables``)
#: the ``AlgoSpec`` field that holds each tunable's range or choices
_FIELDS = {BATCH.name: "patches_range", SW_BATCH.name: "sw_range", VALIDATION_DEVICE.name: "validation_devices"}


class SpecsFile(dict):  # type: ignore[type-arg]
    """Specs read from a file: ``parse_specs`` names ``source`` in its error line."""

    def __init__(self, values: Mapping[str, Any], source: str) -> None:
        super().__init__(values)
        self.source = source


class SpecKeyWarning(UserWarning):
    """A specs key autotune reads under another name (MONAI's spelling of a template's name)."""


@dataclass(frozen=True)
class AlgoSpec:
    """The search space and budget for one algorithm."""

    num_trials: int = 20
    patches_range: tuple[int, int] = (1, 64)
    sw_range: tuple[int, int] = (1, 64)
    validation_devices: tuple[str, ...] = VALIDATION_DEVICES
    given: frozenset[str] = field(default_factory=frozenset)
    #: (name, range or choices) of each tunable with no field of its own above (``autotune.tunables``)
    others: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    def space_of(self, tunable: Tunable) -> tuple[Any, ...]:
        """The searched range (``[min, max]``) or choices of ``tunable``."""
        if tunable.name in _FIELDS:
            return tuple(getattr(self, _FIELDS[tunable.name]))
        return dict(self.others)[tunable.name]

    def as_dict(self) -> dict[str, Any]:
        return {"num_trials": self.num_trials, **{t.spec_key: list(self.space_of(t)) for t in TUNABLES}}


def _int_range(value: Any, where: str) -> tuple[int, int]:
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes, bytearray)) or len(value) != 2:
        raise SpecError(f"{where} must be [min, max] with two integers, got {value!r}")
    lo, hi = value
    for v in (lo, hi):
        if not isinstance(v, int) or isinstance(v, bool):
            raise SpecError(f"{where} must hold integers, got {value!r}")
    if lo < 1:
        raise SpecError(f"{where}: minimum must be at least 1, got {lo}")
    if lo > hi:
        raise SpecError(f"{where}: minimum {lo} is above maximum {hi}; swap them")
    return int(lo), int(hi)


def _check_entry(entry: Any, where: str) -> dict[str, Any]:
    if entry is None:
        return {}
    if not isinstance(entry, Mapping):
        raise SpecError(f"{where} must be a mapping of {', '.join(SPEC_KEYS)}")
    out: dict[str, Any] = {}
    for key, value in entry.items():
        look_up_option(str(key), SPEC_KEYS, f"spec key in {where}", SpecError)
        if key == "num_trials":
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpecError(f"{where}.num_trials must be a positive integer, got {value!r}")
            out[key] = int(value)
            continue
        item = next(t for t in TUNABLES if key in t.spec_names)
        if item.spec_key in out:
            raise SpecError(f"{where}: give {' or '.join(item.spec_names)}, not both")
        out[item.spec_key] = _choices(item, value, where) if item.kind == "choice" else _int_range(value, f"{where}.{key}")
        if item is SW_BATCH and out[item.spec_key][1] >= SW_SCALE:  # the joint objective's order (objective.py)
            raise SpecError(f"{where}.{key}: maximum must be below {SW_SCALE}, got {out[item.spec_key][1]}")
    return out


def _choices(item: Tunable, value: Any, where: str) -> tuple[str, ...]:
    """The choices a spec gives for a ``choice`` tunable (one name, or a list of them), each checked."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Sequence) or not value:
        raise SpecError(f"{where}.{item.spec_key} must be a list from {', '.join(item.choices)}")
    what = item.name.replace("_", " ")
    return tuple(dict.fromkeys(look_up_option(str(v), item.choices, what, SpecError) for v in value))


def _top_key(key: Any, valid: Sequence[str]) -> str:
    """The template (or ``universal``) a top-level specs key names; MONAI's spelling with a warning."""
    aliases = spec_aliases()  # a template's specs key as MONAI's own template spells it -> the template's name
    name = look_up_option(str(key), (*valid, *aliases), "specs key", SpecError)
    if name in aliases:
        right = aliases[name]
        warnings.warn(f"specs key {name!r} is MONAI's spelling in its {right} template; autotune reads it as "
                      f"{right!r}: write {right!r}", SpecKeyWarning, stacklevel=3)
        return right
    return name


def parse_specs(specs: Mapping[str, Any] | None, algos: Sequence[str],
                known: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    """Check specs and return the explicit values per algorithm of ``algos`` (``universal`` merged in).

    ``known``: the other template names a key may give (not tuned in this run: accepted, unused).

    Raises:
        SpecError: unknown top-level or inner keys (valid ones listed), a template given under both its
            name and MONAI's spelling, non-integer or empty ranges, min > max, values below 1, bad
            validation devices.

    Warns:
        SpecKeyWarning: a key in MONAI's spelling (``swunetr``), read as the template's name.
    """
    source = getattr(specs, "source", None)
    try:
        return _parse_specs(specs, algos, known)
    except SpecError as exc:
        if source is None:
            raise
        raise SpecError(f"{source}: {exc}") from exc


def _parse_specs(specs: Mapping[str, Any] | None, algos: Sequence[str],
                 known: Sequence[str]) -> dict[str, dict[str, Any]]:
    if specs is None:
        specs = {}
    if not isinstance(specs, Mapping):
        raise SpecError(f"gpu_customization_specs must be a mapping of 'universal' or algorithm names, got {specs!r}")
    valid_top = tuple(dict.fromkeys(("universal", *algos, *known)))
    universal: dict[str, Any] = {}
    per_algo: dict[str, dict[str, Any]] = {}
    for key, entry in specs.items():
        name = _top_key(key, valid_top)
        if name in per_algo:
            spelled = next(k for k, v in spec_aliases().items() if v == name)
            raise SpecError(f"specs: give {name!r} or MONAI's spelling {spelled!r}, not both")
        checked = _check_entry(entry, f"specs.{name}")
        if name == "universal":
            universal = checked
        else:
            per_algo[name] = checked
    return {algo: {**universal, **per_algo.get(algo, {})} for algo in algos}


def spec_for(explicit: Mapping[str, Any], config: BundleConfig) -> AlgoSpec:
    """Combine explicit specs with the bundle's default ranges (``tuning_ranges``) and choices
    (``tuning_validation_devices``)."""
    ranges = config.tuning_ranges
    space: dict[str, tuple[Any, ...]] = {}
    for item in TUNABLES:
        if item.spec_key in explicit:
            space[item.name] = tuple(explicit[item.spec_key])
        elif item.kind == "choice":  # the field ``tuning_<spec key>`` (``tuning_validation_devices``), else all
            space[item.name] = tuple(getattr(config, f"tuning_{item.spec_key}", None) or item.choices)
        else:
            space[item.name] = _int_range(ranges.get(item.name, list(item.default_range or (1, 64))),
                                          f"bundle tuning_ranges.{item.name}")
    fields = {_FIELDS[name]: value for name, value in space.items() if name in _FIELDS}
    others = tuple((name, value) for name, value in space.items() if name not in _FIELDS)
    return AlgoSpec(num_trials=int(explicit.get("num_trials", 20)), given=frozenset(explicit), others=others, **fields)
