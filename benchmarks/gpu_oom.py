"""Call B of the GPU check, one more section: a run whose card is narrowed below its measured peak completes.

``oom_recovery`` trains the UNet bundle at a batch of ``oom_batch`` patches per pass (the batch a limit would be
tuned to; at the template's 2, a card narrowed to 0.6 of its peak may not hold even one patch beside the weights
and optimizer state), in the reference run's precision, twice for ``oom_epochs`` epochs with the same seed:
unconstrained (its training peak P), then with ``--memory-limit`` at ``FRACTION`` x P. On CUDA that sets the
caching allocator's per-process fraction, so the batch cannot fit whole and its passes step down to micro-batches
(``autotune.trainer.fallback``). Recorded: whether the narrowed run ended with exit 0, its step-downs (what
failed, the peak, what was done), the micro-batches and window batch in force at the end, its samples/s against
the unconstrained run's (the recovery's cost per sample) and the Dice of both at every epoch. On a dry run the CPU
tracker's limit stands in for the card.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autotune.utils import format_bytes
from benchmarks.gpu_data import copy_bundle
from benchmarks.gpu_harness import Check

__all__ = ["FRACTION", "section_oom_recovery"]

FRACTION = 0.6  # the "about 60% of its tuned peak"


def section_oom_recovery(check: Check, record: dict[str, Any], state: dict[str, Any]) -> None:
    from autotune.bundles.config import update_bundle_config
    from benchmarks.gpu_runs import train_run

    batch, epochs = int(check.cfg["oom_batch"]), int(check.cfg["oom_epochs"])
    bundle = copy_bundle(state["bundles"]["unet"], f"unet_b{batch}")
    update_bundle_config(bundle, {"num_patches_per_iter": batch, "num_images_per_batch": batch})
    precision = check.cfg["precisions"]["fp16"]
    whole = train_run(check, bundle, "unet_oom_whole", mode="fast", epochs=epochs, precision=precision)
    peak = whole.get("train_peak_bytes")
    record.update(fraction=FRACTION, batch=batch, reference_train_peak_bytes=peak, whole=whole)
    if not peak:
        record["skipped"] = "the unconstrained run reported no training peak"
        return
    limit = int(FRACTION * int(peak))
    run = train_run(check, bundle, "unet_oom_narrowed", mode="fast", epochs=epochs, precision=precision,
                    memory_limit=str(limit))
    path = Path(run["bundle"]) / "model_fold0" / "train_summary.json"
    summary = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    rate, base = run.get("samples_per_s_median"), whole.get("samples_per_s_median")
    record.update(limit_bytes=limit, run=run, completed=run["rc"] == 0,
                  memory_fallbacks=summary.get("memory_fallbacks"), micro_batches=summary.get("micro_batches"),
                  sw_batch=summary.get("sw_batch"), validation_device=summary.get("validation_device"),
                  samples_per_s_over_reference=rate / base if rate and base else None,
                  dice_whole=[e["mean_dice"] for e in whole["epochs"]], dice_narrowed=[e["mean_dice"] for e in run["epochs"]])
    check.say(f"   narrowed to {format_bytes(limit)} ({FRACTION:g} x {format_bytes(int(peak))}): rc={run['rc']}, "
              f"micro-batches {record['micro_batches']}, {len(record['memory_fallbacks'] or [])} step-downs, "
              f"samples/s x{record['samples_per_s_over_reference']}")
