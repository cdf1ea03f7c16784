"""The test suite's time, side by side for two or more clean clones on one machine: each clone's whole
``bash .ci/run`` (a fresh venv, installs, ruff, its tests), then the README's test command
(``python -m pytest -q``) in the venv ``.ci/run`` made, with a JUnit report read per test module.

    git clone -q REPO /work/before && git -C /work/before checkout -q OLD
    git clone -q REPO /work/after
    python -m benchmarks.bench_suite /work/before /work/after --out benchmarks/results/test_suite.json

``--readme-only CLONE`` skips that clone's ``.ci/run`` (its README command runs in the venv it already
has: ``.venv-ci``, else ``.venv``); ``--serial-too`` also runs the README command with ``-n 0`` in every
clone whose pytest options hold ``-n auto`` (pytest-xdist's workers against one process, same clone).

The clones run one after another, in the order given (pass them twice, interleaved, to see the
drift of a shared machine). Each record holds the load average sampled during its runs and the
machine's bf16 answer (``torch.ops.mkldnn._is_mkldnn_bf16_supported()``), which decides whether
``amp: true`` runs in bf16 or fp32 on this CPU. Per-module figures are sums of test durations
(setup, call, teardown) from the JUnit report; with several pytest-xdist workers they add up to
more than the wall time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.common import LoadSampler, command, environment, parser, report


def machine() -> dict[str, Any]:
    """CPU model, cores and the bf16 answer of this machine (torch from this interpreter)."""
    import torch

    return environment(native_bf16=bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))


def timed(cmd: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``cmd`` in ``cwd`` (output to ``log``); its exit code, wall seconds and the load meanwhile."""
    with LoadSampler() as sampler, open(log, "w") as out:
        t0 = time.monotonic()
        code = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
        seconds = time.monotonic() - t0
    return {"cmd": " ".join(cmd), "rc": code, "seconds": round(seconds, 1), "load": sampler.summary(),
            "tail": log.read_text(errors="replace").splitlines()[-3:]}


def junit_modules(path: Path) -> dict[str, Any]:
    """Counts and per-module summed durations from a JUnit report."""
    tree = ET.parse(path)
    modules: dict[str, float] = defaultdict(float)
    counts = {"tests": 0, "failed": 0, "skipped": 0}
    for case in tree.iter("testcase"):
        name = case.get("classname", "")
        parts = name.split(".")
        module = "/".join(parts[: next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1) + 1])
        modules[module + ".py"] += float(case.get("time") or 0.0)
        counts["tests"] += 1
        counts["failed"] += any(child.tag in ("failure", "error") for child in case)
        counts["skipped"] += any(child.tag == "skipped" for child in case)
    return {**counts, "summed_s": round(sum(modules.values()), 1),
            "modules": {k: round(v, 1) for k, v in sorted(modules.items(), key=lambda kv: -kv[1])}}


def _readme(python: Path, clone: Path, logs: Path, name: str, extra: list[str]) -> tuple[dict[str, Any], Any]:
    """The README's test command (plus ``extra``) in ``clone``; its timing and its JUnit summary."""
    junit = logs / f"junit_{name}.xml"
    env = dict(os.environ, AUTOTUNE_REQUIRE_SYSTEM_DEPS="1")
    run = timed([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra, f"--junitxml={junit}"], clone,
                logs / f"pytest_{name}.log", env)
    print(f"   {' '.join(['pytest -q', *extra])}: {run['seconds']} s, rc {run['rc']}", flush=True)
    return run, junit_modules(junit) if junit.is_file() else None


def measure(clone: Path, logs: Path, ci_run: bool = True, serial_too: bool = False) -> dict[str, Any]:
    """``bash .ci/run`` in ``clone`` (unless not ``ci_run``), then the README's command in the venv it made
    (and with ``serial_too``, the same with ``-n 0`` where the clone runs pytest-xdist workers)."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True,
                            text=True).stdout.strip()
    print(f"== {clone} ({commit})", flush=True)
    ci = None
    if ci_run:
        ci = timed(["bash", ".ci/run"], clone, logs / f"ci_run_{commit}.log")
        print(f"   bash .ci/run: {ci['seconds']} s, rc {ci['rc']}", flush=True)
    python = next((p for p in (clone / ".venv-ci" / "bin" / "python", clone / ".venv" / "bin" / "python")
                   if p.exists()), Path(sys.executable))
    readme, junit = _readme(python, clone, logs, commit, [])
    record = {"clone": str(clone), "commit": commit, "python": str(python), "ci_run": ci, "readme_command": readme,
              "junit": junit}
    if serial_too and "-n auto" in (clone / "pyproject.toml").read_text():
        record["readme_command_serial"], record["junit_serial"] = _readme(python, clone, logs, f"{commit}_serial",
                                                                          ["-n", "0"])
    return record


def table(result: dict[str, Any]) -> str:
    """A Markdown table, one column per README-command run (a clone's ``-n 0`` run beside its own): the totals,
    then the summed seconds per test module (one process: a module's time; several workers: their sum)."""
    columns = []
    for r in result["runs"]:
        columns.append((f"{r['commit']}: `pytest -q`", r["ci_run"], r["readme_command"], r["junit"]))
        if "readme_command_serial" in r:
            columns.append((f"{r['commit']}: `pytest -q -n 0`", None, r["readme_command_serial"], r["junit_serial"]))
    head = "| | " + " | ".join(c[0] for c in columns) + " |\n|---|" + "---:|" * len(columns) + "\n"
    rows = [("`bash .ci/run`, every tier (s)", [c[1]["seconds"] if c[1] else "-" for c in columns]),
            ("the README's command, wall (s)", [c[2]["seconds"] for c in columns]),
            ("load average during it (mean)", [c[2]["load"].get("mean") for c in columns]),
            ("tests / failed / skipped", [f"{c[3]['tests']} / {c[3]['failed']} / {c[3]['skipped']}" if c[3] else "-"
                                          for c in columns]),
            ("summed test seconds", [c[3]["summed_s"] if c[3] else "-" for c in columns])]
    modules = sorted({m for c in columns if c[3] for m in c[3]["modules"]},
                     key=lambda m: (-max((c[3] or {}).get("modules", {}).get(m, 0.0) for c in columns), m))
    rows += [(f"`{m}`", [(c[3] or {}).get("modules", {}).get(m, "-") for c in columns]) for m in modules]
    return head + "".join(f"| {name} | " + " | ".join(str(v) for v in values) + " |\n" for name, values in rows)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, "test_suite.json")
    p.add_argument("clones", nargs="*", type=Path, help="clean clones, measured in this order (none: --report-only)")
    p.add_argument("--logs", type=Path, default=Path("/tmp/autotune-bench-suite"))
    p.add_argument("--readme-only", type=Path, action="append", default=[],
                   help="a clone whose .ci/run is not run (its README command only; repeatable)")
    p.add_argument("--serial-too", action="store_true", help="also the README command with -n 0 (xdist clones)")
    args = p.parse_args(argv)
    args.report_only = args.report_only or not args.clones
    skip = {c.resolve() for c in args.readme_only}

    def run() -> dict[str, Any]:
        args.logs.mkdir(parents=True, exist_ok=True)
        return {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "command": command("benchmarks.bench_suite", argv),
                "runs": [measure(c.resolve(), args.logs, c.resolve() not in skip, args.serial_too) for c in args.clones]}

    result = report(args, run, table)
    if args.report_only:
        return 0
    print(f"machine: {result['machine']}")
    return 0 if all((r["ci_run"] or {"rc": 0})["rc"] == 0 for r in result["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
