"""Check the CUDA path on a lent GPU in two independent calls of at most 6 minutes each (docs/gpu-check.md).

    python -m benchmarks.gpu_check memory   --out OUT [--deadline 300]            # call A, first
    python -m benchmarks.gpu_check training --out OUT --hippocampus PATH [--deadline 300]   # call B
    python -m benchmarks.gpu_check memory   --out OUT --dry-run                   # the same code on the CPU, tiny
    python -m benchmarks.gpu_check training --out OUT --dry-run [--hippocampus PATH]
    python -m benchmarks.gpu_check reestimate OUT_A/gpu_check_memory.json         # CPU, afterwards
    python -m benchmarks.gpu_check install --memory OUT_A [--training OUT_B]      # into the tree

``memory`` (``gpu_memory.py``): ``autotune calibrate`` at batch sizes the first run did not probe (the
shipped model's prediction of each, then the new fit, written to ``OUT/calibration/``), one ``autotune
tune`` under half the card and one epoch of training of the handed batch against the budget (the
contract), MONAI's DiNTS at 96^3 on a Heart-shaped set, and two points with expandable segments.
``training`` (``gpu_training.py``): time to a Dice, every run at once on the GPU, each to a wall budget:
fast (half the budget) against regular (UNet, SegResNet), UNet's fast run in fp16 with a GradScaler, bf16
and fp32 (per-epoch Dice, where an epoch's time goes); the hand-off's two probes and the fast budget at
the largest fit (Dice per wall second, squared gradient norms per step, B_simple); DDP at world size 1
against one process.

Each writes ``OUT/gpu_check_<call>.json`` (rewritten after every measurement) and one log file,
and prints a short table. A section's status comes from what happened in it (``gpu_harness``);
the exit code is 1 when a section failed, 3 when the deadline cut one, 2 on bad input (a
missing dataset is found before anything runs), else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from benchmarks.gpu_harness import ROOT, Check, exit_code

__all__ = ["main"]

#: seconds from the script's start; on a GPU each call then ends inside its 6 minutes with the wheel install
DEFAULT_DEADLINE_S = {"memory": 330.0, "training": 300.0, "dry": 900.0}
HIPPOCAMPUS_CANDIDATES = (ROOT / ".gpu_data" / "Task04_Hippocampus", ROOT.parent / "shared" / "datasets" / "Task04_Hippocampus")


def section_env(check: Check, record: dict[str, Any]) -> None:
    """The machine: GPU name, memory, driver, versions; copied to ``results['gpu']``."""
    import monai
    import torch

    record.update(python=sys.version.split()[0], torch=torch.__version__, cuda=torch.version.cuda,
                  cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
                  monai=monai.__version__, cpu_count=os.cpu_count(), cuda_available=torch.cuda.is_available(),
                  gpu_name="cpu", torch_total_memory=None, driver=None, nvml_total_memory=None)
    if check.cuda:
        props = torch.cuda.get_device_properties(0)
        record.update(gpu_name=props.name, torch_total_memory=int(props.total_memory),
                      multiprocessors=props.multi_processor_count, bf16_supported=torch.cuda.is_bf16_supported())
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            driver = pynvml.nvmlSystemGetDriverVersion()
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            record.update(driver=driver.decode() if isinstance(driver, bytes) else str(driver),
                          nvml_total_memory=int(memory.total), nvml_used_memory_at_start=int(memory.used))
            pynvml.nvmlShutdown()
        except Exception as exc:  # noqa: BLE001 - NVML is an aid; torch named the GPU
            record["nvml_error"] = f"{type(exc).__name__}: {exc}"
    else:
        record["bf16_supported"] = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    check.results["gpu"] = {"name": record["gpu_name"], "torch_total_memory": record["torch_total_memory"],
                            "total_memory": record["nvml_total_memory"] or record["torch_total_memory"],
                            "driver": record["driver"], "torch": record["torch"], "cuda": record["cuda"],
                            "cudnn": record["cudnn"]}


def _hippocampus(args: argparse.Namespace) -> tuple[Path | None, str | None]:
    """The training call's dataset and the problem with it (None when usable). A dry run without
    ``--hippocampus`` trains on a synthetic demo set."""
    from benchmarks.gpu_data import dataset_problem

    if args.hippocampus:
        path = Path(args.hippocampus)
    elif args.dry_run:
        return None, None
    else:
        path = next((p for p in HIPPOCAMPUS_CANDIDATES if p.is_dir()), HIPPOCAMPUS_CANDIDATES[0])
    problem = dataset_problem(path)
    if problem:
        problem += "; run benchmarks/gpu_prepare.sh (it copies the set into .gpu_data/) or pass --hippocampus PATH"
    return path, problem


def _run_call(args: argparse.Namespace) -> int:
    hippocampus, problem = _hippocampus(args) if args.command == "training" else (None, None)
    if problem:
        print(f"gpu_check {args.command}: error: {problem}", file=sys.stderr)
        return 2
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print(f"gpu_check {args.command}: error: no CUDA device visible; on a CPU run with --dry-run", file=sys.stderr)
        return 2
    from benchmarks import gpu_memory, gpu_training
    from benchmarks.gpu_report import missing_fields, table

    module: Any = gpu_memory if args.command == "memory" else gpu_training

    def run(check: Check) -> None:
        if args.command == "memory":
            gpu_memory.run_memory(check)
        else:
            gpu_training.run_training(check, hippocampus)

    deadline = args.deadline if args.deadline is not None else DEFAULT_DEADLINE_S["dry" if args.dry_run else args.command]
    check = Check(args.command, Path(args.out or os.environ.get("OUT") or f"/tmp/autotune-gpu-check/out-{args.command}"),
                  deadline, args.dry_run, "cpu" if args.dry_run else "cuda:0", module.DRY if args.dry_run else module.FULL)
    check.section("env", lambda r: section_env(check, r))
    if check.results.get("gpu"):
        run(check)
    check.results["missing_fields"] = missing_fields(check.results, args.command)
    check.save()
    print(table(check.results), flush=True)
    return exit_code(check.results)


def _exit_now(code: int) -> None:
    """Exit without the interpreter's teardown (seconds with torch loaded; ``autotune.cli.entry``)."""
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _reestimate(args: argparse.Namespace) -> int:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch is imported: plan as a machine without a GPU
    from autotune.files import atomic_write_json
    from benchmarks.gpu_install import reestimate

    path = Path(args.json)
    if not path.is_file():
        print(f"gpu_check reestimate: error: {path} not found; give a memory call's gpu_check_memory.json",
              file=sys.stderr)
        return 2
    results = json.loads(path.read_text(encoding="utf-8"))
    done = reestimate(results)
    atomic_write_json(path, results)
    print(f"{done} points re-estimated with CUDA hidden -> {path}")
    return 0


def _install(args: argparse.Namespace) -> int:
    if not args.no_reestimate:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    from benchmarks.gpu_install import InstallError, install

    try:
        written = install(Path(args.memory), Path(args.training) if args.training else None, Path(args.results_dir),
                          Path(args.calibrations_dir), redo_estimates=not args.no_reestimate)
    except InstallError as exc:
        print(f"gpu_check install: error: {exc}", file=sys.stderr)
        return 2
    for what, path in written.items():
        print(f"{what}: {path}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for call in ("memory", "training"):
        p = sub.add_parser(call, help=f"call {'A' if call == 'memory' else 'B'} ({call})")
        p.add_argument("--out", default=None, help="output folder (default $OUT, else /tmp/autotune-gpu-check/out-CALL)")
        p.add_argument("--deadline", type=float, default=None,
                       help="seconds; later sections are skipped (default 330 for memory, 300 for training on a "
                            "GPU, 900 on a dry run)")
        p.add_argument("--dry-run", action="store_true", help="CPU, tiny preset, small data")
        if call == "training":
            p.add_argument("--hippocampus", default=None,
                           help="Task04_Hippocampus folder (default .gpu_data/ or ../shared/datasets/; a dry run "
                                "without it trains on a synthetic set, with it on its first 10 cases)")
    p = sub.add_parser("reestimate", help="CPU: the CUDA-hidden estimates of a memory call's points")
    p.add_argument("json", help="a memory call's gpu_check_memory.json (rewritten)")
    p = sub.add_parser("install", help="merge the calls' JSON into benchmarks/results/ and install the calibration")
    p.add_argument("--memory", required=True, help="the folder the memory call's files came back in")
    p.add_argument("--training", default=None, help="the folder the training call's files came back in")
    p.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--calibrations-dir", default=str(ROOT / "autotune" / "probe" / "calibrations"))
    p.add_argument("--no-reestimate", action="store_true", help="skip the CUDA-hidden re-estimates")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "reestimate":
        return _reestimate(args)
    if args.command == "install":
        return _install(args)
    return _run_call(args)


if __name__ == "__main__":
    _exit_now(main())
