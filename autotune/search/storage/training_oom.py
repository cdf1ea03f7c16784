"""Points measured in training: a training pass that ran out of memory, recorded in its key's study.

``record_in_study`` adds it as a COMPLETE trial of ``kind: training`` whose point (``num_patches_per_iter``, phase
``train``) does not fit, with its peak and where it happened, and appends it to the study's ``training_oom``
attribute. The next search of the key then answers that point from it (``autotune.search.strategies.evaluate``)
and does not answer from its stored result (``autotune.search.driver.key``). Only a failure under the key's own
limit on the tuned device is a point of the key; anything else is said in the returned record instead.

It sits in the storage, below the trainer (``autotune.trainer.learn``) and MONAI's launcher
(``autotune.auto3dseg.oom``), which both record a failed pass here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from autotune.search.storage.points import NO_FIT, TRAINING_KIND, point_id

__all__ = ["record_in_study"]


def _warn(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr, flush=True)


def _storage_url(shown: str) -> str | None:
    """The storage's URL from the plan's (redacted) one: itself, or ``$AUTOTUNE_STORAGE`` when it hides a
    password there; None when neither opens it."""
    from autotune.search.storage.study import STORAGE_ENV, redact_url

    if "***" not in shown:
        return shown
    env = os.environ.get(STORAGE_ENV)
    return env if env and redact_url(env) == shown else None


def record_in_study(plan: Any, patches: int, event: Mapping[str, Any], bundle: str, device: str) -> dict[str, Any]:
    """Add the training pass that failed (``patches`` patches, ``event``: its ``peak_bytes``, ``limit_bytes``,
    ``epoch``, ``step``, ``failed``) to the key's study of ``plan`` (the bundle's ``TuningPlan``) as a point measured
    in training that does not fit; returns where it went, or why not (another limit or device than the key's, a
    storage it cannot open). A failure to write is a warning line, never an error."""
    if plan.method != "measured" or plan.device != device or plan.memory_limit != event.get("limit_bytes"):
        return {"recorded": False, "reason": f"trained on {device} under {event.get('limit_bytes')} bytes; the key "
                                             f"is for {plan.device} under {plan.memory_limit} bytes"}
    url = _storage_url(str(plan.storage or ""))
    if not plan.study_name or not url:
        return {"recorded": False, "reason": "the tuning block names no storage this run can open"}
    try:
        number = _add_training_trial(url, plan, patches, event, bundle)
    except Exception as exc:  # noqa: BLE001 - the study is worth a line, never the run
        _warn(f"could not record the out-of-memory in the study {plan.study_name}: {exc}")
        return {"recorded": False, "reason": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}
    return {"recorded": True, "study_name": plan.study_name, "trial": number}


def _add_training_trial(url: str, plan: Any, patches: int, event: Mapping[str, Any], bundle: str) -> int:
    """The trial's number, once added (with the study's ``training_oom`` attribute)."""
    import optuna
    from optuna.distributions import IntDistribution

    from autotune.search.storage.study import open_storage, quiet_optuna

    quiet_optuna()
    study = optuna.load_study(study_name=plan.study_name, storage=open_storage(url))
    point = {"num_patches_per_iter": int(patches)}
    budget = int(plan.budget_bytes or plan.memory_limit)
    peak = event.get("peak_bytes")
    attrs = {"point_id": point_id(point, ("train",)), "phases": ["train"], "kind": TRAINING_KIND, "status": "oom",
             "verdict": "does not fit", "peak_bytes": peak, "budget_bytes": budget, "bundle": bundle,
             "epoch": event.get("epoch"), "step": event.get("step"), "failed": event.get("failed")}
    trial = optuna.trial.create_trial(
        value=NO_FIT, params=point, distributions={"num_patches_per_iter": IntDistribution(1, max(1, int(patches)))},
        user_attrs={k: v for k, v in attrs.items() if v is not None},
        constraints={"memory": float(max(int(peak or 0) - budget, 1))})
    study.add_trial(trial)
    number = int(study.get_trials(deepcopy=False)[-1].number)
    known = list(study.user_attrs.get("training_oom") or [])
    study.set_user_attr("training_oom", [*known, {"num_patches_per_iter": int(patches), "memory_limit":
                                                  plan.memory_limit, "trial": number, "bundle": bundle,
                                                  "epoch": event.get("epoch"), "peak_bytes": peak}])
    return number
