"""``autotune calibrate``: a shim over ``autotune.calibrate``.

Nothing heavy is imported here: the handler imports the library when it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from autotune.checks import options as types
from autotune.commands import add_command, progress_printer
from autotune.families.own import calibrated_names

__all__ = ["register"]


def _points(text: str) -> tuple[str, tuple[int, ...]]:
    """``TEMPLATE=N,N``: a template and two or more distinct batch sizes (positive, at most 4096)."""
    names = calibrated_names()
    name, _, values = text.partition("=")
    name = name.strip()
    if name not in names or not values.strip():
        choices = f"{', '.join(names[:-1])} or {names[-1]}"
        raise argparse.ArgumentTypeError(f"got {text!r}; give TEMPLATE=N,N with TEMPLATE {choices}")
    try:
        sizes = tuple(int(v) for v in values.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}; the batch sizes must be whole numbers") from None
    if not sizes or any(n < 1 or n > 4096 for n in sizes):
        raise argparse.ArgumentTypeError(f"got {text!r}; each batch size must be 1-4096")
    if len(set(sizes)) < 2:
        raise argparse.ArgumentTypeError(f"got {text!r}; give two or more distinct batch sizes (the fit is checked "
                                         "by predicting each from the others)")
    return name, sizes


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cuda:0", metavar="DEV", type=types.device,
                   help="the GPU to calibrate (default cuda:0)")
    p.add_argument("--out", default=None, metavar="DIR", type=types.path_text,
                   help="where the calibration is written (default $AUTOTUNE_CALIBRATION_DIR, else "
                        "~/.config/autotune/calibration/; a dry run: WORK/calibration)")
    p.add_argument("--work", default=None, metavar="DIR", type=types.path_text,
                   help="where the synthetic CT set and its bundles go (default a new temporary folder)")
    names = calibrated_names()
    p.add_argument("--templates", default=",".join(names), metavar="LIST", type=types.names(names, "template"),
                   help=f"comma-separated templates to calibrate (default {','.join(names)})")
    p.add_argument("--quick", action="store_true", help="two points per template instead of two or three")
    p.add_argument("--points", action="append", default=None, metavar="TEMPLATE=N,N", type=_points,
                   help="the batch sizes to probe for a template, two or more, e.g. segresnet=1,3 (repeatable, once "
                        "per template of --templates; M: the windows split as for the defaults)")
    p.add_argument("--timeout", type=types.seconds(), default=120.0, metavar="S",
                   help="a probe's time limit in seconds (default 120)")
    p.add_argument("--max-seconds", type=types.seconds(), default=None, metavar="S",
                   help="stop probing new points when the run nears S seconds (the fit still runs)")
    p.add_argument("--report", default=None, metavar="FILE", type=types.path_text,
                   help="also write the whole report (every point measured, the fit) as JSON")
    p.add_argument("--dry-run", action="store_true",
                   help="the same steps on the CPU with the tiny preset: checks them; the file is not a calibration")


def calibrate_command(args: argparse.Namespace) -> int:
    """Measure this GPU for the memory estimates, in a few minutes.

    Probe autotune's templates at a few batch sizes on a synthetic CT set, fit the device model's cuDNN
    workspace per template and phase, write the calibration to the user's calibration folder (used from then
    on for this GPU by tune, estimate and plans), and print each template's error: on its own points, leave one
    out, leave one scale out and leave one template out. A fit whose out-of-sample error is worse than the raw
    estimator's with the allocator's rules is not installed (kept in the work folder). Exit codes: 0 written,
    1 the fit refused, 2 no CUDA device (without --dry-run) or bad input (before anything is measured: --points
    with fewer than two distinct batch sizes, for a template not in --templates, or given twice).
    """
    from autotune.calibrate import calibrate, per_template_lines
    from autotune.calibrate.run import points_by_template
    from autotune.files import atomic_write_json

    templates = [t for t in str(args.templates).split(",") if t]
    report = calibrate(device=args.device, out_dir=args.out, work_dir=args.work, templates=templates,
                       quick=args.quick, dry_run=args.dry_run, timeout=args.timeout, max_seconds=args.max_seconds,
                       progress=progress_printer(args), n_values=points_by_template(args.points or [], templates))
    if args.report:
        atomic_write_json(args.report, json.loads(json.dumps(report, default=str)))
    print("\n".join(per_template_lines(report)))
    before = report.get("before") or {}
    if before.get("rows"):
        s = before["summary"]
        print(f"the calibration in force before ({before['source']}) on these points: {s['within']} of {s['points']} "
              f"within 10%, worst over {100 * s['max_over']:+.1f}%, worst under {100 * s['max_under']:+.1f}%")
    for line in out_of_sample_lines(report["fit"]):
        print(line)
    if report.get("refused"):
        print(f"autotune: calibration {report['refused']}; kept for reading in {report['file']}", file=sys.stderr)
        return 1
    print(f"calibration: {report['file']}" + (" (a dry run's: not a calibration of any GPU)" if report["dry_run"] else ""))
    return 0


def out_of_sample_lines(fit: dict[str, Any]) -> list[str]:
    """The fit's out-of-sample figures, one line per scheme: points within 10%, worst over and under."""
    def line(name: str, s: dict[str, Any]) -> str:
        if not s.get("points"):
            return f"{name}: no point (too few to hold any out)"
        return (f"{name}: {s['within']} of {s['points']} within {s['tolerance']:.0%}, worst over "
                f"{100 * s['max_over']:+.1f}%, worst under {100 * s['max_under']:+.1f}%")

    oos = fit.get("out_of_sample") or {}
    lines = [line("leave one out", fit["summary"]["leave_one_out"])]
    if oos.get("leave_one_scale_out"):
        lines.append(line("leave one scale out", oos["leave_one_scale_out"]))
    from autotune.calibrate.validate import OUT_OF_DOMAIN

    template = (oos.get("leave_one_template_out") or {}).get(OUT_OF_DOMAIN)
    if template:
        lines.append(line("leave one template out (the allocator's rules, used outside the fit's domain)", template))
    return lines


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``calibrate``."""
    add_command(sub, "calibrate", calibrate_command, _args, quiet="no progress lines")
