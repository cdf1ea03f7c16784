"""What a training run that stepped down after an out-of-memory tells its bundle and its study.

Each step-down is written at once (rank 0) into the bundle's ``tuning:`` block as ``training_oom``: the batch
that failed, the limit and device, and the micro-batches, sliding-window batch and validation device in force.
The next run of the bundle at the same batch, limit and device starts there (``start_fallbacks``): no OOM is paid
twice. A training pass that failed under the key's own limit on the tuned device is also a point of the key's
study (``autotune.search.storage.training_oom``): a COMPLETE trial of ``kind: training`` that does not fit, and the study's
``training_oom`` attribute, so the next ``autotune tune`` of the key searches again
(``autotune.search.driver.key``) and its evaluator takes that batch as not fitting
(``autotune.search.strategies.evaluate``). A record that cannot be written costs a warning, never the run.
"""

from __future__ import annotations

import datetime as _dt
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.trainer.fallback import MemoryFallbacks, batch_reducing_parts
from autotune.tunables import ValidationDevice

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig
    from autotune.bundles.oom_record import TrainingOOM

__all__ = ["start_fallbacks", "learn_from"]


def _warn(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr, flush=True)


def start_fallbacks(config: BundleConfig, ctx: Any, limit: int | None, model: Any,
                    restarted: bool = False) -> MemoryFallbacks:
    """The step-downs a run starts with: none, or those an earlier run of this bundle recorded at the same batch,
    limit and device (``from_record`` then says so in a line); rank 0 learns from every new one."""

    def say(line: str) -> None:
        if ctx.is_main:
            print(line, file=sys.stderr, flush=True)

    tuned = config.tuned
    fallbacks = MemoryFallbacks(tuned.num_sw_batch_size, tuned.validation_device, ctx.device, limit, say=say,
                                exact_note=", ".join(batch_reducing_parts(config.loss, model)))
    fallbacks.restarted = restarted
    plan = tuned.plan
    record = plan.training_oom if plan is not None else None
    if record is not None and _same_run(record, tuned.num_patches_per_iter, limit, str(ctx.device)):
        fallbacks.micro_batches = record.micro_batches
        fallbacks.sw_batch = min(fallbacks.sw_batch, record.sw_batch)
        if record.validation_device == ValidationDevice.CPU:
            fallbacks.validation_device = ValidationDevice.CPU
        fallbacks.from_record = (f"memory: starting in {fallbacks.micro_batches} micro-batches, sw batch "
                                 f"{fallbacks.sw_batch}, validation on the {fallbacks.validation_device}: an earlier "
                                 "run of this bundle stepped down to them (tuning.training_oom)")
    if ctx.is_main and plan is not None:
        fallbacks.on_event = lambda event: learn_from(config, fallbacks, event)
    return fallbacks


def _same_run(record: TrainingOOM, patches: int, limit: int | None, device: str | None = None) -> bool:
    """Whether ``record`` was written by a run at ``patches`` patches per pass under ``limit`` (on ``device``)."""
    return (record.num_patches_per_iter == patches and record.memory_limit == limit
            and (device is None or record.device == device))


def learn_from(config: BundleConfig, fallbacks: MemoryFallbacks, event: Mapping[str, Any]) -> None:
    """Write ``event`` (a step-down) into the bundle's ``tuning.training_oom`` and, for a training pass under the
    key's own limit on the tuned device, into the key's study. A refused write is a warning."""
    from autotune.bundles.config import update_bundle_config
    from autotune.bundles.oom_record import StudyRecord, TrainingOOM

    tuned = config.tuned
    plan = tuned.plan
    if plan is None:
        return
    patches = tuned.num_patches_per_iter
    earlier = plan.training_oom
    if event["phase"] == "training" and fallbacks.study is None:  # the batch's failure goes to the study once
        if (earlier is not None and _same_run(earlier, patches, fallbacks.limit)
                and earlier.study is not None and earlier.study.recorded):
            fallbacks.study = earlier.study  # an earlier run of this bundle recorded it
        else:
            from autotune.search.storage.training_oom import record_in_study

            fallbacks.study = StudyRecord(**record_in_study(plan, patches, event, config.bundle_root, fallbacks.device))
    study = fallbacks.study if fallbacks.study is not None else (earlier.study if earlier is not None else None)
    try:
        record = TrainingOOM(num_patches_per_iter=patches, micro_batches=fallbacks.micro_batches,
                             sw_batch=fallbacks.sw_batch, validation_device=fallbacks.validation_device.value,
                             memory_limit=fallbacks.limit, device=fallbacks.device, last=dict(event),
                             date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), study=study)
        update_bundle_config(config.bundle_root, {"tuning": plan.replace(training_oom=record).as_dict()})
    except Exception as exc:  # noqa: BLE001 - the record is worth a line, never the run
        _warn(f"could not record the step-down in {config.bundle_root} (tuning.training_oom): {exc}")
