"""``autotune probe`` and ``autotune estimate``: shims over ``autotune.probe``.

Nothing heavy is imported here: the handlers import the library when they run.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from typing import Any

from autotune.checks import options as types
from autotune.commands import add_precision_arg
from autotune.commands.search import MAX_BATCH

__all__ = ["register", "add_tunable_args", "tunable_args", "EXIT_OK", "EXIT_FAILED", "EXIT_OOM", "EXIT_NONFINITE"]

EXIT_OK, EXIT_FAILED, EXIT_OOM, EXIT_NONFINITE = 0, 1, 3, 5

_PROBE_EPILOG = """\
exit codes:
  0  the probe ran and fitted (status ok)
  3  the probe ran out of memory (status oom): the settings do not fit
  5  the training steps diverged (status nonfinite): a NaN or Inf loss or weights; not a fit
  1  the probe failed (status error, killed or timeout); the reason is printed
  2  bad input (bundle, option values, no such device)
"""


def add_tunable_args(p: argparse.ArgumentParser) -> None:
    """One flag per tunable (``autotune.tunables.TUNABLES``): flag, checker, value name and help from its
    definition; None (not given) means the bundle's value."""
    from autotune.tunables import TUNABLES

    for t in TUNABLES:
        if t.kind == "choice":
            p.add_argument(t.flag, choices=t.choices, default=None, help=t.help)
        else:
            p.add_argument(t.flag, type=types.positive_int(MAX_BATCH), default=None, metavar=t.metavar, help=t.help)


def tunable_args(args: argparse.Namespace) -> dict[str, Any]:
    """Each tunable's flag value by its name (None: not given)."""
    from autotune.tunables import TUNABLES

    return {t.name: getattr(args, t.name) for t in TUNABLES}


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="BUNDLE", type=types.path_text, help="a bundle folder (made by 'autotune generate') or its YAML config")
    add_tunable_args(p)
    p.add_argument("--device", default=None, metavar="DEV", type=types.device,
                   help="cpu, cuda or cuda:N (default: the first visible CUDA device, else cpu)")
    p.add_argument("--memory-limit", default=None, metavar="SIZE", type=types.size, help="memory limit, e.g. 8GiB or 512MiB")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of a summary")
    add_precision_arg(p)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``probe`` and ``estimate`` to the ``autotune`` parser."""
    probe = sub.add_parser(
        "probe",
        help="measure one training step and sliding-window pass of a bundle in an isolated process",
        description=textwrap.fill(
            "Run a short real trial of BUNDLE in a child process: warm-up and measured training steps at "
            "N patches per iteration, then a sliding-window pass at batch M over the bundle's largest "
            "validation volume. Reports peak memory (CUDA: allocator peaks; CPU: tracked tensor bytes and "
            "peak RSS), step time, samples/s and seconds per volume. An out-of-memory, crash, kill or "
            "timeout is a result, not a failure of this command."
        ),
        epilog=_PROBE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_common(probe)
    probe.add_argument("--timeout", type=types.seconds(), default=300.0, metavar="S",
                       help="kill the trial's process group after S seconds (default 300)")
    probe.add_argument("--phases", default="train,infer", metavar="LIST", type=types.names(("train", "infer"), "phase"),
                       help="comma-separated phases to run: train, infer (default train,infer)")
    probe.add_argument("--warmup-steps", type=types.count(0, 1000), default=1, metavar="K",
                       help="unmeasured steps first (default 1)")
    probe.add_argument("--measure-steps", type=types.count(1, 1000), default=2, metavar="K",
                       help="measured steps (default 2)")
    probe.set_defaults(func=probe_command)

    est = sub.add_parser(
        "estimate",
        help="estimate a bundle's peak memory with no compute (FakeTensorMode) and fit peak(N) as a line",
        description=textwrap.fill(
            "Run the training step and sliding-window pass of BUNDLE on fake tensors (shapes only, no data, "
            "no memory) and count tensor memory as the CPU probe does. Prints the estimated peaks, the "
            "affine fit peak = intercept + slope * N for both phases (two passes each), and with "
            "--memory-limit the largest N and M that fit. Figures are raw tensor bytes; for CUDA it also prints "
            "what the GPU would reserve by the device model (the caching allocator and cuDNN's searches counted on "
            "the trace, cuDNN's workspace from the GPU's calibration file when one exists, else the shipped H200 "
            "calibration's), and the largest N and M with it."
        ),
        epilog="exit codes: 0 estimated, 2 bad input or the estimate failed",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_common(est)
    est.add_argument("--explain", action="store_true",
                     help="for a CUDA device, print each term of the predicted reserved peak per phase (tensors, the "
                          "allocator, cuDNN's release, cuDNN's workspace; the context outside them) and which fit "
                          "was used and why")
    est.set_defaults(func=estimate_command)


def _resolve_defaults(args: argparse.Namespace) -> tuple[str, str, int | None]:
    """Device, validation device and memory limit (bytes) with defaults filled in."""
    from autotune.device import resolve_device
    from autotune.probe.report import default_validation_device
    from autotune.utils import parse_bytes

    device = resolve_device(args.device)
    validation_device = args.validation_device or default_validation_device(args.bundle)
    limit = None if args.memory_limit is None else parse_bytes(args.memory_limit, "--memory-limit")
    return device, validation_device, limit


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


def _summary(result: dict[str, Any], title: str) -> list[str]:
    from autotune.utils import format_bytes

    shape = "x".join(str(v) for v in result.get("infer_volume_shape") or [])
    measured = result.get("measured", True)
    where = f"on {result['device']} ({result.get('device_name') or '-'})" if measured else f"for {result['device']}"
    lines = [
        f"{title} {result.get('algo') or ''} {where}: {result['status']}",
        f"  num_patches_per_iter {result['num_patches_per_iter']}, num_sw_batch_size {result['num_sw_batch_size']}, "
        f"validation device {result['validation_device']}, precision {result.get('precision') or ('amp on' if result.get('amp') else 'fp32')}",
    ]
    if result.get("train_peak_bytes") is not None or "train" in result.get("phases", []):
        extra = ""
        if result.get("train_cuda_max_memory_allocated") is not None:
            extra = f" (reserved; allocated {format_bytes(result['train_cuda_max_memory_allocated'])})"
        elif result.get("train_peak_rss_bytes") is not None:
            extra = f" (tracked tensors; process RSS {format_bytes(result['train_peak_rss_bytes'])})"
        rate = result.get("samples_per_s")
        timing = (f", step {_seconds(result.get('step_seconds_median'))} median, "
                  f"{'-' if rate is None else f'{rate:.2f}'} samples/s") if measured else ""
        lines.append(f"  train: peak {format_bytes(result.get('train_peak_bytes'))}{extra}{timing}")
    if result.get("infer_peak_bytes") is not None or "infer" in result.get("phases", []):
        extra = ""
        if result.get("infer_cuda_max_memory_allocated") is not None:
            extra = f" (reserved; allocated {format_bytes(result['infer_cuda_max_memory_allocated'])})"
        timing = f", {_seconds(result.get('sw_seconds_per_volume'))} per volume" if measured else ""
        lines.append(f"  infer: peak {format_bytes(result.get('infer_peak_bytes'))}{extra}{timing} (volume {shape})")
    if result.get("memory_limit"):
        lines.append(f"  memory limit {format_bytes(result['memory_limit'])}")
    if result["status"] not in ("ok", None):
        reason = result.get("error_type") or ""
        if result.get("signal"):
            reason = f"{reason} (signal {result['signal']})"
        lines.append(f"  failed in phase {result.get('phase_failed')}: {reason}")
        if result.get("error_tail"):
            tail = [line for line in str(result["error_tail"]).rstrip().splitlines() if line.strip(" ^~")]
            lines.extend("    " + line for line in tail[-6:])
    return lines


def probe_command(args: argparse.Namespace) -> int:
    """Handler of ``autotune probe``: 0 ok, 3 oom, 5 nonfinite, 1 error/killed/timeout."""
    from autotune.probe.runner import run_probe
    from autotune.tunables import Point

    device, validation_device, limit = _resolve_defaults(args)
    point = Point.of(tunable_args(args), validation_device=validation_device)
    result = run_probe(args.bundle, point, device=device, memory_limit=limit, timeout=args.timeout, phases=args.phases,
                       warmup_steps=args.warmup_steps, measure_steps=args.measure_steps)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print("\n".join(_summary(result, "probe")))
        print(f"  wall {result['wall_seconds']:.1f} s (process start, imports, build and the steps)")
    return {"ok": EXIT_OK, "oom": EXIT_OOM, "nonfinite": EXIT_NONFINITE}.get(result["status"], EXIT_FAILED)


def model_lines(result: dict[str, Any]) -> list[str]:
    """Which fit a CUDA estimate used and why, its out-of-sample bound, and with ``device_terms`` each term."""
    from autotune.utils import format_bytes

    lines = []
    if result.get("device_model_fit"):
        bound = result.get("device_model_bound")
        said = (f"; out-of-sample error {100 * bound['max_under']:+.1f}% .. {100 * bound['max_over']:+.1f}% "
                f"({bound['source']})" if bound else "; no out-of-sample bound stated by the calibration")
        what = ("the calibration's fit" if result["device_model_fit"] == "fitted"
                else "the raw estimator and the allocator's rules, no fitted workspace")
        lines.append(f"  device model: {what}: {result['device_model_domain']}{said}")
    for phase, terms in (result.get("device_terms") or {}).items():
        parts = " ".join(f"{'+' if v >= 0 else '-'} {name.replace('_', ' ')} {format_bytes(abs(v))}"
                         for name, v in terms.items() if name not in ("tensors", "reserved"))
        lines.append(f"  {phase}: tensors {format_bytes(terms['tensors'])} {parts} = reserved "
                     f"{format_bytes(terms['reserved'])}; + context {format_bytes(result.get('context_bytes') or 0)} "
                     "outside the allocator")
    return lines


def estimate_command(args: argparse.Namespace) -> int:
    """Handler of ``autotune estimate``: prints the estimate, both fits and what fits a limit."""
    from autotune.probe.report import estimate_report
    from autotune.tunables import Point, sized_by
    from autotune.utils import format_bytes

    device, validation_device, limit = _resolve_defaults(args)
    point = Point.of(tunable_args(args), validation_device=validation_device)
    report = estimate_report(args.bundle, point, device=device, memory_limit=limit,
                             explain=bool(getattr(args, "explain", False)))
    result = report["estimate"]
    cuda = device.startswith("cuda")
    if args.json:
        print(json.dumps(report, indent=2))
        return EXIT_OK
    print("\n".join(_summary(result, "estimate")))
    semantics = result.get("semantics")
    print(f"  estimated in {result['seconds']:.2f} s, raw tensor bytes"
          + (" (no GPU here: CPU tensors with CUDA's fp16 autocast rules)" if semantics == "cpu-emulating-cuda" else ""))
    if cuda and result.get("device_peak_bytes") is not None:
        how = ("the allocator simulated, cuDNN's workspace" if result.get("device_model") == "simulated"
               else "the affine allowance")
        phases = ", ".join(f"{p} {format_bytes(result[f'{p}_device_reserved_bytes'])}" for p in ("train", "infer")
                           if result.get(f"{p}_device_reserved_bytes") is not None)
        print(f"  on the GPU, reserved ({how} from {report['allowance']['source']}): {phases}")
        print("\n".join(model_lines(result)))
    for phase, entry in report["fits"].items():
        size = sized_by(phase)  # the tunable the phase's memory grows with (autotune.tunables)
        knob = f"{size.metavar} ({size.name})"
        line = (f"  fit {phase}: peak = {format_bytes(entry['intercept'])} + {format_bytes(entry['slope'])} x {knob}")
        if entry["n_cap"] is not None:
            line += f", flat beyond {entry['n_cap']} windows"
        print(line)
        if limit is not None:
            msg = f"    largest {knob.split()[0]} within {format_bytes(limit)}: {entry['max_fitting_raw']} (raw)"
            if cuda:
                msg += f", {entry['max_fitting_with_allowance']} with the CUDA allowance ({report['allowance']['source']})"
            print(msg)
    return EXIT_OK
