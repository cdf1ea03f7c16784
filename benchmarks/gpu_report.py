"""What each call's JSON must hold (``REQUIRED``, ``missing_fields``) and the short table it prints.

A field is a dotted path; ``[]`` stands for every element of a list (which must not be empty)
and ``*`` for every value of a mapping. A field must be present; its value may be null or zero
where a GPU is needed (a CPU dry run has no ``max_memory_allocated``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.utils import format_bytes

__all__ = ["REQUIRED", "missing_fields", "table"]

_GPU = ["gpu.name", "gpu.torch_total_memory", "gpu.driver", "gpu.torch", "gpu.cuda", "gpu.cudnn"]
_PHASES = [f"{phase}.{field}" for phase in ("train", "infer")
           for field in ("estimate_bytes", "max_memory_allocated", "max_memory_reserved")]
_RUN = ["samples_per_s_median", "epochs[].samples_per_s", "train_peak_bytes", "rc"]

REQUIRED: dict[str, list[str]] = {
    "memory": [
        *_GPU,
        *(f"sections.calibrate.{f}" for f in ("ct.shape", "file", "workspace", "fit.summary.leave_one_out",
                                              "before.summary", "before.rows[].error")),
        *(f"sections.calibrate.points[].{f}" for f in ("algo", "n", "m", "probe.status", "probe.allocator_stats",
                                                       *_PHASES)),
        *(f"sections.plan.{f}" for f in ("limit", "limit_rule", "budget_bytes", "max_num_patches_per_iter",
                                         "num_patches_per_iter", "num_sw_batch_size", "peak_bytes", "method")),
        *(f"sections.contract.{f}" for f in ("num_patches_per_iter", "train_peak_bytes", "val_peak_bytes",
                                             "budget_bytes", "tuned_peak_bytes", "predicted_train_bytes",
                                             "peak_over_budget", "within_budget", "full_step_seen")),
        *(f"sections.monai_dints.{f}" for f in ("roi_size", "precision", "points[].train_peak_bytes",
                                                "points[].infer_peak_bytes", "points[].estimate_train_bytes",
                                                "points[].model_train_reserved_bytes", "predicted_largest_n",
                                                "at_predicted.status", "largest_n_that_trains")),
        *(f"sections.expandable.points[].{f}" for f in ("train_reserved", "infer_reserved", "child_alloc_conf",
                                                        "model_default", "model_expandable")),
    ],
    "training": [
        *_GPU,
        *(f"sections.time_to_dice.runs.{run}.{f}" for run in ("unet_fast", "unet_regular", "segresnet_fast",
                                                              "segresnet_regular", "unet_fast_bf16", "unet_fast_fp32",
                                                              "unet_fast_compiled", "unet_fast_bf16_compiled")
          for f in (*_RUN, "time_to_target_s", "best_by_s", "phases_mean_s.compute_s", "phases_mean_s.data_wait_s",
                    "phases_mean_s.h2d_s", "phases_mean_s.val_s", "schedule.set_by", "epochs[].mean_dice")),
        *(f"sections.time_to_dice.fast_over_regular.{algo}.{f}" for algo in ("unet", "segresnet")
          for f in ("time_to_target", "samples_per_s")),
        *(f"sections.time_to_dice.compile.{name}.{f}" for name in ("fp16", "bf16")
          for f in ("used", "first_call_s", "time_to_target_over_eager", "samples_per_s_over_eager")),
        *(f"sections.time_to_dice.precision.{f}" for f in ("trained.fp16", "trained.bf16", "trained.fp32",
                                                           "dice_distance_from_fp32.fp16",
                                                           "dice_distance_from_fp32.bf16",
                                                           "scaler_skipped_steps_fp16")),
        *(f"sections.handoff.{f}" for f in ("verdict.reference_samples_per_s", "verdict.samples_per_s",
                                            "verdict.handed", "largest_fit", "runs.largest.samples_per_s_median",
                                            "dice_per_wall.winner", "dice_per_wall.dice_at_common_wall",
                                            "grad_sq_norms.reference.steps[]", "grad_sq_norms.largest.steps[]",
                                            "noise_scale.all_steps.b_simple")),
        *(f"sections.ddp.{f}" for f in ("ddp_first_epoch_train_peak_bytes", "single_first_epoch_train_peak_bytes",
                                        "ddp_over_single_peak", "world_size")),
        *(f"sections.oom_recovery.{f}" for f in ("limit_bytes", "reference_train_peak_bytes", "completed",
                                                 "memory_fallbacks", "micro_batches", "samples_per_s_over_reference")),
    ],
}


def missing_fields(results: Mapping[str, Any], call: str) -> list[str]:
    """The fields of ``REQUIRED[call]`` that ``results`` lacks (an empty list when it holds them all); a dry run's
    section whose material was not at hand (``not_at_hand``, e.g. MONAI's templates outside a clone) owes none."""
    sections = results.get("sections") or {}
    absent = {f"sections.{name}." for name, s in sections.items()
              if results.get("dry_run") and isinstance(s, Mapping) and s.get("not_at_hand")}
    return [path for path in REQUIRED[call]
            if not any(path.startswith(prefix) for prefix in absent) and not _present(results, path.split("."))]


def _present(value: Any, parts: list[str]) -> bool:
    if not parts:
        return True
    head, rest = parts[0], parts[1:]
    if head == "*":
        return isinstance(value, Mapping) and bool(value) and all(_present(v, rest) for v in value.values())
    each = head.endswith("[]")
    key = head[:-2] if each else head
    if not isinstance(value, Mapping) or key not in value:
        return False
    if not each:
        return _present(value[key], rest)
    items = value[key]
    return isinstance(items, list) and bool(items) and all(_present(v, rest) for v in items)


def table(results: Mapping[str, Any]) -> str:
    """The call's short table: what the reply of the device tool shows last."""
    gpu = results.get("gpu") or {}
    lines = [f"GPU: {gpu.get('name')} | driver {gpu.get('driver')} | torch {gpu.get('torch')} | CUDA {gpu.get('cuda')} "
             f"| cuDNN {gpu.get('cudnn')} | total {format_bytes(gpu.get('torch_total_memory'))}"]
    sections = results.get("sections") or {}
    lines += _memory_lines(sections) if results.get("call") == "memory" else _training_lines(sections)
    for name, sec in sections.items():
        lines.append(f"section {name}: {sec.get('status')} ({sec.get('seconds')} s)"
                     + (f" {'; '.join(sec['failures'])[:200]}" if sec.get("failures") else ""))
    missing = results.get("missing_fields") or []
    lines.append(f"fields missing from the JSON: {len(missing)}" + (f" (first: {missing[0]})" if missing else ""))
    return "\n".join(lines)


def _memory_lines(sections: Mapping[str, Any]) -> list[str]:
    lines = []
    cal = sections.get("calibrate") or {}
    for r in (cal.get("before") or {}).get("rows") or []:
        lines.append(f"{r['algo']:<9} N={r['n']:<3} M={r['m']:<3} {r['phase']:<5} reserved "
                     f"{format_bytes(r['reserved_bytes']):>10} shipped model {format_bytes(r['predicted_bytes']):>10} "
                     f"{100 * r['error']:+6.1f}%")
    loo = ((cal.get("fit") or {}).get("summary") or {}).get("leave_one_out") or {}
    if cal.get("workspace"):
        lines.append(f"new fit: {cal['workspace']}; leave one out {loo.get('within')} of {loo.get('points')} within "
                     f"10%, worst over {100 * (loo.get('max_over') or 0):+.1f}%, under {100 * (loo.get('max_under') or 0):+.1f}%")
    plan = sections.get("plan") or {}
    if plan.get("num_patches_per_iter") is not None:
        lines.append(f"plan ({plan.get('algo')}, estimated, limit {plan.get('limit')}, budget "
                     f"{format_bytes(plan.get('budget_bytes'))}): N={plan.get('num_patches_per_iter')} "
                     f"M={plan.get('num_sw_batch_size')}, predicted peak {format_bytes(plan.get('peak_bytes'))}")
    contract = sections.get("contract") or {}
    if contract:
        lines.append(f"contract: N={contract.get('num_patches_per_iter')} peak {format_bytes(contract.get('peak_bytes'))} "
                     f"(predicted {format_bytes(contract.get('tuned_peak_bytes'))}) / budget "
                     f"{format_bytes(contract.get('budget_bytes'))} -> within {contract.get('within_budget')}")
    monai = sections.get("monai_dints") or {}
    for p in monai.get("points") or []:
        lines.append(f"monai dints N={p['n']}: {p['status']} train {format_bytes(p.get('train_peak_bytes'))} "
                     f"(model {format_bytes(p.get('model_train_reserved_bytes'))}) infer "
                     f"{format_bytes(p.get('infer_peak_bytes'))} (model {format_bytes(p.get('model_infer_reserved_bytes'))})")
    if monai.get("predicted_largest_n"):
        lines.append(f"monai dints under {monai.get('limit')}: model's largest N {monai['predicted_largest_n']}: "
                     f"{(monai.get('at_predicted') or {}).get('status')} (MONAI's figure on an A100 80GB: 8)")
    for p in (sections.get("expandable") or {}).get("points") or []:
        first = p.get("first_run") or [None, None]
        lines.append(f"expandable {p['algo']} N={p['n']} M={p['m']}: train {format_bytes(p.get('train_reserved'))} "
                     f"(first run {format_bytes(first[0])}), infer {format_bytes(p.get('infer_reserved'))} "
                     f"(first run {format_bytes(first[1])})")
    return lines


def _training_lines(sections: Mapping[str, Any]) -> list[str]:
    lines = []
    ttd = sections.get("time_to_dice") or {}
    for label, run in (ttd.get("runs") or {}).items():
        phases = run.get("phases_mean_s") or {}
        lines.append(f"{label:<18} rc={run.get('rc')} {run.get('precision')} samples/s {run.get('samples_per_s_median')} "
                     f"peak {format_bytes(run.get('train_peak_bytes'))} Dice {run.get('mean_dice_last')} "
                     f"to {ttd.get('target')}: {run.get('time_to_target_s')} s | epoch: wait {phases.get('data_wait_s')} "
                     f"h2d {phases.get('h2d_s')} compute {phases.get('compute_s')} val {phases.get('val_s')} s")
    for algo, ratios in (ttd.get("fast_over_regular") or {}).items():
        lines.append(f"fast vs regular, {algo}: time to Dice {ttd.get('target')} x{ratios.get('time_to_target')} "
                     f"(at most {ratios.get('time_to_target_at_most')}), samples/s x{ratios.get('samples_per_s')}")
    precision = ttd.get("precision") or {}
    if precision:
        lines.append(f"precision: {precision.get('trained')}, per-epoch Dice distance from fp32 "
                     f"{precision.get('dice_distance_from_fp32')}, GradScaler skipped "
                     f"{precision.get('scaler_skipped_steps_fp16')}")
    for name, effect in (ttd.get("compile") or {}).items():
        lines.append(f"compile ({name}): used {effect.get('used')}, first call {effect.get('first_call_s')} s, time to "
                     f"Dice x{effect.get('time_to_target_over_eager')} of eager, samples/s "
                     f"x{effect.get('samples_per_s_over_eager')}{'' if effect.get('used') else ': ' + str(effect.get('reason'))}")
    handoff = sections.get("handoff") or {}
    if handoff.get("verdict"):
        lines.append(f"hand-off: {handoff['verdict'].get('line')}")
    if handoff.get("dice_per_wall"):
        dpw = handoff["dice_per_wall"]
        lines.append(f"Dice at {dpw.get('common_wall_s')} s: {dpw.get('dice_at_common_wall')} -> {dpw.get('winner')}")
        lines.append(f"B_simple: {(handoff.get('noise_scale') or {}).get('all_steps', {}).get('b_simple')}")
    ddp = sections.get("ddp") or {}
    if ddp.get("run"):
        lines.append(f"ddp (world {ddp.get('world_size')}): peak {format_bytes(ddp.get('ddp_first_epoch_train_peak_bytes'))} "
                     f"vs single {format_bytes(ddp.get('single_first_epoch_train_peak_bytes'))}")
    return lines
