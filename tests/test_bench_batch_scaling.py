"""benchmarks/bench_batch_scaling.py: ``--variants`` and reports old (generated, tuned) and new."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import ModuleType

import pytest

import benchmarks.bench_batch_scaling

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return benchmarks.bench_batch_scaling


@pytest.fixture(scope="module")
def old_report() -> dict:
    """The committed results in the format before ``--variants``: generated and tuned only."""
    report = json.loads((RESULTS / "batch_scaling.json").read_text())
    for entry in report["algos"].values():
        entry.pop("tune", None)
        for part in ("settings", "runs"):
            if "largest" in entry.get(part, {}):
                entry[part]["tuned"] = entry[part].pop("largest")
            entry.get(part, {}).pop("handoff", None)
    return report


def test_variants_option(bench: ModuleType) -> None:
    assert bench.parse_variants("handoff,generated") == ("generated", "handoff")  # table order
    assert bench.parse_variants(",".join(bench.VARIANTS)) == ("generated", "largest", "handoff")
    with pytest.raises(SystemExit, match="tuned"):
        bench.parse_variants("generated,tuned")


def test_old_report_renders_its_tuned_variant(bench: ModuleType, old_report: dict) -> None:
    rows = bench.table(old_report).splitlines()[2:]
    assert {row.split("|")[2].strip() for row in rows} == set(bench.variants_of(next(iter(old_report["algos"].values()))))
    assert any("| tuned |" in row for row in rows)


def test_new_report_renders_every_variant_and_the_verdicts(bench: ModuleType, old_report: dict) -> None:
    report = copy.deepcopy(old_report)
    for entry in report["algos"].values():  # the old "tuned" is the new "largest"; add a handoff variant
        for part in ("settings", "runs"):
            entry[part]["largest"] = entry[part].pop("tuned")
        entry["settings"]["handoff"] = dict(entry["settings"]["generated"])
        ref = entry["settings"]["generated"]["num_patches_per_iter"]
        entry["tune"] = {"largest": {"batch": entry["batch"]},
                         "handoff": {"batch": entry["batch"], "handoff": {"handed": ref, "line": f"-> hand over {ref}"}}}
    table = bench.table(report)
    for algo in report["algos"]:
        for variant in ("generated", "largest", "handoff"):
            assert f"| {algo} | {variant} |" in table
    assert "| handoff |" in table and "not run" in table  # the handoff variant has no run here
    verdicts = bench.verdicts(report).splitlines()[2:]
    assert len(verdicts) == len(report["algos"]) and all("-> hand over" in line for line in verdicts)
