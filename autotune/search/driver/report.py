"""The table of tuned values that ``tune`` and ``run`` print."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.tunables import BATCH, TUNABLES, Tunable
from autotune.utils import format_bytes

__all__ = ["format_results"]

#: the tunables shown after the batch and the loader batch that follows it, each in a column of its label
_OTHERS = tuple(t for t in TUNABLES if t is not BATCH)


def _width(tunable: Tunable) -> int:
    return max(len(tunable.label), 6)


def format_results(results: Sequence[Mapping[str, Any]]) -> str:
    """One row per bundle: tuned values, measured peak against the limit, throughput, source; then, per
    algorithm, why the batch handed to training differs from the largest that fits, and the new rate."""
    header = (
        f"{'bundle':<14} {'status':<10} {BATCH.label:>12} {'fits':>5} {'lr':>8} {'images x crops':>14} "
        f"{' '.join(f'{t.label:>{_width(t)}}' for t in _OTHERS)} "
        f"{'peak':>10} {'limit':>10} {'samples/s':>9} {'method':<9} {'probes':>6} source"
    )
    lines = [header, "-" * len(header)]
    notes: dict[str, str] = {}
    for r in results:
        name = Path(str(r.get("bundle", "?"))).name
        if r.get("status") != "tuned":
            lines.append(f"{name:<14} {str(r.get('status')):<10} {r.get('reason', '')}")
            continue
        loader = f"{r.get('num_images_per_batch', '-')} x {r.get('num_crops_per_image', '-')}"
        sps = r.get("samples_per_s")
        method = str(r.get("method", "measured"))
        if method == "estimated":
            method = "ESTIMATED"
        source = "storage" if r.get("from_storage") else "searched"
        batch = r.get("batch") or {}
        fits = batch.get("predicted_largest_fit") or batch.get("largest_fit_in_range") or "-"
        lr = r.get("learning_rate")
        recipe = r.get("tuning", {}).get("recipe", {}) if isinstance(r.get("tuning"), Mapping) else {}
        if batch.get("reason") and r.get("algo") not in notes:
            rate = recipe.get("learning_rate") or {}
            steps = (recipe.get("schedule") or {}).get("steps_per_epoch") or {}
            verdict = (r.get("handoff") or {}).get("line")
            why = batch["reason"] if not verdict or verdict in batch["reason"] else f"{batch['reason']}; hand-off: {verdict}"
            notes[str(r.get("algo"))] = (
                f"{r.get('algo')}: {r['num_patches_per_iter']} patches/step to training: {why}; "
                f"lr {rate.get('before', '-')} -> {rate.get('after', '-')} ({recipe.get('lr_scaling', 'none')}), "
                f"steps/epoch {steps.get('before', '-')} -> {steps.get('after', '-')}")
        lines.append(
            f"{name:<14} {'tuned':<10} {r[BATCH.name]:>12} {fits:>5} "
            f"{(f'{lr:.3g}' if isinstance(lr, (int, float)) else '-'):>8} {loader:>14} "
            f"{' '.join(f'{t.written_value(r)!s:>{_width(t)}}' for t in _OTHERS)} {format_bytes(r.get('peak_bytes')):>10} "
            f"{format_bytes(r.get('memory_limit')):>10} {(f'{sps:.2f}' if sps else '-'):>9} {method:<9} "
            f"{r.get('probes', 0):>6} {source}"
        )
    lines += [f"  {note}" for note in notes.values()]
    return "\n".join(lines)
