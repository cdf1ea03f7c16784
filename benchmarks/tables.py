"""Regenerate the tables in BENCHMARKS.md from the committed result JSON.

Each table in BENCHMARKS.md that comes from a benchmark lies between ``<!-- table:NAME -->``
and ``<!-- /table:NAME -->``; ``TABLES`` below says which script's render function makes it
from which JSON in ``benchmarks/results/``. The render functions are the ones the benchmark
scripts print with, so a script's own output and BENCHMARKS.md cannot disagree.

    python -m benchmarks.tables            # rewrite the marked blocks of BENCHMARKS.md
    python -m benchmarks.tables --check    # exit 1 (and show a diff) when BENCHMARKS.md differs
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.files import atomic_write_text
from benchmarks.common import block_names, read_block, read_json, replace_block

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DEFAULT_DOC = HERE.parent / "BENCHMARKS.md"
#: per-topic notes that repeat some of the tables; their blocks are regenerated too
TOPIC_DOCS: tuple[Path, ...] = ()

#: block name -> (benchmark module, render function, result JSONs in benchmarks/results/)
TABLES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "many-workers": ("bench_many_workers", "markdown_table", ("many_workers.json",)),
    "plain-claims": ("bench_plain_claims", "table", ("plain_claims.json",)),
    "batch-scaling": ("bench_batch_scaling", "table", ("batch_scaling.json",)),
    "batch-scaling-curves": ("bench_batch_scaling", "curves", ("batch_scaling.json",)),
    "handoff-scaling": ("bench_batch_scaling", "table", ("batch_scaling_handoff.json",)),
    "handoff-verdicts": ("bench_batch_scaling", "verdicts", ("batch_scaling_handoff.json",)),
    "handoff-curves": ("bench_batch_scaling", "curves", ("batch_scaling_handoff.json",)),
    "handoff-unet-e1": ("bench_batch_scaling", "table", ("batch_scaling_unet_linear_e1.json",)),
    "cpu-calibration": ("calibrate_cpu", "markdown_table", ("cpu_calibration.json",)),
    "fast-vs-tpe-bound-overall": ("bench_fast_vs_tpe", "report_table", ("fast_vs_tpe_bound_overall.json",)),
    "fast-vs-tpe-bounded": ("bench_fast_vs_tpe", "report_table", ("fast_vs_tpe_bounded.json",)),
    "fast-vs-tpe-replay": ("bench_fast_vs_tpe", "report_table", ("fast_vs_tpe_replay.json",)),
    "fast-vs-tpe-replay-dints": ("bench_fast_vs_tpe", "report_table", ("fast_vs_tpe_replay_dints.json",)),
    "contract": ("bench_contract", "markdown_table", ("contract.json",)),
    "precision": ("bench_precision", "markdown_table", ("precision.json",)),
    "precision-native-bf16": ("bench_precision", "markdown_table", ("precision_native_bf16.json",)),
    "monai-handoff-60min": ("bench_monai_handoff", "table", ("monai_handoff_60min.json",)),
    "monai-handoff-60min-curves": ("bench_monai_handoff", "curves", ("monai_handoff_60min.json",)),
    "monai-handoff-60min-launch": ("bench_monai_handoff", "launch_table", ("monai_handoff_60min.json",)),
    "bf16-numerics": ("bf16_numerics", "markdown_table", ("bf16_numerics_unet.json", "bf16_numerics_segresnet.json")),
    "bf16-training-unet": ("bench_bf16_training", "markdown_table", ("bf16_training_unet.json",)),
    "bf16-training-segresnet-dints": ("bench_bf16_training", "markdown_table",
                                      ("bf16_training_segresnet_dints.json",)),
    "bf16-training-full": ("bench_bf16_training", "markdown_table", ("bf16_training_full.json",)),
    "gpu-model-accounting": ("gpu_model", "accounting_table", ("gpu_model.json",)),
    "gpu-model-loo": ("gpu_model", "loo_table", ("gpu_model.json",)),
    "gpu-model-out-of-sample": ("gpu_model", "oos_table", ("gpu_model.json",)),
    "time-to-dice-unet": ("bench_time_to_dice", "table", ("time_to_dice_unet_cpu.json",)),
    "time-to-dice-unet-breakdown": ("bench_time_to_dice", "breakdown", ("time_to_dice_unet_cpu.json",)),
    "oom-recovery": ("bench_oom_recovery", "markdown_table", ("oom_recovery.json",)),
    "profile-epoch": ("profile_epoch", "table", ("profile_epoch_cpu.json",)),
    "profile-epoch-ops": ("profile_epoch", "op_table", ("profile_epoch_cpu.json",)),
    "profile-epoch-other-precision": ("profile_epoch", "table", ("profile_epoch_cpu_other_precision.json",)),
    "compile-cpu": ("bench_compile", "table", ("compile_cpu.json",)),
    "time-to-dice-dints": ("bench_time_to_dice", "table", ("time_to_dice_dints_cpu.json",)),
    "time-to-dice-dints-breakdown": ("bench_time_to_dice", "breakdown", ("time_to_dice_dints_cpu.json",)),
    "time-to-dice-dints-seed1": ("bench_time_to_dice", "table", ("time_to_dice_dints_cpu_seed1.json",)),
    "time-to-dice-unet-600s": ("bench_time_to_dice", "runs_table", (
        "time_to_dice_unet_600s_fp32.json", "time_to_dice_unet_600s_bf16.json",
        "time_to_dice_unet_600s_training_thread.json", "time_to_dice_unet_600s_3strides.json",
        "time_to_dice_unet_600s_3strides_seed1.json")),
    "time-to-dice-unet-lifters": ("bench_time_to_dice", "runs_table", (
        "time_to_dice_unet_600s_3strides.json", "time_to_dice_unet_600s_nnunet_aug.json",
        "time_to_dice_unet_600s_loss_nobg.json", "time_to_dice_unet_600s_cosine.json")),
    "time-to-dice-unet-12-epochs": ("bench_time_to_dice", "epochs_table", (
        "time_to_dice_unet_12ep_base.json", "time_to_dice_unet_12ep_loss_nobg.json",
        "time_to_dice_unet_12ep_cosine.json", "time_to_dice_unet_12ep_nnunet_aug.json")),
    "time-to-dice-segresnet": ("bench_time_to_dice", "table", ("time_to_dice_segresnet_cpu.json",)),
    "time-to-dice-segresnet-breakdown": ("bench_time_to_dice", "breakdown", ("time_to_dice_segresnet_cpu.json",)),
}


def render(name: str, results: Path = RESULTS) -> str:
    """The markdown of table ``name``, rendered from its JSON under ``results``."""
    module_name, function_name, files = TABLES[name]
    function: Callable[..., str] = getattr(importlib.import_module(f"benchmarks.{module_name}"), function_name)
    reports: list[Any] = [read_json(results / file) for file in files]
    return function(*reports)


def regenerate(text: str, results: Path = RESULTS, complete: bool = True) -> str:
    """``text`` with every table block rendered afresh.

    Args:
        text: the markdown (BENCHMARKS.md, or a per-topic note).
        results: the folder of result JSONs.
        complete: require a block for every entry of ``TABLES`` (BENCHMARKS.md holds them all).

    Raises:
        ValueError: a block in ``text`` has no entry in ``TABLES``, or (``complete``) an entry no block.
    """
    names = block_names(text)
    unknown = sorted(set(names) - set(TABLES))
    missing = sorted(set(TABLES) - set(names)) if complete else []
    if unknown or missing:
        raise ValueError(f"table blocks without a source: {unknown}; sources without a block: {missing}")
    for name in names:
        text = replace_block(text, name, render(name, results))
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a document's tables differ from the JSON")
    parser.add_argument("--doc", default=None,
                        help="one markdown file holding every table (default: BENCHMARKS.md and the per-topic notes)")
    parser.add_argument("--results", default=str(RESULTS), help="the folder of result JSONs")
    args = parser.parse_args(argv)
    docs = [(Path(args.doc), True)] if args.doc else [(DEFAULT_DOC, True), *((d, False) for d in TOPIC_DOCS)]
    status = 0
    for doc, complete in docs:
        text = doc.read_text(encoding="utf-8")
        try:
            new = regenerate(text, Path(args.results), complete)
        except ValueError as exc:
            print(f"{doc}: {exc}", file=sys.stderr)
            status = 2
            continue
        if new == text:
            print(f"{doc}: {len(block_names(text))} tables agree with {args.results}")
        elif args.check:
            stale = [name for name in block_names(text) if read_block(text, name) != read_block(new, name)]
            sys.stdout.writelines(difflib.unified_diff(
                text.splitlines(keepends=True), new.splitlines(keepends=True),
                fromfile=f"{doc} (committed)", tofile=f"{doc} (from the JSON)"))
            print(f"{doc}: tables differ from the JSON: {', '.join(stale)}; run python -m benchmarks.tables",
                  file=sys.stderr)
            status = max(status, 1)
        else:
            atomic_write_text(doc, new)
            print(f"{doc}: rewrote {len(block_names(text))} tables from {args.results}")
    return status


if __name__ == "__main__":
    sys.exit(main())
