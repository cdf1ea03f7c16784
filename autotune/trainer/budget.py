"""Training to a wall-clock budget: the schedule's length and the validation cadence fitted to the time.

``autotune train --max-time 10m`` without ``--epochs`` plans the run from measured time, as a user
with a fixed budget of GPU hours expects: after the first few batches (``FIRST_FIT_BATCHES``, the
very first left out: it pays one-off set-up) the run knows its seconds per batch and plans how many
epochs fit in what is left of the budget, and at every epoch end it plans again from the epochs it
has timed (training, and validation shared over the epochs between two validations). The learning
rate schedule (warm-up, decay) is re-planned to that many optimizer steps
(``autotune.schedule.FittedSchedule``), validation runs about ``VALIDATIONS`` times per run (at most
``MAX_VAL_SHARE`` of the time, once measured) and always after the last epoch, and the run ends at
the last epoch end that leaves too little time for another epoch, so it finishes within its budget
(a run always trains at least one epoch).

With ``--epochs`` (or neither option), the epoch count sets the schedule as before; ``--max-time``
is then only a stop, checked at epoch ends. ``TimeFit.record`` says which one set the schedule.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TimeFit", "schedule_set_by", "FIRST_FIT_BATCHES", "VALIDATIONS", "MAX_VAL_SHARE"]

FIRST_FIT_BATCHES = 4  # batches timed (after the first) before the first plan
VALIDATIONS = 20  # validations per run when the budget sets the cadence
MAX_VAL_SHARE = 0.1  # validation takes at most this share of the time, once its cost is measured
# Until the first validation is timed, it is assumed to cost this share of an epoch's training.
ASSUMED_VAL_SHARE = 0.1


def schedule_set_by(epochs: int | None, max_time: float | None) -> str:
    """``epochs`` (``--epochs`` given), ``max_time`` (only ``--max-time`` given) or ``config`` (neither:
    the bundle's ``num_epochs``)."""
    if epochs is not None:
        return "epochs"
    return "max_time" if max_time is not None else "config"


@dataclass
class TimeFit:
    """The plan of a run trained to ``budget_s`` seconds: planned epochs and the validation cadence.

    ``elapsed`` arguments are seconds since the run started (set-up and caching included), so the
    plan leaves room for what the run has already spent.
    """

    budget_s: float
    batches_per_epoch: int
    planned_epochs: int
    val_every: int
    fixed_val_every: bool = False
    train_s: dict[int, float] = field(default_factory=dict)
    ends: dict[int, float] = field(default_factory=dict)
    val_s: list[float] = field(default_factory=list)
    refits: list[dict[str, Any]] = field(default_factory=list)
    _batch_times: list[float] = field(default_factory=list)

    def batch_done(self, now: float, elapsed: float, epoch: int, batches_done: int) -> int | None:
        """Count a finished batch (``batches_done`` of ``epoch``'s) of the first epoch this process trains
        (``now``: a monotonic clock). Returns the first plan once ``FIRST_FIT_BATCHES`` batches after the
        first are timed, else None."""
        if self.refits or len(self._batch_times) > FIRST_FIT_BATCHES:
            return None
        self._batch_times.append(now)
        if len(self._batch_times) <= FIRST_FIT_BATCHES:
            return None
        per_batch = (self._batch_times[-1] - self._batch_times[0]) / FIRST_FIT_BATCHES
        epoch_s = per_batch * self.batches_per_epoch * (1.0 + ASSUMED_VAL_SHARE)
        rest_of_epoch = per_batch * max(0, self.batches_per_epoch - batches_done)
        # the last epoch is always validated: room for one whole validation is kept
        left = self.budget_s - elapsed - rest_of_epoch - ASSUMED_VAL_SHARE * per_batch * self.batches_per_epoch
        return self._plan(epoch + max(0, math.floor(left / epoch_s)) if epoch_s > 0 else epoch, "first batches",
                          elapsed, per_batch * self.batches_per_epoch)

    def epoch_done(self, epoch: int, train_s: float, elapsed: float) -> int:
        """Plan again after ``epoch`` (its training took ``train_s``; ``elapsed`` is now): the epochs that
        still fit. An epoch costs what the run spent between epoch ends (training, validation shared over
        the cadence, checkpoints), over the last few epochs; the first is timed by its training alone (its
        start pays one-off set-up)."""
        self.train_s[epoch] = float(train_s)
        self.ends[epoch] = float(elapsed)
        validation = statistics.fmean(self.val_s) if self.val_s else ASSUMED_VAL_SHARE * float(train_s)
        ends = [self.ends[e] for e in sorted(self.ends)]
        if len(ends) >= 2:
            window = ends[-min(len(ends) - 1, max(3, self.val_every)) - 1:]
            per_epoch = (window[-1] - window[0]) / (len(window) - 1)
        else:
            per_epoch = float(train_s) + validation / max(1, self.val_every)
        left = self.budget_s - elapsed - validation  # the last epoch is always validated
        return self._plan(epoch + max(0, math.floor(left / per_epoch)) if per_epoch > 0 else epoch,
                          f"epoch {epoch}", elapsed, statistics.fmean(list(self.train_s.values())[-3:]))

    def validated(self, seconds: float) -> None:
        """Count a validation's time (it shapes the cadence and the time each epoch is planned to take)."""
        self.val_s.append(float(seconds))

    def _plan(self, planned: int, when: str, elapsed: float, epoch_s: float) -> int:
        """Take ``planned`` epochs and the cadence that goes with it (``epoch_s``: an epoch's training)."""
        planned = max(1, int(planned))
        cadence = self.val_every
        if not self.fixed_val_every:
            cadence = max(1, round(planned / VALIDATIONS))
            if self.val_s and epoch_s > 0:  # measured: validation at most MAX_VAL_SHARE of the time
                cadence = max(cadence, math.ceil(statistics.fmean(self.val_s) / (MAX_VAL_SHARE * epoch_s)))
            cadence = min(cadence, planned)
        if planned != self.planned_epochs or cadence != self.val_every or not self.refits:
            self.refits.append({"after": when, "elapsed_s": round(elapsed, 3), "planned_epochs": planned,
                                "val_every": cadence, "train_s_per_epoch": round(epoch_s, 4)})
        self.planned_epochs, self.val_every = planned, cadence
        return planned

    def record(self) -> dict[str, Any]:
        """What the run's summary says of its schedule."""
        return {"set_by": "max_time", "budget_s": self.budget_s, "planned_epochs": self.planned_epochs,
                "val_every": self.val_every, "refits": list(self.refits)}
