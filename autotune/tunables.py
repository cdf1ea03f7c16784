"""The values autotune tunes, each defined once: ``Tunable`` and the table ``TUNABLES``.

A tunable is what the search chooses and the write-back hands to training: the patches per forward pass
(``num_patches_per_iter``), the sliding-window batch (``num_sw_batch_size``) and where the validation volume
lives (``validation_device``). Its definition holds its name (the plain key of a view, a probe request and
result, a trial's point and the ``tuning:`` plan), its type and range or choices, the spec keys that set its
range (MONAI's ``gpu_customization_specs`` names kept), the probe phase that measures it and how it is shown.
Where each template keeps it is the template families' key tables (``autotune.families``).

The places that enumerate tunables read this table: the specs' keys and ranges
(``autotune.search.strategies.space``), the command line's flags (``autotune.commands.probe``,
``autotune.commands.search``), the probe's request and result (``autotune.probe.runner``,
``autotune.probe.trial``), the search space and the outcome (``autotune.search.strategies.outcome``, ``tpe``),
the plan (``autotune.bundles.plan``), the values training reads (``autotune.bundles.tuned``), the write-back
(``written_values`` here, ``autotune.search.driver.writeback``) and the dashboard's note.
docs/architecture.md, "Adding a tunable", lists what else a new one touches.

One point of the search, one value per tunable, is a ``Point``: the estimator and the probe runner take one
(``autotune.probe``), the probers pass one, and ``at(phase, n)`` sizes a phase by the tunable ``sized_by``
names. The loader batch that yields a batch is computed in one function, ``loader_settings``.

Where the validation volume lives is one enum inside the code, ``ValidationDevice`` (``DEVICE``, ``CPU``), valued
by the strings the files, the probe's request and the study keep (``device``, ``cpu``); where a volume is put
for windows running on a device is one function, ``ValidationDevice.volume_device``. A bundle's file keeps it as
its family's one key (``sw_input_on_cpu`` for autotune's own, MONAI's own key for MONAI's: the families' key
tables).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any

__all__ = ["Tunable", "TUNABLES", "BATCH", "SW_BATCH", "VALIDATION_DEVICE", "ValidationDevice", "Point", "tunable",
           "of_phase", "sized_by", "spec_key_names", "bundle_values", "loader_batch_patches",
           "loader_settings", "written_values"]


class ValidationDevice(str, Enum):
    """Where the validation (and inference) volume and its stitched output live while the sliding window's
    windows run on the compute device: ``DEVICE`` (the compute device itself) or ``CPU`` (the host, so that a
    large volume does not hold device memory). Its values are the strings files, probe requests and studies
    keep; a member equals its string (``ValidationDevice.CPU == "cpu"``) and prints as it."""

    DEVICE = "device"
    CPU = "cpu"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def of(cls, value: ValidationDevice | str | None) -> ValidationDevice:
        """``value`` as a member (None: ``DEVICE``, where a search or an estimate leaves it open).

        Raises:
            ValueError: not ``device`` or ``cpu``.
        """
        return cls.DEVICE if value is None else cls(value)

    @classmethod
    def of_flag(cls, flag: bool) -> ValidationDevice:
        """The member a view's flag stands for (``sw_input_on_cpu``: set when the volume is held on the CPU)."""
        return cls.CPU if flag else cls.DEVICE

    def volume_device(self, device: Any) -> str:
        """Where a validation or inference volume (and its stitched output) is put for windows that run on
        ``device``: the CPU, or ``device`` itself. The one place this is decided: the trainer, the inferer, the
        Algo class, the probe and the estimator ask it."""
        return "cpu" if self is ValidationDevice.CPU else str(device)


@dataclass(frozen=True)
class Tunable:
    """One tuned value (see the module docstring).

    Attributes:
        name: its plain key (view, probe request and result, a trial's point, the ``tuning:`` plan).
        kind: ``int`` (searched in a range) or ``choice`` (one of ``choices``).
        phase: the probe phase that measures it: ``train`` or ``infer``.
        spec_key: the spec key that sets its range or its choices for a search.
        spec_aliases: other names the specs accept for ``spec_key`` (MONAI's ``range_num_images_per_batch``).
        default_range: the range searched when neither the specs nor the bundle's ``tuning_ranges`` give one.
        choices: the values of a ``choice`` tunable, in order.
        bundle_key: the key of a view that holds the value (``sw_input_on_cpu`` for the validation device).
        label: its column heading in the tables autotune prints; ``unit`` what one step of it counts.
        probed: how the probe measures it (docs and help text).
        flag_help: the help of its flag on ``autotune probe`` and ``autotune estimate`` (the flag is its name with
            dashes: ``--num-patches-per-iter``); empty: ``probed`` and that the bundle's value is the default.
        metavar: the flag's value in the help (``N``); a choice tunable lists its choices instead.
        spec_help: the help of its range flag on ``autotune tune``, ``run`` and ``worker`` (the flag is its last
            spec name with dashes: ``--range-num-images-per-batch``); empty: one generated from ``unit``.
    """

    name: str
    kind: str
    phase: str
    spec_key: str
    label: str
    unit: str
    probed: str
    spec_aliases: tuple[str, ...] = ()
    default_range: tuple[int, int] | None = None
    choices: tuple[str, ...] = ()
    bundle_key: str | None = None
    flag_help: str = ""
    metavar: str = "N"
    spec_help: str = ""

    @property
    def flag(self) -> str:
        """Its command-line flag: ``--`` and its name with dashes."""
        return "--" + self.name.replace("_", "-")

    @property
    def help(self) -> str:
        """The help of its flag (``flag_help``, else how it is probed and the bundle's value as the default)."""
        return self.flag_help or f"{self.probed} (default: the bundle's value)"

    @property
    def spec_flag(self) -> str:
        """The flag of its range (its choices) in a search: its last spec name with dashes."""
        return "--" + self.spec_names[-1].replace("_", "-")

    @property
    def spec_flag_help(self) -> str:
        """The help of ``spec_flag`` (``spec_help``, else one from ``unit`` or the choices)."""
        if self.spec_help:
            return self.spec_help
        if self.kind == "choice":
            return f"comma-separated from {','.join(self.choices)} (default all)"
        return f"range of {self.unit or self.name} to search"

    @property
    def spec_names(self) -> tuple[str, ...]:
        """Every spec key that sets this tunable: ``spec_key`` and its aliases."""
        return (self.spec_key, *self.spec_aliases)

    def bundle_value(self, config: Any) -> Any:
        """The value a loaded config (``autotune.bundles.model.BundleConfig``) holds: what training gets when
        nothing is tuned."""
        held = config.tunable_value(self.view_key)
        if self.kind == "choice":  # a flag in the view: the second choice when it is set
            return self.choices[1] if held else self.choices[0]
        return int(held)

    def written_value(self, written: Mapping[str, Any]) -> Any:
        """The value plain written keys hold (``written_values``', as a tuned result carries them): the inverse of
        ``view_entry``; None where an int tunable's key is not there."""
        held = written.get(self.view_key)
        if self.kind == "choice":
            return self.choices[1] if held else self.choices[0]
        return None if held is None else int(held)

    @property
    def view_key(self) -> str:
        """The key of a view (a field of a loaded config) that holds its value."""
        return self.bundle_key or self.name

    def view_entry(self, value: Any) -> tuple[str, Any]:
        """The key of a view and what it holds for ``value`` (the inverse of ``bundle_value``)."""
        if self.kind == "choice":
            return self.bundle_key or self.name, value == self.choices[1]
        return self.bundle_key or self.name, int(value)


BATCH = Tunable(
    name="num_patches_per_iter", kind="int", phase="train", spec_key="range_num_patches_per_iter",
    spec_aliases=("range_num_images_per_batch",), default_range=(1, 64), label="patches/iter", unit="patches",
    probed="training steps of N patches per forward pass (the loader batch that splits into whole passes of N)",
    flag_help="patches per forward pass in training (default: the bundle's value)",
    spec_help="range of patches per forward pass to search")
SW_BATCH = Tunable(
    name="num_sw_batch_size", kind="int", phase="infer", spec_key="range_num_sw_batch_size", default_range=(1, 64),
    label="sw batch", unit="windows",
    probed="sliding-window validation of one volume of the 99.5th-percentile size, M windows per pass",
    flag_help="sliding-window batch size in validation (default: the bundle's value)", metavar="M",
    spec_help="range of sliding-window batch sizes to search")
VALIDATION_DEVICE = Tunable(
    name="validation_device", kind="choice", phase="infer", spec_key="validation_devices",
    choices=tuple(member.value for member in ValidationDevice),
    bundle_key="sw_input_on_cpu", label="val on", unit="",
    probed="the same validation pass with the volume on the compute device or on the CPU (windows on the device)",
    flag_help="where the validation volume and stitched output are held "
              "(default: cpu if the bundle sets sw_input_on_cpu, else device)",
    spec_help="comma-separated from device,cpu (default both)")

#: every tunable, in the order the search decides them and the tables show them
TUNABLES: tuple[Tunable, ...] = (BATCH, SW_BATCH, VALIDATION_DEVICE)


@dataclass(frozen=True)
class Point:
    """One value per tunable, by name: what the estimator and the probe runner are asked to run at
    (``autotune.probe.resolve_request``, ``estimate``, ``run_probe``) and what the probers pass them. A tunable
    left out means the bundle's value. ``Point.of`` is the one door where named values enter (keywords, a
    strategy's point); ``at`` sizes a phase (``sized_by``), ``without`` leaves tunables to the bundle.

    Attributes:
        values: the given values by tunable name (read-only; never None).
    """

    values: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, point: Point | Mapping[str, Any] | None = None, **values: Any) -> Point:
        """``point``'s values and ``values`` over them, None left out (unknown names kept: ``unknown`` names
        them for the caller to refuse)."""
        base = point.values if isinstance(point, Point) else (point or {})
        merged = {**base, **values}
        return cls(MappingProxyType({k: _plain(v) for k, v in merged.items() if v is not None}))

    @classmethod
    def taken_from(cls, mapping: Mapping[str, Any]) -> Point:
        """The tunables' values a wider mapping holds (a strategy's point, a record)."""
        return cls.of({t.name: mapping.get(t.name) for t in TUNABLES})

    def get(self, name: str) -> Any:
        """The value given for tunable ``name`` (None: the bundle's)."""
        return self.values.get(name)

    @property
    def num_patches_per_iter(self) -> int | None:
        return self.get(BATCH.name)

    @property
    def num_sw_batch_size(self) -> int | None:
        return self.get(SW_BATCH.name)

    @property
    def validation_device(self) -> ValidationDevice | None:
        held = self.get(VALIDATION_DEVICE.name)
        return None if held is None else ValidationDevice(held)

    def unknown(self) -> list[str]:
        """The given names that are no tunable's, sorted."""
        return sorted(set(self.values) - {t.name for t in TUNABLES})

    def with_values(self, **values: Any) -> Point:
        """This point with ``values`` set (None: back to the bundle's)."""
        merged = {**self.values, **values}
        return Point(MappingProxyType({k: _plain(v) for k, v in merged.items() if v is not None}))

    def without(self, *names: str) -> Point:
        """This point with ``names`` left to the bundle."""
        return Point(MappingProxyType({k: v for k, v in self.values.items() if k not in names}))

    def at(self, phase: str, n: int) -> Point:
        """This point with the tunable that sizes ``phase`` (``sized_by``) at ``n``."""
        return self.with_values(**{sized_by(phase).name: n})

    def as_dict(self) -> dict[str, Any]:
        return dict(self.values)


def _plain(value: Any) -> Any:
    """A point's value as its files and studies keep it (an enum member as its string)."""
    return value.value if isinstance(value, Enum) else value


def tunable(name: str) -> Tunable:
    """The tunable called ``name``.

    Raises:
        KeyError: no tunable has that name.
    """
    for item in TUNABLES:
        if item.name == name:
            return item
    raise KeyError(f"no tunable {name!r}; known: {', '.join(t.name for t in TUNABLES)}")


def of_phase(phase: str) -> tuple[Tunable, ...]:
    """The tunables the probe phase ``phase`` (``train``, ``infer``) measures."""
    return tuple(t for t in TUNABLES if t.phase == phase)


def sized_by(phase: str) -> Tunable:
    """The whole-number tunable a probe phase's memory grows with: the batch (``train``, and a joint trial) or
    the sliding-window batch (``infer``)."""
    return next(t for t in TUNABLES if t.phase == ("infer" if phase == "infer" else "train") and t.kind == "int")


def spec_key_names() -> tuple[str, ...]:
    """Every spec key a tunable answers to (aliases included), in the table's order."""
    return tuple(name for t in TUNABLES for name in t.spec_names)


def bundle_values(config: Any) -> dict[str, Any]:
    """Each tunable's value in the loaded ``config`` (``autotune.bundles.model.BundleConfig``, which imports this
    module: hence ``Any``)."""
    return {t.name: t.bundle_value(config) for t in TUNABLES}


def loader_batch_patches(num_patches_per_iter: int, num_crops_per_image: int) -> int:
    """Patches in one loader batch for N patches per forward pass: images x crops = lcm(N, crops),
    so the batch splits into whole passes of N."""
    import math

    return math.lcm(max(1, int(num_patches_per_iter)), max(1, int(num_crops_per_image)))


def loader_settings(num_patches_per_iter: int, num_crops_per_image: int) -> dict[str, int]:
    """The loader batch that splits into whole forward passes of N patches: images x crops = lcm(N, crops)
    (``loader_batch_patches``; the probe holds this batch too). The one place the loader batch is
    computed from the batch: the write-back (``written_values``) and the hand-off's schedule read it."""
    n, crops = int(num_patches_per_iter), max(1, int(num_crops_per_image))
    images = loader_batch_patches(n, crops) // crops
    return {BATCH.name: n, "num_images_per_batch": images, "num_crops_per_image": crops}


def written_values(point: Point, config: Any) -> dict[str, Any]:
    """The plain keys a tuned ``point`` (``autotune.bundles.result.TuningResult.point``) writes into a view (a
    template family puts them in its own keys): the batch with the loader batch that yields it
    (``loader_settings``), and every other tunable the point holds under its view key (``Tunable.view_entry``:
    ``sw_input_on_cpu`` for the validation device); a tunable the point leaves out (a strategy that does not
    decide it) keeps the bundle's value. ``config``: the bundle's ``BundleConfig`` (its ``num_crops_per_image``)."""
    out: dict[str, Any] = {}
    for t in TUNABLES:
        value = point.get(t.name)
        if t is BATCH:
            out.update(loader_settings(int(value), config.num_crops_per_image))
        elif value is not None:
            key, held = t.view_entry(value)
            out[key] = held
    return out
