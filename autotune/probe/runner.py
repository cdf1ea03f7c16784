"""Run one probe (a short real trial) in an isolated child process and classify how it ended.

``run_probe`` writes a JSON request, starts the trial in a child process in its own session
(so it leads its own process group), waits up to ``timeout`` seconds and reads the child's
JSON result. The child is forked from a server that has imported torch and MONAI once
(``autotune.probe.isolation``), or with ``AUTOTUNE_PROBE_ISOLATION=subprocess`` it is a fresh
``python -m autotune.probe.trial REQUEST``. How the trial ended is decided from the exit code or signal and
the JSON, never from error text alone:

=========  ==================================================================
status     when
=========  ==================================================================
ok         exit code 0 and a result
oom        exit code 3: out of memory (``torch.OutOfMemoryError``, an allocator
           failure, or on CPU the tracked peak crossing ``memory_limit``)
nonfinite  exit code 5: the training steps' loss, or the weights after them, held
           a NaN or Inf (memory and timings measured; never a fit)
error      exit code 1 (``error_type``/``error_tail`` from the child), no result,
           or an unexpected exit code
killed     ended by a signal (``signal`` holds its number; segfault, SIGKILL,
           the kernel's OOM killer)
timeout    still running after ``timeout`` s: the whole process group is killed
=========  ==================================================================

The calling process is never affected: a failed trial is a result, not an exception.

Test-only fault hook: the child reads ``AUTOTUNE_PROBE_FAULT`` (from the environment, or
``env=`` of ``run_probe``): comma-separated rules, each ``FAULT`` or
``FAULT@KEY=VALUE[&KEY=VALUE]``. FAULT is ``oom`` (raise ``torch.OutOfMemoryError``),
``segfault`` (SIGSEGV to itself), ``sigkill``, ``hang`` (sleep forever) or ``raise``
(``ValueError``). KEY is one of ``num_patches_per_iter``, ``num_sw_batch_size``,
``validation_device``, ``device``, ``phase``. A rule fires when every condition holds: one
without a ``phase`` condition as soon as the child starts (before torch is imported and
the model built, so fault tests are quick; ``phase_failed`` is the first phase), one with
``phase=train`` or ``phase=infer`` at the start of that phase. Example:
``AUTOTUNE_PROBE_FAULT="oom@num_patches_per_iter=3,segfault@num_patches_per_iter=5"``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import ProbeError
from autotune.files import atomic_write_json
from autotune.probe.isolation import isolation_mode
from autotune.tunables import TUNABLES, VALIDATION_DEVICE, Point, Tunable
from autotune.utils import look_up_option, parse_bytes

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

__all__ = ["PHASES", "VALIDATION_DEVICES", "resolve_request", "run_probe"]

PHASES = ("train", "infer")
VALIDATION_DEVICES = VALIDATION_DEVICE.choices
_DEVICE_RE = re.compile(r"cpu|cuda(?::\d+)?")
_TAIL_LINES = 15


def _positive_int(value: Any, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ProbeError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _tuned_value(item: Tunable, value: Any, config: BundleConfig) -> Any:
    """The checked value of tunable ``item`` for a trial: ``value``, or the bundle's when None (or empty)."""
    if item.kind == "choice":
        return look_up_option(value or item.bundle_value(config), item.choices, item.name, ProbeError)
    return _positive_int(item.bundle_value(config) if value is None else value, item.name)


def _request_config(bundle: str | Path | Mapping[str, Any] | BundleConfig) -> BundleConfig:
    """The checked config of ``bundle``: a loaded config as it is, a plain view (a dict) parsed here, a folder
    or its YAML loaded and its data held against it.

    Raises:
        ConfigError: the bundle is missing or invalid. DataError: its data does not fit it.
    """
    from autotune.bundles.config import BundleConfig, bundle_config_path, load_bundle_config

    if isinstance(bundle, BundleConfig):
        return bundle
    if isinstance(bundle, Mapping):
        return BundleConfig.parse(json.loads(json.dumps(dict(bundle))), "bundle config (dict)")
    from autotune.data.bundle_fit import check_bundle_data

    config = load_bundle_config(bundle)
    check_bundle_data(config, bundle_config_path(bundle))  # the data it is made for, against it
    return config


def _phases(phases: str | Sequence[str]) -> list[str]:
    items = [p.strip() for p in phases.split(",")] if isinstance(phases, str) else [str(p) for p in phases]
    out: list[str] = []
    for item in filter(None, items):
        look_up_option(item, PHASES, "phase", ProbeError)
        if item not in out:
            out.append(item)
    if not out:
        raise ProbeError("phases must name at least one of: train, infer")
    return out


def _check_cuda(device: str) -> None:
    import torch

    if not torch.cuda.is_available():
        raise ProbeError(f"device {device!r} asked for but no CUDA device is visible; use --device cpu or 'autotune estimate'")
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise ProbeError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) visible")


def resolve_request(bundle: str | Path | Mapping[str, Any] | BundleConfig,
                    point: Point | Mapping[str, Any] | None = None, *, device: str = "cpu",
                    memory_limit: int | str | None = None, phases: str | Sequence[str] = PHASES,
                    warmup_steps: int = 1, measure_steps: int = 2, check_device: bool = True,
                    precision: str | None = None, **tuned: Any) -> dict[str, Any]:
    """Load the bundle config and check every argument; returns the request a trial runs from, its ``config``
    the bundle's ``BundleConfig`` holding the trial's tunables (what the step reads, as training reads them).

    ``bundle``: a folder or its YAML, a loaded ``BundleConfig``, or a plain view (a dict, parsed here).

    ``point`` (``autotune.tunables.Point``) holds the tunables' values; a tunable may also be given as a keyword
    by its name (``num_patches_per_iter=4``), over the point. A tunable left out (or None) means the bundle's value.

    ``precision`` (``fp32``, ``bf16``, ``fp16``) is what the trial computes in; None decides it
    here (``autotune.precision.for_config``), so the child never decides on its own.

    Raises:
        ConfigError: the bundle is missing or invalid.
        DataError: the bundle's data does not fit it (``autotune.data.bundle_fit.check_bundle_data``).
        ProbeError: an argument is invalid, or a CUDA device is asked for but not visible.
    """
    config = _request_config(bundle)
    if not isinstance(device, str) or not _DEVICE_RE.fullmatch(device):
        raise ProbeError(f"unknown device {device!r}; give cpu, cuda or cuda:N")
    if check_device and device.startswith("cuda"):
        _check_cuda(device)
    limit = None if memory_limit is None else parse_bytes(memory_limit, "memory_limit")
    from autotune.precision import PRECISIONS, for_config

    if precision is None:
        precision = for_config(config, device).name
    given = Point.of(point, **tuned)
    unknown = given.unknown()
    if unknown:
        raise ProbeError(f"unknown tunable {unknown[0]!r}; known: {', '.join(t.name for t in TUNABLES)}")
    values = {t.name: _tuned_value(t, given.get(t.name), config) for t in TUNABLES}
    return {
        "config": config.with_values(**dict(t.view_entry(values[t.name]) for t in TUNABLES)),
        **values,
        "device": device,
        "memory_limit": limit,
        "phases": _phases(phases),
        "warmup_steps": _positive_int(warmup_steps, "warmup_steps", 0),
        "measure_steps": _positive_int(measure_steps, "measure_steps", 1),
        "precision": look_up_option(precision, PRECISIONS, "precision", ProbeError),
    }


def _kill_group(pgid: int) -> None:
    """Kill the child's process group, and the child itself (stopped before its ``setsid`` it leads no group)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_unreaped(pid: int, timeout: float) -> bool:
    """Wait until ``pid`` exits without reaping it (its group id stays ours); False on timeout."""
    deadline, pause = time.monotonic() + timeout, 0.005
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _tail(path: Path) -> str | None:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    except OSError:
        return None
    return "".join(lines[-_TAIL_LINES:]) or None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _run_subprocess(tmpdir: Path, child_env: dict[str, str], timeout: float) -> tuple[Any, bool]:
    """A fresh interpreter in its own session: ``python -m autotune.probe.trial REQUEST``."""
    with open(tmpdir / "stdout.txt", "wb") as out, open(tmpdir / "stderr.txt", "wb") as err:
        try:
            proc = subprocess.Popen([sys.executable, "-m", "autotune.probe.trial", str(tmpdir / "request.json")],
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=child_env,
                                    start_new_session=True)
        except OSError as exc:
            raise ProbeError(f"could not start the probe process ({exc}); check {sys.executable}") from exc
        try:
            finished = _wait_unreaped(proc.pid, timeout)
        finally:
            _kill_group(proc.pid)  # the leader is not reaped yet, so this group id is still the child's
            proc.wait()
    return proc, finished


def _run_forked(tmpdir: Path, child_env: dict[str, str], timeout: float) -> tuple[Any, bool]:
    """A child forked from the preloaded server (``autotune.probe.isolation``), in its own session."""
    from autotune.probe.isolation import start_forked

    try:
        proc = start_forked(str(tmpdir / "request.json"), str(tmpdir / "stdout.txt"), str(tmpdir / "stderr.txt"),
                            child_env)
    except OSError as exc:
        raise ProbeError(f"could not start the probe process ({exc}); set AUTOTUNE_PROBE_ISOLATION=subprocess") \
            from exc
    try:
        finished = proc.wait_for(timeout)
    finally:
        # the child leads its own group (setsid): kill what is left of it, leader and any stragglers
        _kill_group(proc.pid)
        proc.wait()
    return proc, finished


def _child_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """This process's environment plus ``env``, with this package on ``PYTHONPATH``.

    Raises:
        ProbeError: ``AUTOTUNE_PROBE_FAULT`` holds a bad rule.
    """
    from autotune.probe.faults import FAULT_ENV, parse_fault_rules

    child_env = dict(os.environ)
    child_env.update({str(k): str(v) for k, v in (env or {}).items()})
    try:
        parse_fault_rules(child_env.get(FAULT_ENV))
    except ValueError as exc:
        raise ProbeError(str(exc)) from exc
    package_root = str(Path(__file__).resolve().parents[2])
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, child_env.get("PYTHONPATH")]))
    return child_env


@dataclass
class _ChildRun:
    """How a child ended and what it left: its process, whether it finished in time, its last state,
    its result (None if it wrote none) and the tail of its stderr."""

    proc: Any
    finished: bool
    state: dict[str, Any]
    result: dict[str, Any] | None
    stderr_tail: str | None


def _run_child(req: dict[str, Any], child_env: dict[str, str], timeout: float) -> _ChildRun:
    """Write the request into a temporary folder, run the trial in an isolated child, read what it left."""
    with tempfile.TemporaryDirectory(prefix="autotune-probe-") as tmp:
        tmpdir = Path(tmp)
        req.update(result_path=str(tmpdir / "result.json"), state_path=str(tmpdir / "state.json"),
                   launched_at=time.time())
        # the config as plain data: the child parses it back (autotune.probe.trial.main)
        atomic_write_json(tmpdir / "request.json", {**req, "config": req["config"].as_view()})
        if isolation_mode() == "forkserver":
            proc, finished = _run_forked(tmpdir, child_env, timeout)
        else:
            proc, finished = _run_subprocess(tmpdir, child_env, timeout)
        return _ChildRun(proc, finished, _read_json(tmpdir / "state.json") or {}, _read_json(tmpdir / "result.json"),
                         _tail(tmpdir / "stderr.txt"))


def _classify(result: dict[str, Any], run: _ChildRun, first_phase: str) -> None:
    """Set ``result``'s status (and the failure's phase, type and tail) from the exit code or signal and
    the child's JSON, as the module docstring's table says."""
    from autotune.probe.trial import EXIT_NONFINITE, EXIT_OK, EXIT_OOM

    rc = run.proc.returncode
    running_phase = run.state.get("phase") if run.state.get("phase") in PHASES else first_phase
    if not run.finished:
        result.update(status="timeout", phase_failed=running_phase, error_type="Timeout", error_tail=run.stderr_tail)
    elif rc < 0:
        result.update(status="killed", signal=-rc, phase_failed=running_phase, error_type=_signal_name(-rc),
                      error_tail=run.stderr_tail)
    elif run.result is None:
        result.update(status="error", phase_failed=running_phase, error_type="NoResult",
                      error_tail=run.stderr_tail or f"the probe child exited with code {rc} and wrote no result")
    elif rc == EXIT_OOM:
        result["status"] = "oom"
    elif rc == EXIT_NONFINITE:  # the child's error_type and error_tail say what was non-finite
        result["status"] = "nonfinite"
    elif rc != EXIT_OK or run.result.get("status") != "ok":
        result["status"] = "error"
        result["error_type"] = result.get("error_type") or f"ExitCode{rc}"
        result["error_tail"] = result.get("error_tail") or run.stderr_tail


def run_probe(bundle: str | Path | Mapping[str, Any] | BundleConfig, point: Point | Mapping[str, Any] | None = None,
              *, device: str = "auto", memory_limit: int | str | None = None, timeout: float = 300.0,
              phases: tuple[str, ...] = PHASES, warmup_steps: int = 1, measure_steps: int = 2,
              env: Mapping[str, str] | None = None, precision: str | None = None, **tuned: Any) -> dict[str, Any]:
    """Run one measured trial of ``bundle`` at ``point`` in an isolated child; returns the result dict.

    A dict ``bundle`` is the config's plain view (parsed once here), a ``BundleConfig`` the loaded config; a path
    is a bundle folder or its YAML. ``point`` and any tunable given as a keyword as in ``resolve_request``: N or M
    left out means the bundle's value; the ``validation_device`` left out, where the bundle keeps the volume
    (``cpu`` when it sets ``sw_input_on_cpu``). ``device`` ``auto`` is the first GPU, else the CPU.
    ``memory_limit`` is bytes or a size such as ``"8GiB"`` (CPU: the tracked tensor peak may not pass it; CUDA:
    the caching allocator is capped at it). ``env`` adds to the child's environment. ``precision`` as in
    ``resolve_request``. See the module docstring for the statuses.

    Raises:
        ConfigError: the bundle is missing or invalid.
        ProbeError: bad arguments (unknown device or phase, N < 1, a bad fault rule, timeout <= 0),
            or the child process could not be started at all.
    """
    from autotune.device import resolve_device
    from autotune.probe.trial import base_result

    start = time.perf_counter()
    device = resolve_device(device)
    req = resolve_request(bundle, Point.of(point, **tuned), device=device, memory_limit=memory_limit, phases=phases,
                          warmup_steps=warmup_steps, measure_steps=measure_steps, precision=precision)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ProbeError(f"timeout must be a positive number of seconds, got {timeout!r}")
    child_env = _child_env(env)
    result = base_result(req)
    run = _run_child(req, child_env, float(timeout))
    for key in ("device_name", "device_total_memory", "torch_version", "monai_version"):
        result[key] = run.state.get(key, result.get(key))
    if run.result is not None:
        result.update(run.result)
    _classify(result, run, req["phases"][0])
    result.setdefault("signal", None)
    result["exit_code"] = run.proc.returncode
    result["child_pid"] = run.proc.pid
    result["measured"] = True
    result["wall_seconds"] = time.perf_counter() - start
    return result
