"""``EstimateProber`` answers a point whose raw estimate it already holds without another pass (training from
the replay curve, validation from a pass at the same sliding-window batch and place), with the result a new
pass gives; the search decides the same; a device model always runs the estimator."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any

import optuna
import pytest
from probe_fixtures import shared_tiny_bundles

import autotune.probe
from autotune.search.curves.probers import EstimateProber
from autotune.stages import tune

MARGIN = 0.10
# what differs between two passes at one point, or between a pass and an answer: the time each took
TIMES = ("seconds", "wall_seconds")


@pytest.fixture(scope="module")
def unet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_tiny_bundles(tmp_path_factory, algos=("unet",))["unet"]


@pytest.fixture()
def passes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """The phases of every estimator pass made while the test runs (plain and on-device)."""
    made: list[tuple[str, ...]] = []
    for name in ("estimate", "estimate_on_device"):
        real = getattr(autotune.probe, name)

        def counted(*args: Any, _real: Any = real, **kwargs: Any) -> dict[str, Any]:
            made.append(tuple(kwargs.get("phases", ())))
            return _real(*args, **kwargs)

        monkeypatch.setattr(autotune.probe, name, counted)
    return made


def _without_times(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k not in (*TIMES, "answered_by")}


def test_a_held_answer_is_the_result_a_new_pass_gives(unet: Path, passes: list) -> None:
    held = EstimateProber(unet, "cpu", 1 << 40, scale=1.25, offset=1000)
    fresh = EstimateProber(unet, "cpu", 1 << 40, scale=1.25, offset=1000, reuse_answers=False)
    curve, infer_raw = held.training_replay({"num_sw_batch_size": 2, "validation_device": "cpu"})
    assert curve is not None and infer_raw is not None and len(passes) == 1
    cases = [({"num_patches_per_iter": 3}, ("train",), "replay"),
             ({"num_patches_per_iter": 3, "num_sw_batch_size": 2, "validation_device": "cpu"}, ("infer",), "estimate")]
    for point, phases, source in cases:
        made = len(passes)
        answered = held.probe(point, phases)
        assert answered["answered_by"] == source and len(passes) == made  # no new pass
        assert answered["seconds"] < 1.0
        expected = fresh.probe(point, phases)
        assert "answered_by" not in expected
        assert _without_times(answered) == _without_times(expected)
    # a point never estimated runs the estimator, and its validation peak is held from then on
    other = {"num_patches_per_iter": 1, "num_sw_batch_size": 1, "validation_device": "device"}
    made = len(passes)
    assert "answered_by" not in held.probe(other, ("infer",)) and len(passes) == made + 1
    assert held.probe({**other, "num_patches_per_iter": 2}, ("infer",))["answered_by"] == "estimate"
    assert len(passes) == made + 1


def _tuned(bundle: Path, tmp_path: Path, name: str, limit: int) -> tuple[dict[str, Any], list[tuple]]:
    """Tune a copy of ``bundle`` with the estimate strategy; the result and every trial's point and peaks."""
    work = Path(shutil.copytree(bundle, tmp_path / name / "unet_0"))
    storage = f"sqlite:///{tmp_path / name / 'plan.db'}"
    result = tune([work], device="cpu", memory_limit=limit, storage=storage, strategy="estimate", margin=MARGIN,
                  progress=None)[0]
    trials = []
    for study in optuna.get_all_study_summaries(storage):
        for t in optuna.load_study(study_name=study.study_name, storage=storage).get_trials():
            if "point_id" not in t.user_attrs:  # the workers' own study: their heartbeats
                continue
            attrs = {k: t.user_attrs.get(k) for k in ("status", "verdict", "train_peak_bytes", "infer_peak_bytes",
                                                     "peak_bytes", "allowance_bytes", "phases")}
            trials.append((study.study_name, t.number, t.state.name, t.params, t.value, t.constraints, attrs))
    return result, trials


def test_the_search_decides_the_same_with_fewer_passes(unet: Path, tmp_path: Path, passes: list,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.probe.estimate import fit_memory_model

    model = fit_memory_model(unet, phase="train", device="cpu")
    limit = int((model.intercept + 3.5 * model.slope) / (1 - MARGIN))
    passes.clear()
    with monkeypatch.context() as off:
        off.setattr(EstimateProber, "__init__", functools.partialmethod(EstimateProber.__init__, reuse_answers=False))
        before, before_trials = _tuned(unet, tmp_path, "every_pass", limit)
    every = len(passes)
    passes.clear()
    after, after_trials = _tuned(unet, tmp_path, "held", limit)
    assert after["status"] == before["status"] == "tuned"
    tunables = ("num_patches_per_iter", "num_sw_batch_size", "validation_device")
    assert {k: after[k] for k in tunables} == {k: before[k] for k in tunables}
    assert after_trials == before_trials  # every trial's point, verdict and peaks, byte for byte
    assert len(after_trials) >= 2 and len(passes) < every, (len(passes), every)


def test_a_device_model_always_runs_the_estimator(unet: Path, passes: list) -> None:
    from autotune.probe import CudaAllowance

    allowance = CudaAllowance(workspace_factors={"unet": {"train": 4.0, "infer": 3.0}})
    prober = EstimateProber(unet, "cuda:0", 1 << 40, allowance=allowance)
    assert prober.factors() is not None
    curve, _ = prober.training_replay({"num_sw_batch_size": 2, "validation_device": "device"})
    assert curve is not None and len(prober.answers) == 2  # held, but not given while the device model applies
    made = len(passes)
    train = prober.probe({"num_patches_per_iter": 2}, ("train",))
    infer = prober.probe({"num_patches_per_iter": 2, "num_sw_batch_size": 2, "validation_device": "device"},
                         ("infer",))
    assert "answered_by" not in train and "answered_by" not in infer
    assert passes[made:] == [("train",), ("infer",)]
