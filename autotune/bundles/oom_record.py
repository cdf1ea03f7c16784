"""The ``training_oom`` record of a bundle's ``tuning:`` block, as one typed model: ``TrainingOOM``.

A training run that stepped down after an out-of-memory writes it (``autotune.trainer.learn``): the batch that
failed, the limit and device, the micro-batches, sliding-window batch and validation device in force, the last
step-down and where the key's study got it. The next run of the bundle at the same batch, limit and device starts
there (``autotune.trainer.learn.start_fallbacks``). It is parsed with the block (``TuningPlan.from_dict``), so a
value edited by hand (``micro_batches: two``, more micro-batches than the pass has patches) is one line naming the
file and ``tuning.training_oom.<key>``, before anything trains.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import model_validator

from autotune.checks import Integer, Text, device
from autotune.checks.typed import Checked, FileModel, parse, refuse_key

__all__ = ["TrainingOOM", "StudyRecord", "parse_training_oom", "MAX_PATCHES"]

KEY = "tuning.training_oom"
FIX = (f"fix it, or remove {KEY} (the next run then starts unsplit and steps down again where memory runs out)")

# as ``autotune.bundles.model.MAX_BATCH`` (importing it would close a cycle: the model loads the plan, which loads this)
MAX_PATCHES = 65_536
Patches = Annotated[int, Checked(Integer(1, MAX_PATCHES))]


def _device(value: Any, where: str, error: Any) -> str:
    return device(value, where, error=error, auto=False)


class StudyRecord(FileModel):
    """Where the failed training pass went in the key's study (``autotune.search.storage.training_oom``):
    ``recorded`` and the ``study_name`` and ``trial`` that hold it, or the ``reason`` it was not."""

    recorded: bool
    study_name: Annotated[str, Checked(Text())] | None = None
    trial: Annotated[int, Checked(Integer(0, 2**62))] | None = None
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The record as plain data (None fields left out)."""
        return self.model_dump(exclude_none=True)


class TrainingOOM(FileModel):
    """What a training run of the bundle stepped down to (docs/training.md, "When memory runs out").

    Attributes:
        num_patches_per_iter: the patches per pass that ran out of memory.
        micro_batches: the micro-batches each pass is split into (at most ``num_patches_per_iter``).
        sw_batch: the sliding-window batch in force; ``validation_device``: where the validation volume lives.
        memory_limit: the limit trained under (bytes; None: the device's memory); ``device``: the device.
        last: the last step-down (a report: ``autotune.trainer.fallback.MemoryFallbacks`` events).
        date: when it was written; ``study``: where the key's study got the failed pass.
    """

    num_patches_per_iter: Patches
    micro_batches: Patches
    sw_batch: Patches
    validation_device: Literal["device", "cpu"]
    memory_limit: Annotated[int, Checked(Integer(1, 2**62))] | None = None
    device: Annotated[str, Checked(_device)]
    last: dict[str, Any] | None = None
    date: Annotated[str, Checked(Text())] | None = None
    study: StudyRecord | None = None

    @model_validator(mode="after")
    def _split_within_the_pass(self) -> TrainingOOM:
        patches = self.num_patches_per_iter
        if self.micro_batches > patches:
            refuse_key(f"{KEY}.micro_batches", f"got {self.micro_batches}; must be a whole number from 1 to "
                       f"num_patches_per_iter ({patches}): a pass of {patches} patches splits into at most {patches} "
                       f"micro-batches; {FIX}")
        return self

    def as_dict(self) -> dict[str, Any]:
        """The record as plain data (what the block holds; None fields left out)."""
        return self.model_dump(exclude_none=True)


class _Tuning(FileModel):
    training_oom: TrainingOOM


class _Top(FileModel):
    """The record where it sits in the file, so that a refusal names its key from the file's top."""

    tuning: _Tuning


def parse_training_oom(value: Any, where: str) -> TrainingOOM:
    """``value`` (the block's ``training_oom``) as a ``TrainingOOM``; ``where`` names the block (``FILE: tuning``).

    Raises:
        ConfigError: one line naming the file, ``tuning.training_oom.<key>``, the value and what is allowed.
    """
    if isinstance(value, TrainingOOM):
        return value
    return parse(_Top, {"tuning": {"training_oom": value}}, where.removesuffix(": tuning"), fix=FIX).tuning.training_oom
