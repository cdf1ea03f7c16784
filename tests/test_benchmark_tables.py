"""BENCHMARKS.md agrees with benchmarks/results/*.json, and the benchmarks' load sampler samples."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import common

ROOT = Path(__file__).resolve().parents[1]


def _tables(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks.tables", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_benchmarks_md_tables_agree_with_the_json() -> None:
    proc = _tables("--check")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    # a table once drifted from its JSON: every marked one is generated now
    assert "plain-claims" in common.block_names(text)


def test_check_fails_on_a_retyped_number(tmp_path: Path) -> None:
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    block = common.read_block(text, "plain-claims")
    row = next(line for line in block.splitlines() if line.startswith("| with claims (now) |"))
    cells = row.split("|")
    cells[2] = f" {float(cells[2]) + 1.7:.3f} "  # retype the median wall of the run with claims
    retyped = "|".join(cells)
    edited = block.replace(row, retyped)
    assert edited != block
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(common.replace_block(text, "plain-claims", edited), encoding="utf-8")
    proc = _tables("--check", "--doc", str(doc))
    assert proc.returncode == 1
    assert "plain-claims" in proc.stderr
    assert "-" + retyped in proc.stdout  # the diff shows the retyped row
    # without --check the block is rewritten from the JSON, and then it agrees
    assert _tables("--doc", str(doc)).returncode == 0
    assert doc.read_text(encoding="utf-8") == text


def test_check_refuses_a_block_without_a_source(tmp_path: Path) -> None:
    doc = tmp_path / "BENCHMARKS.md"
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    doc.write_text(text + "\n<!-- table:nothing -->\n| a |\n<!-- /table:nothing -->\n", encoding="utf-8")
    proc = _tables("--check", "--doc", str(doc))
    assert proc.returncode == 2
    assert "nothing" in proc.stderr


def test_replace_block_keeps_the_text_around_it() -> None:
    text = "before\n<!-- table:x -->\nold\n<!-- /table:x -->\nafter\n"
    assert common.replace_block(text, "x", "new") == "before\n<!-- table:x -->\nnew\n<!-- /table:x -->\nafter\n"
    with pytest.raises(KeyError):
        common.replace_block(text, "y", "new")
    # a marker quoted in prose is not a block
    assert common.block_names("Tables between `<!-- table:NAME -->` markers\n" + text) == ["x"]


def test_load_sampler_samples_through_a_busy_interval() -> None:
    sampler = common.LoadSampler(interval_s=0.05)
    with sampler:
        end = time.monotonic() + 0.6
        while time.monotonic() < end:  # keep a core busy, as a measured run would
            sum(i * i for i in range(1000))
    summary = sampler.summary()
    # entry + exit give 2; the thread must add about one per 50 ms over 0.6 s
    assert summary["samples"] >= 6, summary
    assert summary["seconds"] >= 0.6
    assert summary["min"] <= summary["mean"] <= summary["max"]
    count = len(sampler.samples)
    time.sleep(0.2)
    assert len(sampler.samples) == count, "the sampler thread kept running after the run"


def test_load_sampler_summarises_what_it_read(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = itertools.count(1.0)
    monkeypatch.setattr(common.os, "getloadavg", lambda: (next(readings), 0.0, 0.0))
    with common.LoadSampler(interval_s=0.02) as sampler:
        time.sleep(0.3)
    summary = sampler.summary()
    n = summary["samples"]
    assert n >= 5
    assert sampler.samples == [float(i) for i in range(1, n + 1)]  # in order, none lost
    assert (summary["min"], summary["max"]) == (1.0, float(n))
    assert summary["mean"] == pytest.approx((n + 1) / 2, abs=0.01)


def test_write_json_is_atomic_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "r" / "out.json"
    common.write_json(path, {"a": [1, 2]})
    assert common.read_json(path) == {"a": [1, 2]}
    assert [p.name for p in path.parent.iterdir()] == ["out.json"]


def test_load_sampler_reports_the_cpu_time_stolen_over_the_run(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 0 50 800 0 0 0 50 0 0\ncpu0 50 0 25 400 0 0 0 25 0 0\n")
    monkeypatch.setattr(common, "PROC_STAT", stat)
    with common.LoadSampler(interval_s=0.02) as sampler:
        assert sampler.summary()["steal"] is None  # no tick passed yet
        stat.write_text("cpu  200 0 50 900 0 0 0 50 0 0\n")
        assert sampler.summary()["steal"] == 0.0  # 200 ticks, none stolen
        stat.write_text("cpu  400 0 100 1100 0 0 0 400 0 0\n")  # 1000 ticks more, 350 of them stolen
    assert sampler.summary()["steal"] == 0.35
    stat.write_text("cpu  900 0 100 1100 0 0 0 400 0 0\n")
    assert sampler.summary()["steal"] == 0.35, "read at the stop, not after"
    stat.write_text("not a stat file\n")
    assert common.steal_fraction(common.cpu_ticks(stat), common.cpu_ticks(stat)) is None
    assert common.cpu_ticks(tmp_path / "missing") is None


def test_time_to_dice_fixed_epochs_reach_the_trainer_and_its_table(tmp_path: Path) -> None:
    from benchmarks import bench_time_to_dice as ttd

    args = ttd._args(["--epochs", "12", "--budget", "900"])
    argv = ttd.command(tmp_path / "b", "fast", 900.0, args)
    assert argv[argv.index("--epochs") + 1] == "12" and argv[argv.index("--max-time") + 1] == "900s"
    assert "--epochs" not in ttd.command(tmp_path / "b", "fast", 900.0, ttd._args([]))
    run = {"curve": [[e, 10.0 * e, 0.5 + e / 100] for e in range(1, 9)], "epochs": 8, "best_dice": 0.58,
           "epoch_s": 10.0, "load_during_run": {"steal": 0.25}}
    table = ttd.epochs_table({"settings": {"label": "x"}, "results": {"fast": run}})
    assert "| Dice at epoch 2 | Dice at epoch 4 | Dice at epoch 6 | Dice at epoch 8 |" in table
    assert "| 0.520 | 0.540 | 0.560 | 0.580 | 0.580 | 10.0 | 25 % |" in table
