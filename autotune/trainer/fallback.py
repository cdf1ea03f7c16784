"""Out of memory costs speed, never the run: the step-downs a training run takes, and their record.

A training pass of N patches that runs out of memory is repeated in micro-batches (``autotune.step.train_step``
with ``micro_batches``): split in 2, then 4, ... (at most N: micro-batches of one patch) until it fits, with the
same samples, effective batch, learning rate and schedule. A split the run stepped down to whose micro-batches
are no larger than some that already trained in this process (beside the optimizer's state, which its first
step makes) and that fails again may be the allocator's fragmentation rather than the batch
(AdaptDL's lesson: a plain retry often fails again): the run then writes its checkpoint and restarts itself once
from it (``RestartRun``), keeping the split; after that one restart it steps down further. A validation case that runs
out of memory is repeated with half the sliding-window batch, down to 1, then with the validation volume on the
CPU (windows still computed on the device). Only an OOM with nothing left to step down ends the run
(``StepDownsExhausted``: exit 3, one line saying what was tried).

``MemoryFallbacks`` holds what is in force and every step-down (``events``: the ``memory_fallbacks`` list of
``train_summary.json``); its ``state`` goes into each checkpoint, so ``--resume`` and a restart keep it.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal

from autotune.bundles.model import MAX_BATCH
from autotune.checks import Integer
from autotune.checks.typed import Checked, FileModel, parse
from autotune.tunables import ValidationDevice
from autotune.utils import format_bytes

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import Section
    from autotune.bundles.oom_record import StudyRecord

__all__ = ["MemoryFallbacks", "RestartRun", "StepDownsExhausted", "SavedFallbacks", "parse_saved_fallbacks",
           "release_memory", "drain_autograd", "batch_reducing_parts"]


class StepDownsExhausted(MemoryError):
    """Out of memory with nothing left to step down to; ``tried`` says what was tried, in words."""

    def __init__(self, tried: str) -> None:
        self.tried = tried
        super().__init__(tried)


class RestartRun(Exception):
    """A split that had fit ran out of memory again: restart once from a checkpoint written at this pass.

    Attributes:
        progress: the epoch's ``EpochProgress`` up to the pass that failed (set by ``train_epoch``).
        max_time_left: the time budget the restarted run gets (set by the runner; None: no budget).
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.progress: Any = None
        self.max_time_left: float | None = None
        super().__init__(reason)


def release_memory(device: str) -> None:
    """Free what a failed step left: the failed backward pass's graph (``drain_autograd``), unreachable tensors (a
    traceback's frames), and on CUDA the caching allocator's free blocks (``empty_cache``)."""
    drain_autograd(device)
    gc.collect()
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def drain_autograd(device: str) -> None:
    """Drop what a failed backward pass left queued in autograd's engine, and with it that pass's graph.

    A backward pass that raises (an out-of-memory inside it) leaves the nodes it had already made ready in the
    ready queue of the thread that ran them (for the CPU the calling thread's, kept between passes). Each holds
    its part of the graph, and so the forward pass's saved activations, until the next backward pass on that
    queue pops it. On the CPU that is most of the failed pass's forward (7.1 MiB of the tiny UNet's 2-patch
    pass, against 10.8 MiB for a whole pass of one patch), so a split retried beside it runs out again. An empty
    backward pass on the CPU and on ``device`` pops them: their pass has ended, so they are dropped unrun.
    """
    import torch

    for where in {"cpu", str(device)}:
        torch.zeros((), device=where, requires_grad=True).backward()


def batch_reducing_parts(loss: Section | None, model: Any) -> list[str]:
    """What reduces over the batch in this bundle, so that a split is not exactly the unsplit step: batch
    normalisation layers, a Dice loss over the whole batch (``batch: true`` in the ``loss`` section or its args).
    Empty for the templates' own networks (InstanceNorm, GroupNorm: per sample)."""
    import torch

    found = sorted({type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)})
    if loss is not None and (loss.extra("batch") or loss.args.get("batch")):
        found.append(f"{loss.name} with batch: true")
    return found


class SavedFallbacks(FileModel):
    """A checkpoint's ``memory_fallbacks`` (``MemoryFallbacks.state``): the step-downs in force and their events.
    A checkpoint written before ``validation_device`` held the flag ``on_cpu`` instead; it loads as that."""

    micro_batches: Annotated[int, Checked(Integer(1, MAX_BATCH))]
    sw_batch: Annotated[int, Checked(Integer(1, MAX_BATCH))]
    validation_device: Literal["device", "cpu"] | None = None
    on_cpu: bool | None = None  # the earlier checkpoints' flag (read, never written)
    events: list[dict[str, Any]]

    @property
    def validation(self) -> ValidationDevice:
        """Where the validation volume was held."""
        if self.validation_device is not None:
            return ValidationDevice(self.validation_device)
        return ValidationDevice.of_flag(bool(self.on_cpu))


class _Saved(FileModel):
    memory_fallbacks: SavedFallbacks  # where the state sits in a checkpoint, so that a refusal names its key


def parse_saved_fallbacks(state: Mapping[str, Any], where: str) -> SavedFallbacks:
    """A checkpoint's ``memory_fallbacks`` (``where`` names the checkpoint), checked.

    Raises:
        ConfigError: one line naming ``where``, ``memory_fallbacks.<key>`` and what is allowed.
    """
    return parse(_Saved, {"memory_fallbacks": state}, where, fix="start without --resume").memory_fallbacks


class MemoryFallbacks:
    """The step-downs in force in a training run and their record.

    Args:
        sw_batch: the bundle's sliding-window batch; ``validation_device``: where it holds its validation volume.
        device: the run's device (on the CPU the validation volume is there already: no CPU step-down).
        limit: the memory limit, for the record (None: the device's memory).
        say: where a step-down's one line goes (rank 0's console).
        exact_note: what reduces over the batch (``batch_reducing_parts``); '' when a split is exact.
    """

    def __init__(self, sw_batch: int, validation_device: ValidationDevice, device: str, limit: int | None,
                 say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
                 exact_note: str = "") -> None:
        self.micro_batches = 1
        self.sw_batch = max(1, int(sw_batch))
        self.validation_device = ValidationDevice(validation_device)
        self.device, self.limit, self.say = str(device), limit, say
        self.exact_note = exact_note
        self.events: list[dict[str, Any]] = []
        self.fitted_size = 0  # the largest micro-batch (patches) that trained beside the optimizer's state here
        self.restarted = False  # this run is the one restart a run may take
        self.tried: list[int] = []  # splits tried on the pass that is failing now
        self.from_record = ""  # the line saying the run starts with an earlier run's step-downs ('' if not)
        self.on_event: Callable[[dict[str, Any]], None] | None = None  # told of every step-down (the record)
        self.study: StudyRecord | None = None  # where this run's training failure went in the study (learn.py)

    def in_force(self) -> dict[str, Any]:
        """The metrics row's columns: micro-batches, sliding-window batch and validation device in force."""
        return {"micro_batches": self.micro_batches, "sw_batch": self.sw_batch,
                "validation_device": self.validation_device.value}

    def state(self) -> dict[str, Any]:
        """Plain data for a checkpoint (``weights_only`` loads it)."""
        return {"micro_batches": self.micro_batches, "sw_batch": self.sw_batch,
                "validation_device": self.validation_device.value, "events": list(self.events)}

    def load(self, state: Mapping[str, Any] | None, where: str = "last.pt") -> bool:
        """Put back what ``state`` kept (a checkpoint's, ``where``; None: nothing); whether there was one.

        Raises:
            ConfigError: a value the checkpoint holds is not one ``state`` writes (one line naming the key).
        """
        if not state:
            return False
        saved = parse_saved_fallbacks(state, where)
        self.micro_batches, self.sw_batch, self.validation_device = saved.micro_batches, saved.sw_batch, saved.validation
        self.events = [dict(e) for e in saved.events]
        return True

    def _under(self) -> str:
        return format_bytes(self.limit) if self.limit else "the device's memory"

    def fitted_pass(self, patches: int, with_state: bool = True) -> None:
        """A pass of ``patches`` patches fit in the micro-batches in force; ``with_state``: beside the optimizer's
        state (made by its first step), so micro-batches of that size are known to fit in this process."""
        if with_state:
            self.fitted_size = max(self.fitted_size, -(-int(patches) // self.micro_batches))
        self.tried = []

    def training_oom(self, patches: int, peak: int | None, epoch: int, step: int) -> dict[str, Any]:
        """A training pass of ``patches`` patches ran out of memory (at ``peak`` bytes) at ``step`` of ``epoch``:
        step down (the event, also in ``events``), or raise.

        Raises:
            RestartRun: the split in force had fit in this process before (once per run).
            StepDownsExhausted: the pass failed in micro-batches of one patch.
        """
        failed = self.micro_batches
        self.tried.append(failed)
        what = f"training pass of {patches} patches" + (f" in {failed} micro-batches" if failed > 1 else "")
        if failed > 1 and -(-int(patches) // failed) <= self.fitted_size and not self.restarted:
            self.fitted_size = 0
            event = self._event("training", epoch, step, what, peak, f"restart from a checkpoint in {failed} "
                                "micro-batches (as large ones fit here before: the allocator's blocks may be cut up)")
            raise RestartRun(event["done"])
        if failed >= patches:
            tried = ", then ".join("whole" if k == 1 else f"in {k} micro-batches" for k in sorted(set(self.tried)))
            raise StepDownsExhausted(f"the {patches}-patch pass {tried}, the last of one patch each")
        self.micro_batches = min(2 * failed, patches)
        size = -(-patches // self.micro_batches)
        note = f"; not exact here: {self.exact_note} reduce over the batch" if self.exact_note else " (the same step)"
        return self._event("training", epoch, step, what, peak,
                           f"split into {self.micro_batches} micro-batches of up to {size} "
                           f"patch{'es' if size > 1 else ''}{note}")

    def validation_oom(self, peak: int | None, epoch: int, case: int) -> dict[str, Any]:
        """Validation of ``case`` ran out of memory: halve the sliding-window batch, then move the volume to the
        CPU; the event (also in ``events``).

        Raises:
            StepDownsExhausted: the window batch is 1 and the volume is on the CPU (or the run is on the CPU).
        """
        what = f"validation of case {case} with sw batch {self.sw_batch} on the {self.validation_device}"
        if self.sw_batch > 1:
            self.sw_batch = max(1, self.sw_batch // 2)
            done = f"sliding-window batch down to {self.sw_batch}"
        elif self.validation_device is ValidationDevice.DEVICE and not self.device.startswith("cpu"):
            self.validation_device = ValidationDevice.CPU
            done = "validation volume moved to the CPU (windows still on the device)"
        else:
            held = ValidationDevice.CPU if self.device.startswith("cpu") else self.validation_device
            where = "on the CPU" if held is ValidationDevice.CPU else "on the device"
            raise StepDownsExhausted(f"validation with sliding-window batch 1 and the volume {where}")
        return self._event("validation", epoch, case, what, peak, done)

    def _event(self, phase: str, epoch: int, where: int, what: str, peak: int | None, done: str) -> dict[str, Any]:
        event = {"phase": phase, "epoch": int(epoch), ("step" if phase == "training" else "case"): int(where),
                 "failed": what, "peak_bytes": None if peak is None else int(peak), "limit_bytes": self.limit,
                 "done": done}
        self.events.append(event)
        at = f"step {where}" if phase == "training" else f"case {where}"
        peak_text = f", peak {format_bytes(peak)}" if peak else ""
        self.say(f"memory: out of memory in {what} (epoch {epoch}, {at}{peak_text} under {self._under()}): {done}")
        if self.on_event is not None:
            self.on_event(event)
        return event
