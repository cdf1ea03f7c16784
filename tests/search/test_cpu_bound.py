"""The CPU's shipped calibration states the estimator's measured error; the fast search then settles
N+1 from its estimate instead of a probe, and the answer is the one a probed edge gives."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from autotune import BundleGen
from autotune.bundles.templates import load_overrides
from autotune.data.analyze import analyze
from autotune.errors import ConfigError
from autotune.probe.calibration import PACKAGE_DIR, stated_bound
from autotune.stages import tune
from benchmarks.calibrate_cpu import bound_of, by_template

REPO = Path(__file__).resolve().parents[2]

MARGIN = 0.10
SPECS = {"universal": {"range_num_images_per_batch": [1, 64]}}
SHIPPED = PACKAGE_DIR / "cpu.json"


def test_the_shipped_cpu_calibration_is_a_measurement() -> None:
    record = json.loads(SHIPPED.read_text())
    points = record["points"]
    assert record["gpu_name"] == "cpu" and record["fit"]["points"] == len(points)
    # full-size templates, each in both phases and in fp32 at least: the claim covers what users tune
    full = {(p["algo"], p["phase"]) for p in points if p["preset"] == "full" and p["precision"] == "fp32"}
    assert full == {(a, ph) for a in ("segresnet", "dints", "unet") for ph in ("train", "infer")}
    assert all(p["measured_bytes"] > 0 and p["estimate_bytes"] > 0 for p in points)
    # the stated bound is what the points say, not a number typed in
    assert record["fit"]["max_over_prediction"] == pytest.approx(bound_of(points)["max_over_prediction"])
    stated = stated_bound("cpu")
    assert stated is not None and stated["calibration"] == "cpu.json" and stated["scope"] == "all templates"
    assert stated["bound"] == record["fit"]["max_over_prediction"]
    # each template's own bound is what its own points say; a template not measured gets the overall one
    assert record["fit"]["by_template"] == by_template(points)
    for algo in ("segresnet", "dints", "unet"):
        own = stated_bound("cpu", template=algo)
        assert own["scope"] == f"template {algo}"
        assert own["bound"] == pytest.approx(bound_of([p for p in points if p["algo"] == algo])["max_over_prediction"])
    assert stated_bound("cpu", template="my_net")["bound"] == record["fit"]["max_over_prediction"]


def test_a_template_bound_replaces_the_overall_one_only_for_that_template(tmp_path: Path) -> None:
    record = {"gpu_name": "cpu", "allowance": {"context_bytes": 0, "cudnn_workspace_bytes": 0,
                                               "allocator_slack_fraction": 0.0},
              "fit": {"max_over_prediction": 0.03, "by_template": {"unet": {"max_over_prediction": 0.0},
                                                                    "dints": {"max_over_prediction": "bad"}}}}
    (tmp_path / "cpu.json").write_text(json.dumps(record))
    with pytest.raises(ConfigError, match=r"cpu\.json: key 'fit\.by_template\.dints\.max_over_prediction'"):
        stated_bound("cpu", [tmp_path], template="unet")  # a malformed bound: the file is refused, never half-read
    record["fit"]["by_template"].pop("dints")
    (tmp_path / "cpu.json").write_text(json.dumps(record))
    assert stated_bound("cpu", [tmp_path], template="unet")["bound"] == 0.0
    assert stated_bound("cpu", [tmp_path], template="dints")["bound"] == 0.03  # none of its own: the overall bound
    assert stated_bound("cpu", [tmp_path], template="segresnet")["scope"] == "all templates"
    record["fit"] = {"by_template": {"unet": {"max_over_prediction": 0.0}}}  # no overall bound: none at all
    (tmp_path / "cpu.json").write_text(json.dumps(record))
    assert stated_bound("cpu", [tmp_path], template="unet") is None


def test_bound_of_reads_the_worst_over_prediction() -> None:
    points = [{"estimate_bytes": 103, "measured_bytes": 100}, {"estimate_bytes": 90, "measured_bytes": 100},
              {"estimate_bytes": 100, "measured_bytes": 100}]
    fit = bound_of(points)
    assert fit["max_over_prediction"] == pytest.approx(0.03) and fit["max_under_prediction"] == pytest.approx(0.10)
    assert bound_of([{"estimate_bytes": 99, "measured_bytes": 100}])["max_over_prediction"] == 0.0


@pytest.fixture(scope="module")
def bundle(demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("cpu_bound")
    res = analyze(demo_data, work, num_fold=1, progress=False)
    BundleGen(work, algos="unet", data_stats_filename=res.datastats, data_src_cfg_name=res.data_src).generate(
        work, num_fold=1, overrides=load_overrides("tiny"))
    return work / "unet_0"


def _tune(bundle: Path, limit: int, storage: str) -> dict:
    (result,) = tune([bundle], SPECS, device="cpu", memory_limit=limit, storage=storage, margin=MARGIN,
                             progress=None, handoff="largest")
    return result


def _train_probes(storage: str, study_name: str) -> dict[int, optuna.trial.FrozenTrial]:
    trials = optuna.load_study(study_name=study_name, storage=storage).get_trials()
    return {t.params["num_patches_per_iter"]: t for t in trials
            if t.user_attrs.get("kind") == "probe" and t.state == optuna.trial.TrialState.COMPLETE}


def test_bounded_edge_gives_the_probed_answer_with_one_probe_less(bundle: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.probe.estimate import fit_memory_model

    model = fit_memory_model(bundle, phase="train", device="cpu")
    limit = int((model.intercept + 3.5 * model.slope) / (1 - MARGIN))  # binds at about 3 patches

    import importlib

    module = importlib.import_module("autotune.probe")  # the search calls the estimator through the package
    calls: list[dict] = []
    real_estimate = module.estimate
    monkeypatch.setattr(module, "estimate", lambda *a, **k: calls.append(k) or real_estimate(*a, **k))

    monkeypatch.setenv("AUTOTUNE_PROBE_EDGE", "1")
    probed = _tune(bundle, limit, f"sqlite:///{tmp_path / 'probed.db'}")
    monkeypatch.delenv("AUTOTUNE_PROBE_EDGE")
    calls_probed, calls[:] = list(calls), []
    bounded = _tune(bundle, limit, f"sqlite:///{tmp_path / 'bounded.db'}")

    # estimator passes per key, counted where the estimator is called: at most three, and what the record says
    for record, made in ((probed, calls_probed), (bounded, calls)):
        assert 1 <= len(made) <= 3 and sum(record["estimator_passes"].values()) == len(made), (made, record)
    assert calls[0]["phases"] == ("train", "infer") and calls[0]["record"] is True  # one trace, sw top folded in

    n = probed["max_num_patches_per_iter"]
    assert probed["edge_check"]["train"]["how"] == "probed"
    assert bounded["max_num_patches_per_iter"] == n, "the bounded edge must give the probed answer"
    check = bounded["edge_check"]["train"]
    assert check["how"] == "bounded" and check["n"] == n + 1 and check["calibration"] == "cpu.json"
    assert check["scope"] == "template unet" and check["bound"] == stated_bound("cpu", template="unet")["bound"]

    probes = _train_probes(f"sqlite:///{tmp_path / 'bounded.db'}", bounded["study_name"])
    assert n in probes and probes[n].user_attrs["status"] == "ok", "N itself is always probed"
    assert n + 1 not in probes, "N+1 was settled by the bound, not probed"
    assert n + 1 in _train_probes(f"sqlite:///{tmp_path / 'probed.db'}", probed["study_name"])
    assert bounded["probes"] < probed["probes"]
