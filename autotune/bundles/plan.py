"""The ``tuning:`` block of a tuned bundle, as one typed class: ``TuningPlan``.

The tuner writes it (``TuningPlan.from_result(result, recipe).as_dict()``: the key's ``TuningResult``,
``autotune.bundles.result``, with the hand-off's recipe) and every stage that reads it
(training's memory limit and precision, the Algo class, ``verify``) reads it as ``config.plan`` of the loaded
``BundleConfig`` (``plan_of`` for a plain view); ``autotune.bundles.config.load_bundle`` checks it when a bundle
is loaded, so a malformed block is one line naming the key, not a ``KeyError`` later. A block carries
``version``; a block without one (written before the field existed) holds the same fields and
loads as version 1, and a newer version than this autotune reads is refused.

The tuned values are one mapping, ``tuned``, keyed by the tunables' names and driven by the table
(``autotune.tunables.TUNABLES``): the block writes each at the top level under its name (the whole-number
tunables first, the choices after the largest fit), reads and checks each from there, and today's three keep
typed properties (``plan.num_patches_per_iter``); ``plan.value(name)`` reads any. A tunable added after a
block was written is simply absent from it (``value`` gives None): only the batch and the sliding-window
batch are required. The block is provenance: the bundle states the tuned values in its template's keys, which
training, inference and the probe read (``autotune.bundles.tuned``); nothing reads them from here but reports.
A block written before the validation device was one value held it twice (``validation_device`` and the flag
``sw_input_on_cpu``); the flag is checked, read where ``validation_device`` is absent, and not written again.
The answer and the figures a program reads are typed fields; the reports a person reads
(``key``, ``batch``, ``handoff``, ``recipe``, ``edge_check``, ...) are plain mappings whose
content is documented in docs/tuning.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.errors import ConfigError
from autotune.tunables import BATCH, SW_BATCH, TUNABLES, VALIDATION_DEVICE, ValidationDevice

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.oom_record import TrainingOOM
    from autotune.bundles.result import TuningResult

__all__ = ["PLAN_VERSION", "TuningPlan", "plan_of"]

PLAN_VERSION = 1
METHODS = ("measured", "estimated")

#: a key a block written by an earlier autotune holds, checked and read, never written: the validation device's flag
_LEGACY_FLAG = "sw_input_on_cpu"
_LEGACY = (_LEGACY_FLAG,)

# field -> (accepted types, required); a report is a mapping, a list a list of ints
_INT, _FLOAT, _STR, _BOOL, _MAP, _LIST = (int,), (int, float), (str,), (bool,), (Mapping,), (list,)


@dataclass(frozen=True)
class TuningPlan:
    """What a tuned bundle was tuned for, its answer, and how the answer was found.

    Attributes:
        tuned: each tunable's value by name (``autotune.tunables``): ``num_patches_per_iter`` the patches per
            forward pass handed to training, ``num_sw_batch_size`` the sliding-window batch,
            ``validation_device`` where the validation volume lives (``device`` or ``cpu``).
        max_num_patches_per_iter: the largest batch that fits (the hand-off may give training less).
        memory_limit: the limit tuned for (bytes); ``margin`` the share kept free; ``budget_bytes``
            what a point could use.
        device, device_name, device_total_memory: the device tuned on (or planned for).
        method: ``measured`` (real probes) or ``estimated`` (the estimator alone: a plan to verify).
        precision: ``fp32``, ``bf16`` or ``fp16``: what the probes ran in.
        peak_bytes, train_peak_bytes, infer_peak_bytes: measured (or estimated) peaks of the answer.
        training_oom: what a training run had to step down to after an out-of-memory, typed
            (``autotune.bundles.oom_record.TrainingOOM``; written by ``autotune.trainer.learn``; the next run starts
            there, the next tune searches again).
    """

    tuned: Mapping[str, Any]
    memory_limit: int
    device: str
    method: str = "measured"
    algo: str | None = None
    objective: str | None = None
    strategy: str | None = None
    status: str = "tuned"
    max_num_patches_per_iter: int | None = None
    device_name: str | None = None
    device_total_memory: int | None = None
    margin: float | None = None
    budget_bytes: int | None = None
    precision: str | None = None
    alloc_conf: str | None = None
    peak_bytes: int | None = None
    train_peak_bytes: int | None = None
    infer_peak_bytes: int | None = None
    samples_per_s: float | None = None
    sw_seconds_per_volume: float | None = None
    probes: int | None = None
    reused_points: int | None = None
    trials: list[int] | None = None
    infer_trials: list[int] | None = None
    train_trial: int | None = None
    infer_trial: int | None = None
    study_name: str | None = None
    infer_study_name: str | None = None
    storage: str | None = None
    wall_seconds: float | None = None
    date: str | None = None
    allowances_validated_on_gpu: bool | None = None
    # reports: plain mappings for people (docs/tuning.md)
    estimator_passes: Mapping[str, Any] | None = None
    edge_check: Mapping[str, Any] | None = None
    handoff: Mapping[str, Any] | None = None
    batch: Mapping[str, Any] | None = None
    key: Mapping[str, Any] | None = None
    recipe: Mapping[str, Any] | None = None
    allowances: Mapping[str, Any] | None = None
    device_model: Mapping[str, Any] | None = None
    target: Mapping[str, Any] | None = None
    verified: Mapping[str, Any] | None = None
    training_oom: TrainingOOM | None = None
    version: int = PLAN_VERSION

    def value(self, name: str) -> Any:
        """The tuned value of the tunable ``name`` (None when the block does not hold it)."""
        return self.tuned.get(name)

    @property
    def num_patches_per_iter(self) -> int:
        """Patches per forward pass handed to training."""
        return int(self.tuned[BATCH.name])

    @property
    def num_sw_batch_size(self) -> int:
        """The sliding-window batch."""
        return int(self.tuned[SW_BATCH.name])

    @property
    def validation_device(self) -> ValidationDevice | None:
        """Where the validation volume lives (None in a block without it)."""
        held = self.value(VALIDATION_DEVICE.name)
        return None if held is None else ValidationDevice(held)

    @property
    def largest_fit(self) -> int:
        """The largest batch that fit: the edge ``verify`` checks one above."""
        return max(self.num_patches_per_iter, int(self.max_num_patches_per_iter or self.num_patches_per_iter))

    @property
    def searched_top(self) -> int | None:
        """The top of the range of patches per iteration that was searched (None when not recorded)."""
        top = ((self.batch or {}).get("searched_range") or [None, None])[1]
        return int(top) if top else None

    @property
    def handoff_rule(self) -> str:
        """``goodput`` or ``largest``: how training's batch was chosen from the largest fit."""
        return str((self.handoff or {}).get("rule") or "goodput")

    def tuned_on(self, device: str) -> bool:
        """True when this plan was measured on a device of the same kind as ``device`` (cpu, cuda)."""
        return self.method == "measured" and self.device.split(":")[0] == str(device).split(":")[0]

    def as_dict(self) -> dict[str, Any]:
        """The block as plain data, in a fixed order (``None`` fields left out)."""
        from autotune.utils import plain_data

        out = {"version": self.version}
        for name in _ORDER:
            out[name] = self.tuned.get(name) if name in _TUNED else getattr(self, name)
        if self.training_oom is not None:
            out["training_oom"] = self.training_oom.as_dict()
        return plain_data({k: v for k, v in out.items() if v is not None})

    def replace(self, **changes: Any) -> TuningPlan:
        """A copy with ``changes`` (checked as a loaded block is)."""
        return TuningPlan.from_dict({**self.as_dict(), **changes}, "tuning")

    @classmethod
    def from_result(cls, result: TuningResult, recipe: Mapping[str, Any] | None = None) -> TuningPlan:
        """The plan of a tuned key's result (``autotune.bundles.result.TuningResult``), with the hand-off's
        ``recipe``: its record (``as_record``, the serialisation the key's study keeps) as the block.

        Raises:
            ConfigError: the result holds a key the plan does not (a field to add here first).
        """
        return cls.from_record(result.as_record(), recipe)

    @classmethod
    def from_record(cls, record: Mapping[str, Any], recipe: Mapping[str, Any] | None = None) -> TuningPlan:
        """The plan of a tuned key's record (``TuningResult.as_record``), with the hand-off's ``recipe``.

        Raises:
            ConfigError: the record holds a key the plan does not (a field to add here first).
        """
        block = {k: v for k, v in record.items() if k != "from_storage" and v is not None}
        if recipe is not None:
            block["recipe"] = dict(recipe)
        return cls.from_dict(block, "tuning")

    @classmethod
    def from_dict(cls, block: Any, where: str) -> TuningPlan:
        """Check ``block`` (a bundle's ``tuning:`` mapping) and return the plan.

        Raises:
            ConfigError: not a mapping, an unknown or missing key, a value of the wrong type, or a
                version this autotune does not read; the message names ``where`` and the key.
        """
        if not isinstance(block, Mapping):
            raise ConfigError(f"{where}: must be a mapping (the tuner writes it); run 'autotune tune' again")
        version = block.get("version", PLAN_VERSION)
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ConfigError(f"{where}.version: must be a positive integer, got {version!r}")
        if version > PLAN_VERSION:
            raise ConfigError(f"{where}.version: {version} was written by a newer autotune (this one reads up to "
                              f"{PLAN_VERSION}); upgrade autotune, or run 'autotune tune' again")
        names = ["version", *_ORDER]
        unknown = sorted(set(block) - set(names) - set(_LEGACY))
        if unknown:
            from autotune.utils import look_up_option

            look_up_option(str(unknown[0]), names, f"key in {where}", ConfigError)
        for name in _REQUIRED:
            if block.get(name) is None:
                raise ConfigError(f"{where}: key {name!r} is missing; run 'autotune tune' again")
        values = {name: _checked(name, block[name], where) for name in names if block.get(name) is not None}
        tuned = {name: values.pop(name) for name in _TUNED if name in values}
        flag = _checked(_LEGACY_FLAG, block[_LEGACY_FLAG], where) if block.get(_LEGACY_FLAG) is not None else None
        if flag is not None and VALIDATION_DEVICE.name not in tuned:
            tuned[VALIDATION_DEVICE.name] = ValidationDevice.of_flag(flag).value
        return cls(tuned=tuned, **values)


_TYPES: dict[str, tuple[type, ...]] = {
    **{t.name: _STR if t.kind == "choice" else _INT for t in TUNABLES},  # the tuned values (autotune.tunables)
    **{name: _INT for name in ("memory_limit", "max_num_patches_per_iter",
                               "device_total_memory", "budget_bytes", "peak_bytes", "train_peak_bytes",
                               "infer_peak_bytes", "probes", "reused_points", "train_trial", "infer_trial", "version")},
    **{name: _FLOAT for name in ("margin", "samples_per_s", "sw_seconds_per_volume", "wall_seconds")},
    **{name: _STR for name in ("device", "method", "algo", "objective", "strategy", "status", "device_name",
                               "precision", "alloc_conf", "study_name", "infer_study_name", "storage", "date")},
    **{name: _BOOL for name in ("allowances_validated_on_gpu", *_LEGACY)},
    **{name: _LIST for name in ("trials", "infer_trials")},
    **{name: _MAP for name in ("estimator_passes", "edge_check", "handoff", "batch", "key", "recipe", "allowances",
                               "device_model", "target", "verified")},
}
_TUNED = tuple(t.name for t in TUNABLES)
_REQUIRED = (BATCH.name, SW_BATCH.name, "memory_limit", "device")  # a tunable added later may be absent


def _order() -> tuple[str, ...]:
    """The keys of a block in the order it is written (after ``version``): the whole-number tunables, the plan's
    fields up to the largest fit, the choice tunables, then the rest: today's three in their places."""
    fields = [f.name for f in dataclasses.fields(TuningPlan) if f.name not in ("tuned", "version")]
    cut = fields.index("max_num_patches_per_iter") + 1

    def of_kind(kind: str) -> list[str]:
        return [t.name for t in TUNABLES if (t.kind == "choice") == (kind == "choice")]

    return (*of_kind("int"), *fields[:cut], *of_kind("choice"), *fields[cut:])


_ORDER = _order()
_POSITIVE = (*(t.name for t in TUNABLES if t.kind == "int"), "memory_limit")
_CHOICES = {"method": METHODS, **{t.name: t.choices for t in TUNABLES if t.kind == "choice"},
            "precision": ("fp32", "bf16", "fp16")}


def _checked(name: str, value: Any, where: str) -> Any:
    """``value`` of key ``name`` when its type is right, else a ``ConfigError`` naming it."""
    if name == "training_oom":
        from autotune.bundles.oom_record import parse_training_oom

        return parse_training_oom(value, where)
    kinds = _TYPES[name]
    wrong = not isinstance(value, kinds) or (kinds is not _BOOL and isinstance(value, bool))
    if not wrong and name in _POSITIVE and value < 1:
        wrong = True
    if not wrong and name in _CHOICES and value not in _CHOICES[name]:
        wrong = True
    if not wrong and name == "device":
        from autotune.checks import device

        device(value, f"{where}.device", error=ConfigError, auto=False)
    if wrong:
        what = {_INT: "an integer", _FLOAT: "a number", _STR: "a string", _BOOL: "true or false",
                _LIST: "a list", _MAP: "a mapping"}[kinds]
        if name in _POSITIVE:
            what = "a positive integer"
        if name in _CHOICES:
            what = " or ".join(_CHOICES[name])
        raise ConfigError(f"{where}.{name}: must be {what}, got {value!r}; run 'autotune tune' again")
    if kinds is _MAP:
        return dict(value)
    if kinds is _FLOAT:
        return float(value)
    return list(value) if kinds is _LIST else value


def plan_of(config: Any, where: str | None = None) -> TuningPlan | None:
    """The plan of a bundle config (None when the bundle was never tuned): a loaded
    ``autotune.bundles.model.BundleConfig`` (which imports this module) holds it parsed, ``config.plan``; the
    ``tuning:`` block of a plain view (a mapping) is checked here.

    Raises:
        ConfigError: the block is malformed (``where`` names the file; default the bundle).
    """
    if not isinstance(config, Mapping):  # a BundleConfig: not a mapping, its plan typed when it was loaded
        return config.plan
    block = config.get("tuning")
    if block is None or isinstance(block, TuningPlan):
        return block
    return TuningPlan.from_dict(block, f"{where or config.get('bundle_root', 'bundle')}: tuning")
