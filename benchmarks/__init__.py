"""The benchmark scripts, each run as ``python -m benchmarks.NAME`` from the repository root; the scaffold they
share is ``benchmarks.common``, and BENCHMARKS.md names the command of every table."""
