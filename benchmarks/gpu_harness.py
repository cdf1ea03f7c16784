"""The GPU check's harness: the deadline, guarded sections, subprocesses with logs, the JSON.

A section's status is decided by what happened in it, never assumed:

- ``ok``: it ran to its end and every subprocess it started exited 0;
- ``failed``: it raised, or a subprocess exited non-zero or was killed at its time limit
  (rc 124), or it recorded a failure itself (``Check.fail``: a probe that crashed, say);
- ``partial: deadline``: it stopped early to keep the call inside its deadline;
- ``skipped: deadline``: it never started.

The run's exit code follows (``exit_code``): 1 when a section failed, 3 when none failed but
one was cut by the deadline, 0 otherwise. Everything goes under ``OUT``: one JSON rewritten
after every measurement, one log file (the device tool brings back at most 8 files).

On a GPU every command is a fresh interpreter, as a user starts it. A CPU dry run forks the
commands of ``FORKED`` (``autotune``, its trainer, the gradient-norm wrapper) from the probes'
fork server instead (``autotune.probe.isolation.start_forked_call``: a process of its own, its
own session, output and environment, killed as a group at its limit), so that it checks the
same sections without paying seconds of imports for each command; ``torchrun`` stays a
subprocess.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

from autotune.files import atomic_write_json  # noqa: E402

__all__ = ["Check", "exit_code", "OK", "FAILED", "PARTIAL", "SKIPPED", "TIMEOUT_RC"]

OK, FAILED, PARTIAL, SKIPPED = "ok", "failed", "partial: deadline", "skipped: deadline"
TIMEOUT_RC = 124  # what a subprocess killed at its time limit reports, as timeout(1) does
_LOG_TAIL = 20000  # characters of a subprocess's output kept in the log file
#: ``python -m MODULE`` -> the function a dry run forks instead (``module:function``, called with the arguments)
FORKED = {"autotune": "autotune.cli:main", "autotune.trainer": "autotune.trainer.__main__:main",
          "benchmarks.gpu_gradnorm": "benchmarks.gpu_gradnorm:main"}
_START = threading.Lock()  # sections start commands from threads; multiprocessing's start is not thread-safe


class Check:
    """One call's state: results, output folder, deadline, and the guarded section runner.

    Args:
        call: ``memory`` or ``training`` (names the JSON and log files).
        out: the output folder (``$OUT`` on the device).
        deadline_s: seconds from now; sections after it are skipped, long ones stop early.
        dry_run: CPU, tiny sizes.
        device: ``cuda:0`` or ``cpu``.
        cfg: the call's fixed sizes (batch sizes, limits, epochs), chosen by hand.
    """

    def __init__(self, call: str, out: Path, deadline_s: float, dry_run: bool, device: str,
                 cfg: Mapping[str, Any]) -> None:
        self.call, self.out, self.dry_run, self.device, self.cfg = call, Path(out), dry_run, device, cfg
        self.out.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.deadline = self.t0 + float(deadline_s)
        self.work = Path(os.environ.get("AUTOTUNE_GPU_CHECK_WORK", "/tmp/autotune-gpu-check")) / call
        self.work.mkdir(parents=True, exist_ok=True)
        self.results: dict[str, Any] = {"call": call, "dry_run": dry_run, "device": device,
                                        "deadline_s": float(deadline_s), "sections": {}}
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self._record: dict[str, Any] | None = None

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def json_path(self) -> Path:
        return self.out / f"gpu_check_{self.call}.json"

    @property
    def log_path(self) -> Path:
        return self.out / f"gpu_check_{self.call}_logs.txt"

    def left(self) -> float:
        """Seconds to the deadline (negative past it)."""
        return self.deadline - time.monotonic()

    def save(self) -> None:
        self.results["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        atomic_write_json(self.json_path, self.results)

    def say(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {msg}", flush=True)

    def section(self, name: str, func: Callable[[dict[str, Any]], None], needs_s: float = 0.0) -> dict[str, Any]:
        """Run ``func(record)`` as section ``name`` unless fewer than ``needs_s`` seconds are left;
        its status follows the module docstring's rules. Returns the record."""
        record: dict[str, Any] = {"status": "running", "subprocesses": []}
        self.results["sections"][name] = record
        if self.left() < needs_s:
            record["status"] = SKIPPED
            self.say(f"== {name}: skipped ({self.left():.0f} s left, needs {needs_s:.0f} s)")
            self.save()
            return record
        self.say(f"== {name}")
        start, self._record = time.monotonic(), record
        try:
            func(record)
        except Exception as exc:  # noqa: BLE001 - a broken section is a result; the next one runs
            self.fail(record, f"{type(exc).__name__}: {exc}")
            record["traceback"] = traceback.format_exc()[-3000:]
        finally:
            self._record = None
        record["status"] = _status(record)
        record["seconds"] = round(time.monotonic() - start, 1)
        self.say(f"   {name}: {record['status']} ({record['seconds']} s)"
                 + (f": {'; '.join(record['failures'])[:300]}" if record.get("failures") else ""))
        self.save()
        return record

    def fail(self, record: dict[str, Any], why: str) -> None:
        """Record a failure in ``record`` (its section ends ``failed``)."""
        record.setdefault("failures", []).append(why)

    def cut(self, record: dict[str, Any], why: str) -> None:
        """Record that ``record``'s section stopped early for the deadline."""
        record["cut"] = why
        self.say(f"   stopping early: {why}")

    def run(self, cmd: list[str], log_name: str, timeout: float | None = None,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` (output into the log file), bounded by ``timeout`` and the deadline.

        A non-zero exit, or a kill at the time limit (rc 124), fails the current section."""
        limit = max(5.0, min(timeout if timeout is not None else 1e9, self.left()))
        start = time.monotonic()
        target = FORKED.get(cmd[2]) if self.dry_run and cmd[:2] == [sys.executable, "-m"] and len(cmd) > 2 else None
        if target:
            proc = self._forked(cmd, target, limit, dict(env or self.env), log_name)
        else:
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=dict(env or self.env),
                                      cwd=str(ROOT))
            except subprocess.TimeoutExpired as exc:
                text = _text(exc.stdout) + _text(exc.stderr)
                proc = subprocess.CompletedProcess(cmd, TIMEOUT_RC, text, f"killed at its time limit of {limit:.0f} s")
        seconds = round(time.monotonic() - start, 1)
        self._log(log_name, f"$ {' '.join(cmd)}\nrc={proc.returncode} ({seconds} s)\n{proc.stdout}\n{proc.stderr}")
        if self._record is not None:
            self._record["subprocesses"].append({"log": log_name, "rc": proc.returncode, "seconds": seconds})
            if proc.returncode != 0:
                self.fail(self._record, f"{log_name}: rc {proc.returncode}"
                          + (" (killed at its time limit)" if proc.returncode == TIMEOUT_RC else ""))
        return proc

    def _forked(self, cmd: list[str], target: str, limit: float, env: dict[str, str],
                log_name: str) -> subprocess.CompletedProcess[str]:
        """``cmd`` forked from the fork server as ``target(cmd[3:])`` (the module docstring), its process group
        killed at ``limit`` (rc 124); its output read back from two files."""
        from autotune.probe.isolation import start_forked_call

        files = [self.work / f".{log_name}.{threading.get_ident()}.{name}" for name in ("out", "err")]
        with _START:
            child = start_forked_call(target, cmd[3:], str(files[0]), str(files[1]), env, name=f"check-{log_name}",
                                      cwd=str(ROOT))
        rc = child.wait() if child.wait_for(limit) else None
        if rc is None:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child.wait()
        out, err = (f.read_text(errors="replace") if f.is_file() else "" for f in files)
        for f in files:
            f.unlink(missing_ok=True)
        if rc is None:
            return subprocess.CompletedProcess(cmd, TIMEOUT_RC, out, err + f"killed at its time limit of {limit:.0f} s")
        return subprocess.CompletedProcess(cmd, rc, out, err)

    def _log(self, name: str, text: str) -> None:
        with open(self.log_path, "a", encoding="utf-8") as handle:
            handle.write(f"===== {name}\n{text[-_LOG_TAIL:]}\n")


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value or ""


def _status(record: Mapping[str, Any]) -> str:
    if record.get("failures"):
        return FAILED
    return PARTIAL if record.get("cut") else OK


def exit_code(results: Mapping[str, Any]) -> int:
    """1 when a section failed, 3 when one was cut or skipped by the deadline, else 0."""
    statuses = [str(s.get("status")) for s in (results.get("sections") or {}).values()]
    if FAILED in statuses:
        return 1
    return 3 if any(s in (PARTIAL, SKIPPED) for s in statuses) else 0
