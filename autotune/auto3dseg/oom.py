"""A MONAI bundle's ``train.py`` that runs out of memory under the launcher: one line, and the study learns.

MONAI's ``train.py`` cannot repeat a step in micro-batches (its loop is its own code), and restarting it with a
smaller batch would change the batch, the learning rate and the schedule its tuning handed over, without the run
saying so. So the launcher ends with one line naming the batch that failed, where (training or validation), the
peak and the limit, and the command that re-tunes the bundle at that limit. A training step that failed under
the key's own limit on the tuned device also becomes a point of the key's study
(``autotune.search.storage.training_oom``), so that re-tune searches again and does not hand that batch over.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from autotune.auto3dseg.view import TUNING_RELPATH
from autotune.utils import format_bytes

__all__ = ["oom_outcome"]


def oom_outcome(script: Path, record: dict[str, Any], limit: int, device: str) -> str:
    """The one line of a launch that ran out of memory; the failed point (and where the study got it) goes into
    ``record["failed_point"]``."""
    phase = {"train": "training", "validation": "validation"}.get(str(record.get("phase_failed")), "the script")
    bundle = script.parent.parent if script.parent.name == "scripts" else None
    batch = study = None
    tuning = bundle / TUNING_RELPATH if bundle is not None else None
    if tuning is not None and tuning.is_file():  # a bundle autotune tuned: its batch, and the key's study
        try:
            from autotune.auto3dseg.view import load_view
            from autotune.bundles.schema import check_bundle_config

            config = check_bundle_config(load_view(bundle), str(bundle))
            plan = config.plan  # the tuning's provenance (the key's study); the batch is the one the configs state
            batch = config.tuned.num_patches_per_iter
            if phase == "training" and plan is not None:
                from autotune.search.storage.training_oom import record_in_study

                event = {"phase": "training", "peak_bytes": record.get("peak_bytes"), "limit_bytes": limit,
                         "failed": f"MONAI's train.py step of {batch} patches"}
                study = record_in_study(plan, batch, event, str(bundle), device)
        except Exception as exc:  # noqa: BLE001 - the line still names what failed and what to run
            study = {"recorded": False, "reason": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}
    record["failed_point"] = {"phase": phase, "num_patches_per_iter": batch, "peak_bytes": record.get("peak_bytes"),
                              "memory_limit": limit, "study": study}
    what = f"{batch} patches per step" if batch is not None else "its batch"
    retune = shlex.join(["autotune", "tune", str(bundle or "BUNDLE"), "--device", device, "--memory-limit",
                         str(limit)])
    learned = " (the study has the failed point)" if (study or {}).get("recorded") else ""
    return (f"autotune.launch: out of memory in {phase} with {what} under {format_bytes(limit)} on {device} "
            f"(peak {format_bytes(record.get('peak_bytes'))}); MONAI's train.py cannot split a step: re-tune with "
            f"'{retune}'{learned}, then run it again")
