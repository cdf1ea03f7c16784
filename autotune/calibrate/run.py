"""``calibrate``: measure the device model's calibrated part on this GPU and write it where autotune reads it.

A few minutes on a GPU: a synthetic CT set (``autotune.calibrate.data``; smaller on a card with
less memory than the H200 the default points were chosen on), the full-size bundles of autotune's
templates, one real probe per point (``autotune.calibrate.points``: both phases, no memory limit,
cuDNN benchmark on, as training runs) with the estimator's trace of the same point, then the fit
(``autotune.calibrate.fit``): cuDNN's workspace factor per template and phase, its error on its own
points and leave one out. A point whose predicted peak (the reference model, before anything is
measured) passes 85% of the card is not probed. The file goes to the user's calibration folder
(``$AUTOTUNE_CALIBRATION_DIR``, else ``~/.config/autotune/calibration/``), where it takes
precedence over the shipped ones.

A dry run does the same on the CPU with the tiny preset and a small set, to check the steps: its
"device" figures are the CPU probe's tracked peaks, so its file is marked and written only into
the work folder, never the user's calibration folder.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autotune.errors import SpecError
from autotune.families.own import calibrated_names, own_template

__all__ = ["TEMPLATES", "DRY_SHAPE", "gpu_facts", "calibrate", "user_folder", "per_template_lines",
           "points_by_template", "check_points"]

TEMPLATES = calibrated_names()
DRY_SHAPE = (64, 64, 24)
_FIT_RESERVE_S = 60.0  # seconds kept for the fit when a time limit stops the points
_CARD_SHARE = 0.85  # a point predicted above this share of the card is not probed


def user_folder() -> Path:
    """Where ``calibrate`` writes: ``$AUTOTUNE_CALIBRATION_DIR``, else ``~/.config/autotune/calibration``."""
    from autotune.checks.environment import setting

    folder = setting("AUTOTUNE_CALIBRATION_DIR")
    return Path(folder) if folder else Path("~/.config/autotune/calibration").expanduser()


def gpu_facts(device: str) -> dict[str, Any]:
    """The GPU (or, on a dry run, the CPU): name, torch's and NVML's total memory, driver, versions."""
    import torch

    facts: dict[str, Any] = {"name": "cpu", "torch_total_memory": None, "total_memory": None, "driver": None,
                             "torch": torch.__version__, "cuda": torch.version.cuda,
                             "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}
    if not str(device).startswith("cuda"):
        return facts
    index = int(device.split(":")[1]) if ":" in device else 0
    props = torch.cuda.get_device_properties(index)
    facts.update(name=props.name, torch_total_memory=int(props.total_memory), total_memory=int(props.total_memory))
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        driver = pynvml.nvmlSystemGetDriverVersion()
        facts.update(driver=driver.decode() if isinstance(driver, bytes) else str(driver),
                     total_memory=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total))
        pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - NVML is an aid; torch named the GPU
        facts["nvml_error"] = f"{type(exc).__name__}: {exc}"
    return facts


def _sizes(sizes: Sequence[int]) -> str:
    return ",".join(str(n) for n in sizes)


def points_by_template(given: Sequence[tuple[str, Sequence[int]]], templates: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``--points`` as given (``(template, sizes)`` each), per template, checked against ``templates``
    (``check_points``).

    Raises:
        SpecError: a template's points given twice, or points for a template not calibrated.
    """
    out: dict[str, tuple[int, ...]] = {}
    for name, sizes in given:
        if name in out:
            raise SpecError(f"--points {name}={_sizes(sizes)}: {name}'s batch sizes are given twice "
                            f"({_sizes(out[name])} before); give them in one --points {name}=N,N")
        out[name] = tuple(int(n) for n in sizes)
    check_points(templates, out)
    return out


def check_points(templates: Sequence[str], n_values: dict[str, Sequence[int]]) -> None:
    """Refuse, before anything is measured, points for a template not in ``templates`` (they would not be
    probed) and a template with fewer than two distinct batch sizes (its fit could not be checked out of
    sample: leave one out and leave one scale out need another batch size).

    Raises:
        SpecError: one line naming the template and what to give.
    """
    for name, sizes in n_values.items():
        if name not in templates:
            raise SpecError(f"--points {name}={_sizes(sizes)}: {name} is not among the templates calibrated "
                            f"(--templates {','.join(templates)}); add it to --templates or leave its points out")
        if len(set(sizes)) < 2:
            count = "one distinct batch size" if sizes else "no batch size"
            raise SpecError(f"--points {name}={_sizes(sizes)}: {count}; give two or more (the fit is checked by "
                            "predicting each batch size from the others)")


def _plan(bundles: dict[str, Path], n_values: dict[str, Sequence[int]]) -> list[tuple[str, Path, int, int]]:
    from autotune.calibrate.points import point_pairs
    from autotune.probe.runner import resolve_request
    from autotune.step import num_windows

    plan = []
    for algo, bundle in bundles.items():
        windows = num_windows(resolve_request(str(bundle), check_device=False)["config"])
        plan += [(algo, bundle, n, m) for n, m in point_pairs(n_values[algo], windows)]
    return plan


def _predicted_fits(bundle: Path, n: int, m: int, device: str, card: int | None) -> tuple[bool, int | None]:
    """Whether the reference model puts the point under ``_CARD_SHARE`` of the card (no card: True)."""
    if not card:
        return True, None
    from autotune.probe.allowances import default_allowance
    from autotune.probe.device_estimate import estimate_on_device

    try:
        est = estimate_on_device(str(bundle), default_allowance(), device=device, num_patches_per_iter=n,
                                 num_sw_batch_size=m)
    except Exception:  # noqa: BLE001 - the probe will say
        return True, None
    peak = int(est.get("device_peak_bytes") or 0)
    return peak <= _CARD_SHARE * card, peak



def _measure_points(bundles: Any, n_values: dict[str, Sequence[int]], device: str, card: int | None, timeout: float,
                    start: float, max_seconds: float | None,
                    say: Callable[[str], None]) -> tuple[list[dict[str, Any]], list[Any], list[dict[str, Any]]]:
    """Probe and estimate every planned point (template, N, M): the points, their estimates and those skipped
    (over the time limit, or predicted over a share of ``card``'s memory where it is given)."""
    from autotune.calibrate.points import measure_point

    points: list[dict[str, Any]] = []
    estimates: list[Any] = []
    skipped: list[dict[str, Any]] = []
    for algo, bundle, n, m in _plan(bundles, n_values):
        if max_seconds is not None and time.monotonic() - start > max_seconds - _FIT_RESERVE_S:
            skipped.append({"algo": algo, "n": n, "m": m, "why": "time limit"})
            continue
        fits, predicted = _predicted_fits(bundle, n, m, device, card)
        if not fits:
            skipped.append({"algo": algo, "n": n, "m": m, "why": f"predicted {predicted} bytes, over "
                                                               f"{_CARD_SHARE:.0%} of the card"})
            say(f"[calibrate] {algo} N={n} M={m}: not probed (predicted over {_CARD_SHARE:.0%} of the card)")
            continue
        point, est = measure_point(algo, bundle, n, m, device, timeout)
        points.append(point)
        estimates.append(est)
        say(f"[calibrate] {algo} N={n} M={m}: {point['probe']['status']}"
            + "".join(f", {phase} reserved {_gib(point[phase]['max_memory_reserved'] or point[phase]['tracked_peak_bytes'])}"
                      f" (estimate {_gib(point[phase]['estimate_bytes'])})" for phase in ("train", "infer")))
    return points, estimates, skipped


def calibrate(device: str = "cuda:0", out_dir: str | os.PathLike[str] | None = None,
              work_dir: str | os.PathLike[str] | None = None, templates: Sequence[str] = TEMPLATES,
              quick: bool = False, dry_run: bool = False, timeout: float = 120.0, max_seconds: float | None = None,
              progress: Callable[[str], None] | None = None,
              n_values: dict[str, Sequence[int]] | None = None) -> dict[str, Any]:
    """Measure, fit and write this GPU's calibration (see the module docstring); returns the report:
    ``gpu``, ``points`` (each point's record), ``before`` (each point predicted by the calibration in force
    before this run, which never saw it), ``fit`` (``autotune.calibrate.fit.fit_model``), ``file`` and
    ``seconds``. ``n_values``: the batch sizes probed per template, in place of the defaults (two or more
    distinct ones, for templates of ``templates`` only: ``check_points``).

    Raises:
        SpecError: no CUDA device (and not a dry run), an unknown template, points refused by
            ``check_points`` (before anything is measured), or no point could be measured.
    """
    from autotune.calibrate.data import CT_SPACING, generate, make_ct_dataset, shape_for_card
    from autotune.cuda_alloc import alloc_conf, expandable_segments

    start = time.monotonic()
    say = progress or (lambda line: None)
    calibrated = [own_template(name) for name in sorted(set(templates))]  # an unknown one: refused in one line
    n_values = {**{t.name: t.points_for(quick=quick, dry_run=dry_run) for t in calibrated}, **(n_values or {})}
    check_points([t.name for t in calibrated], n_values)
    if not dry_run:
        import torch

        if not str(device).startswith("cuda") or not torch.cuda.is_available():
            raise SpecError("calibrate measures a GPU and no CUDA device is visible here; --dry-run checks the steps "
                            "on the CPU")
    device = "cpu" if dry_run else device
    gpu = gpu_facts(device)
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="autotune-calibrate-"))
    shape = DRY_SHAPE if dry_run else shape_for_card(gpu.get("torch_total_memory"))
    say(f"[calibrate] {gpu['name']}: synthetic CT set {shape[0]} x {shape[1]} x {shape[2]}, bundles of "
        f"{', '.join(templates)} in {work}")
    source = make_ct_dataset(work / "ct", 3, shape, CT_SPACING)
    bundles = generate(work / "bundles", source, list(templates), tiny=dry_run)
    from autotune.probe.isolation import prestart

    prestart()  # the probes' fork server imports torch and MONAI while the set is made
    check_fit = not dry_run and shape != shape_for_card(None)  # a smaller card than the default points were chosen on
    card = gpu.get("torch_total_memory") if check_fit else None
    points, estimates, skipped = _measure_points(bundles, n_values, device, card, timeout, start, max_seconds, say)
    before = _before(points, estimates, device, gpu, expandable_segments(alloc_conf()))
    report = _fit_and_write(gpu, points, estimates, skipped, work, out_dir, dry_run, alloc_conf(),
                            expandable_segments(alloc_conf()), say)
    report["before"] = before
    report["seconds"] = round(time.monotonic() - start, 1)
    return report


def _before(points: list[dict[str, Any]], estimates: list[Any], device: str, gpu: dict[str, Any],
            expandable: bool) -> dict[str, Any]:
    """Each measured point predicted by the calibration in force before this run (this GPU's, else the reference
    one: ``allowance_for``; a dry run: the reference), with its error: points it was not fitted on."""
    from autotune.calibrate.fit import by_template, model_points
    from autotune.probe.allowances import allowance_for, default_allowance
    from autotune.probe.model_fit import error_summary, predict_point

    prior = default_allowance() if not str(device).startswith("cuda") else allowance_for(device, gpu.get("name"))
    rows = []
    for point in model_points(points, estimates):
        factors = prior.factors(point.algo)
        if factors is None:
            continue
        predicted = predict_point(point, factors, release=prior.release_after_search, expandable=expandable)
        for phase in ("train", "infer"):
            rows.append({"algo": point.algo, "n": point.n, "m": point.m, "phase": phase,
                         "predicted_bytes": int(round(predicted[phase])), "reserved_bytes": int(point.reserved[phase]),
                         "error": predicted[phase] / float(point.reserved[phase]) - 1.0})
    card = gpu.get("torch_total_memory")
    return {"source": prior.source, "rows": rows, "summary": error_summary(rows, card),
            "by_template": by_template(rows, card)}


def _gib(value: Any) -> str:
    return "-" if value is None else f"{int(value) / 1024**3:.2f} GiB"


def _fit_and_write(gpu: dict[str, Any], points: list[dict[str, Any]], estimates: list[Any], skipped: list[Any],
                   work: Path, out_dir: Any, dry_run: bool, conf: str | None, expandable: bool,
                   say: Callable[[str], None]) -> dict[str, Any]:
    from autotune.calibrate.fit import fit_model, model_points
    from autotune.calibrate.points import calibration_rows
    from autotune.probe.calibration import calibration_record, fit_allowance, write_calibration
    from autotune.probe.device_model import BAND

    fit_points = model_points(points, estimates)
    if not fit_points:
        raise SpecError("calibrate: no point was measured (every probe failed or was skipped); see the lines above")
    say(f"[calibrate] fitting the device model to {len(fit_points)} points")
    card = gpu.get("torch_total_memory")
    model_fit = fit_model(fit_points, card, expandable=expandable)
    rows = calibration_rows(points)
    v1 = fit_allowance(rows)
    loo = model_fit["by_template"]["leave_one_out"]
    by_template_bound = {algo: {"max_over_prediction": entry["all"]["max_over"], "points": entry["all"]["points"]}
                         for algo, entry in loo.items()}
    model = {"kind": "device-model", "context_bytes": int(v1["context_bytes"]), "workspace": model_fit["workspace"],
             "release_after_search": True, "alloc_conf": conf, "band": list(BAND),
             "domain": points_domain(points, fit_points, "cpu" if dry_run else "cuda:0"),
             "bounds": model_fit["bounds"]}
    record = calibration_record(gpu, v1, rows, " ".join(["autotune", "calibrate", *(["--dry-run"] if dry_run else [])]),
                                model=model)
    overall = model_fit["summary"]["leave_one_out"] if model_fit["summary"]["leave_one_out"]["points"] else \
        model_fit["summary"]["fitted"]
    record["fit"] = {"max_over_prediction": float(overall["max_over"]), "points": len(fit_points),
                     "by_template": by_template_bound, "model": model_fit["summary"],
                     "model_by_template": model_fit["by_template"], "affine_version_1": dict(v1)}
    record["fit"]["out_of_sample"] = model_fit["out_of_sample"]
    record["model_points"] = model_fit["point_factors"]
    verdict = model_fit["verdict"]
    say(f"[calibrate] {verdict['line']}")
    if dry_run:  # named so that no GPU's (nor the CPU's own calibration, cpu.json) lookup ever finds it
        record["gpu_name"] = "dry-run"
        record["dry_run"] = "CPU dry run: tracked peaks, not a device's memory; never install this file"
    installed = verdict["install"] and not dry_run
    if not verdict["install"]:  # kept for a person to read, where no lookup finds it
        record["refused"] = verdict["line"]
    if dry_run:
        folder = Path(out_dir) if out_dir else work / "calibration"
    elif installed:
        folder = Path(out_dir) if out_dir else user_folder()
    else:
        folder = work / "calibration"
    path = write_calibration(folder, record)
    return {"gpu": gpu, "points": points, "skipped": skipped, "fit": model_fit, "file": str(path),
            "dry_run": dry_run, "work": str(work), "installed": installed,
            "refused": None if verdict["install"] or dry_run else verdict["line"], "verdict": verdict}


def points_domain(points: Sequence[dict[str, Any]], fit_points: Sequence[Any], device: str) -> dict[str, Any]:
    """The fit's domain (``autotune.probe.domain.fit_domain``) from its points' bundles: each fitted point's
    template and source, network hash, patch and volume sizes and precision on ``device``, with its N and M."""
    from autotune.bundles.config import load_bundle_config
    from autotune.probe.domain import bundle_domain, fit_domain

    fitted = {(p.algo, p.n, p.m) for p in fit_points}
    entries = []
    for point in points:
        if (point["algo"], point["n"], point["m"]) in fitted and point.get("bundle"):
            entries.append((bundle_domain(load_bundle_config(point["bundle"]), device), point["n"], point["m"]))
    return fit_domain(entries)


def _span(summary: dict[str, Any]) -> str:
    """``-a% .. +b%``: the worst under- and over-prediction of an ``error_summary``."""
    return f"{100 * summary['max_under']:+.1f}% .. {100 * summary['max_over']:+.1f}%" if summary.get("points") else "-"


def per_template_lines(report: dict[str, Any]) -> list[str]:
    """The per-template error table ``autotune calibrate`` prints: the workspace factors, and the worst
    under- and over-prediction of ``max_memory_reserved`` on the template's own points (fitted) and on
    each point from the others (leave one out)."""
    fit = report["fit"]
    lines = [f"{'template':<10} {'points':>6} {'w train':>8} {'w infer':>8} {'fitted error':>20} {'leave-one-out error':>22}"]
    for algo, factors in fit["workspace"].items():
        fitted = fit["by_template"]["fitted"].get(algo, {}).get("all", {})
        loo = fit["by_template"]["leave_one_out"].get(algo, {}).get("all", {})
        lines.append(f"{algo:<10} {fitted.get('points', 0) // 2:>6} {factors['train']:>8.2f} {factors['infer']:>8.2f} "
                     f"{_span(fitted):>20} {_span(loo):>22}")
    return lines
