"""benchmarks/bench_workers.py: its workers' fake probes pass autotune's own check of the fake-probe setting
(byte sizes must be positive) and answer from the fitted models."""

from __future__ import annotations

import pytest

from benchmarks import bench_workers as bench


def test_the_workers_benchmark_answers_its_points_from_the_fitted_models(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.checks.environment import setting
    from autotune.search.curves import fake

    monkeypatch.setattr(fake.FakeProber, "probe", fake.FakeProber.probe)  # restored after the test
    monkeypatch.setenv(fake.FAKE_PROBE_ENV, "unset by the benchmark")  # restored after the test

    models = {"train": {"intercept": 100, "slope": 10}, "infer": {"intercept": 50, "slope": 20, "cap": 4}}
    bench._install_model_answers(models, crash_every=0)
    prober = fake.FakeProber(setting(fake.FAKE_PROBE_ENV), memory_limit=160, cfg={})  # what a worker's search makes

    fits = prober.probe({"num_patches_per_iter": 3, "num_sw_batch_size": 9}, ("train", "infer"))
    assert (fits["train_peak_bytes"], fits["infer_peak_bytes"], fits["status"]) == (130, 130, "ok")  # sw capped at 4
    assert prober.probe({"num_patches_per_iter": 7}, ("train",))["status"] == "oom"  # 170 bytes over 160
