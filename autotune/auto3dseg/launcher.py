"""Run a MONAI template's ``scripts/train.py`` under a memory limit and record its peak.

    python -m autotune.launch --memory-limit 8GiB [--peak-json FILE] -- work/segresnet_0/scripts/train.py \\
        run --config_file=work/segresnet_0/configs/hyper_parameters.yaml

The script runs in the launcher's worker (``runpy``, as ``python SCRIPT ARGS`` would run it: its folder first
on ``sys.path``), a child of its own session (``autotune.auto3dseg.supervise``), so the limit applies to it:

- CUDA: ``torch.cuda.set_per_process_memory_fraction`` caps the caching allocator at the limit before the
  script runs; the peak is the allocator's ``max_memory_reserved`` (and ``max_memory_allocated``).
- CPU: the probe's tensor tracker (``autotune.probe.memory``) counts every tensor storage the script's main
  thread creates or uses (a batch made by a data-loader worker counts from its first use); crossing the limit
  raises ``torch.OutOfMemoryError`` there, as a CUDA allocator would. The peaks of training and validation
  are kept apart (the phase is the mode of the last ``Module.train()``/``eval()``), with the process's
  peak RSS beside them. Worker processes
  forked by the script are not tracked (their memory is host memory on a GPU, too).

A template whose ``train.py`` hard-codes ``cuda`` (SwinUNETR) runs on the CPU in its CPU context
(``MonaiTemplate.cpu_context``, SwinUNETR's ``cuda_on_cpu``: ``cuda`` tensors on the CPU, one device counted), named in the
record as ``cpu_context``.

The JSON record (``--peak-json``, default ``<bundle>/autotune/launch.json``) holds the limit, the peaks and the
exit status; the exit code is the script's (3 when it ran out of memory under the limit: then one line names the
batch that failed and the command that re-tunes, and the study learns the point, ``autotune.auto3dseg.oom``). Stopped by SIGTERM,
SIGINT or SIGUSR1, the launcher writes the record (``status: stopped``, the signal, the peaks so far, the
script's exit status if it had ended), stops every process the script started and exits 128 + the signal's
number (``autotune.auto3dseg.supervise``). The templates log to
an mlflow file store (``<ckpt_path>/mlruns``), which mlflow 3 refuses unless ``MLFLOW_ALLOW_FILE_STORE`` is
set: the launcher sets it to ``true`` unless it is set already. As AutoRunner's
command prefix: ``AutoRunner.set_device_info(cmd_prefix="python -m autotune.launch --memory-limit 8GiB --")``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "launch", "EXIT_OOM"]

EXIT_OOM = 3  # as 'autotune train' exits when training runs out of memory under its limit


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m autotune.launch",
        description="Run a MONAI bundle's scripts/train.py under a memory limit and record its peak memory.")
    parser.add_argument("--memory-limit", required=True, help="e.g. 8GiB: the device memory the script may use")
    parser.add_argument("--device", default="auto", help="auto (the first GPU, else the CPU), cpu or cuda:N")
    parser.add_argument("--peak-json", default=None, help="where to write the record (default <bundle>/autotune/launch.json)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    return parser


def _cpu_tracker(limit: int, shared: Any = None) -> Any:
    """A dispatch mode counting the storages of every op's inputs and outputs with the probe's tracker; each new
    peak also goes to ``shared`` (``SharedPeaks``: the supervisor's copy, for a record written on a stop)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    from autotune.probe.tracker import MemoryTracker

    class LaunchTracker(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.counter = MemoryTracker("cpu", limit)
            self.active = True
            self.phase = "setup"  # then the mode of the last Module.train()/eval(): training or validation
            self.peaks = {"setup": 0, "train": 0, "validation": 0}

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if not self.active:  # a forked worker: not the training process
                return func(*args, **(kwargs or {}))
            self.counter.track([t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)], "input")
            out = func(*args, **(kwargs or {}))
            self.counter.track([t for t in tree_leaves(out) if isinstance(t, torch.Tensor)], func.__name__)
            current = self.counter.current_bytes  # frees come between ops
            if current > self.peaks[self.phase]:
                self.peaks[self.phase] = current
                if shared is not None:
                    shared.raise_to(f"{self.phase}_peak_bytes", current)
                    shared.raise_to("peak_bytes", self.counter.peak_bytes)
            return out

    return LaunchTracker()


@contextlib.contextmanager
def _phases(tracker: Any) -> Iterator[None]:
    """Name the tracker's phase after the last ``Module.train(mode)`` (``eval()`` calls it): the script's
    training loop and its validation set their model's mode, so their peaks are kept apart."""
    if tracker is None:  # CUDA: the allocator's peaks are not split by phase
        yield
        return
    import torch

    original = torch.nn.Module.train

    def train(module: Any, mode: bool = True) -> Any:
        tracker.phase = "train" if mode else "validation"
        return original(module, mode)

    torch.nn.Module.train = train  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.train = original  # type: ignore[method-assign]


def _script_context(script: Path, device: str) -> tuple[str | None, Any]:
    """(template, context) for ``script`` on ``device``: its template's CPU context (``MonaiTemplate.cpu_context``)
    when the script is a recognised bundle's and the device the CPU; else (None, a context doing nothing)."""
    from autotune.auto3dseg.recognise import identify, monai_bundle_root
    from autotune.auto3dseg.templates import find_template
    from autotune.errors import ConfigError

    root = monai_bundle_root(script.parent.parent) if script.parent.name == "scripts" else None
    if root is None or device.startswith("cuda"):
        return None, contextlib.nullcontext()
    try:
        template = find_template(identify(root).name)
    except ConfigError:  # not a version autotune knows: run as it is
        return None, contextlib.nullcontext()
    context = template.cpu_context() if template is not None else None
    if context is None:
        return None, contextlib.nullcontext()
    return template.name, context


def _run_script(script: Path, args: Sequence[str]) -> int:
    """``python SCRIPT ARGS`` in this process; returns its exit code."""
    saved_argv, saved_path = list(sys.argv), list(sys.path)
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.parent))  # as the interpreter does for a script
    try:
        runpy.run_path(str(script), run_name="__main__")
        return 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def _record_path(script: Path, peak_json: str | None) -> Path | None:
    if peak_json:
        return Path(peak_json)
    if script.parent.name == "scripts":
        return script.parent.parent / "autotune" / "launch.json"
    return None


def _watch_cuda(device: str, shared: Any) -> None:
    """Copy the allocator's peaks into ``shared`` every second (a daemon thread), for a record written on a stop."""
    import threading

    from autotune.probe import memory

    def loop() -> None:
        while True:
            peaks = memory.cuda_peaks(device)
            shared.raise_to("cuda_max_memory_reserved", int(peaks.get("cuda_max_memory_reserved") or 0))
            shared.raise_to("cuda_max_memory_allocated", int(peaks.get("cuda_max_memory_allocated") or 0))
            time.sleep(1.0)

    threading.Thread(target=loop, name="autotune-launch-cuda-peaks", daemon=True).start()


def _prepare(device: str, memory_limit: int, record: dict[str, Any], shared: Any) -> Any:
    """Cap the CUDA allocator, or make the CPU tracker; returns the tracker (None on CUDA)."""
    import torch

    from autotune.probe import memory

    if device.startswith("cuda"):
        record["memory_fraction"] = memory.cuda_set_memory_limit(device, memory_limit)
        torch.cuda.reset_peak_memory_stats(device)
        record["measure"] = "CUDA caching allocator: max_memory_reserved"
        if shared is not None:
            _watch_cuda(device, shared)
        return None
    tracker = _cpu_tracker(memory_limit, shared)
    os.register_at_fork(after_in_child=lambda: setattr(tracker, "active", False))
    memory.reset_peak_rss()
    record["measure"] = "tracked tensor storage bytes of the main thread (autotune.probe.memory)"
    return tracker


def _peaks(device: str, tracker: Any) -> dict[str, Any]:
    from autotune.probe import memory

    if tracker is None:
        peaks = memory.cuda_peaks(device)
        return {"peak_bytes": peaks["cuda_max_memory_reserved"], **peaks}
    tracker.active = False
    return {"peak_bytes": tracker.counter.peak_bytes, "train_peak_bytes": tracker.peaks["train"],
            "validation_peak_bytes": tracker.peaks["validation"], "setup_peak_bytes": tracker.peaks["setup"],
            "peak_rss_bytes": memory.peak_rss_bytes()}


def launch(script: str | os.PathLike[str], args: Sequence[str], memory_limit: int, device: str = "auto",
           peak_json: str | None = None, shared: Any = None) -> dict[str, Any]:
    """Run ``script`` with ``args`` under ``memory_limit`` bytes on ``device``; returns (and writes) the record.

    ``shared``: the supervisor's ``SharedPeaks`` (``autotune.auto3dseg.supervise``), kept up to date with the
    peaks and told when the script has ended. The record is written with ``status: running`` before the
    script starts and again when it ends."""
    from autotune.device import resolve_device
    from autotune.files import atomic_write_json
    from autotune.probe import memory

    device = resolve_device(device)
    path = Path(script).resolve()
    target = _record_path(path, peak_json)
    # MONAI's templates log to an mlflow file store (<ckpt_path>/mlruns), which mlflow 3 refuses unless allowed
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from autotune.cuda_alloc import alloc_conf

    # the allocator setting the script runs under: its tune's, or the line autotune train would print says so
    record: dict[str, Any] = {"script": str(path), "args": list(args), "device": device, "memory_limit": memory_limit,
                              "alloc_conf": alloc_conf()}
    start = time.perf_counter()
    tracker = _prepare(device, memory_limit, record, shared)
    if target is not None:
        atomic_write_json(target, {**record, "status": "running"})
    template, script_context = _script_context(path, device)
    if template is not None:
        record["cpu_context"] = f"{template}: cuda devices on the CPU"
    status = "ok"
    try:
        with script_context, (tracker if tracker is not None else contextlib.nullcontext()), _phases(tracker):
            code = _run_script(path, args)
    except Exception as exc:  # the script's own failure: recorded, then its traceback as Python shows it
        status, code = ("oom", EXIT_OOM) if memory.is_oom_error(exc) else ("error", 1)
        record["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        record["phase_failed"] = getattr(tracker, "phase", None)  # on the CPU: training or validation
        if status == "error":
            import traceback

            traceback.print_exc()
    if shared is not None:
        shared.script_ended(code)
    record.update(status=status if code == 0 or status != "ok" else "error", exit_code=code,
                  seconds=round(time.perf_counter() - start, 3), **_peaks(device, tracker))
    record["within_limit"] = record["status"] != "oom" and int(record["peak_bytes"] or 0) <= memory_limit
    if record["status"] == "oom":  # one line naming the batch and the re-tune; the study learns the point
        from autotune.auto3dseg.oom import oom_outcome

        record["line"] = oom_outcome(path, record, memory_limit, device)
    if target is not None:
        atomic_write_json(target, record)
        record["record_path"] = str(target)
    return record


def _check_config_files(arguments: Sequence[str]) -> None:
    """The config files named in the script's arguments (``--config_file=a.yaml`` or a list of them), each
    within autotune's limits before MONAI's ``ConfigParser`` reads it (``view.check_config_file``)."""
    import re

    from autotune.auto3dseg.view import check_config_file

    for argument in arguments:
        for name in re.findall(r"[^'\"\[\],=\s]+\.(?:yaml|json)", argument):
            if Path(name).is_file():
                check_config_file(Path(name))


def _run(command: Sequence[str], limit: int, device: str, peak_json: str | None, shared: Any) -> int:
    """The supervised worker: the launch, its one summary line, the script's exit code."""
    from autotune.errors import AutotuneError
    from autotune.utils import format_bytes

    try:
        record = launch(command[0], command[1:], limit, device, peak_json, shared)
    except AutotuneError as exc:  # e.g. a device this machine does not have
        print(f"python -m autotune.launch: error: {exc}", file=sys.stderr)
        return 2
    if record.get("line"):  # out of memory: what failed and the command that re-tunes
        print(record["line"], file=sys.stderr)
        return int(record["exit_code"])
    print(f"autotune.launch: {record['status']}, peak {format_bytes(record['peak_bytes'])} of "
          f"{format_bytes(limit)} on {record['device']}"
          + (f" (record: {record['record_path']})" if record.get("record_path") else ""), file=sys.stderr)
    return int(record["exit_code"])


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``--memory-limit``, ``--device``, ``--peak-json`` and ``-- SCRIPT ARGS``; run the script in a
    supervised worker (``autotune.auto3dseg.supervise``); return its exit code, or 128 + a stop signal's number."""
    from autotune.auto3dseg.supervise import supervise
    from autotune.errors import AutotuneError
    from autotune.utils import parse_bytes

    options = _parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    command = list(options.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("python -m autotune.launch: give the script after --, e.g. -- scripts/train.py run --config_file=...",
              file=sys.stderr)
        return 2
    try:
        limit = parse_bytes(options.memory_limit, "--memory-limit")
        if not Path(command[0]).is_file():
            raise AutotuneError(f"{command[0]}: no such script")
        _check_config_files(command[1:])
    except AutotuneError as exc:
        print(f"python -m autotune.launch: error: {exc}", file=sys.stderr)
        return 2
    script = Path(command[0]).resolve()
    base = {"script": str(script), "args": command[1:], "device": options.device, "memory_limit": limit}
    return supervise(lambda shared: _run(command, limit, options.device, options.peak_json, shared),
                     _record_path(script, options.peak_json), base, lambda line: print(line, file=sys.stderr))
