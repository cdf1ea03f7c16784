"""The searcher with real probes on tiny bundles: write-back, folds sharing a study,
answers from storage, resume after a kill, BundleGen(gpu_customization=True), CLI errors."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import optuna
import pytest
from forked_cli import start_cli

from autotune import BundleGen
from autotune.bundles.config import load_bundle_config
from autotune.bundles.templates import load_overrides
from autotune.cli import main
from autotune.data.analyze import analyze
from autotune.stages import tune

MARGIN = 0.10
# an explicit range, searched as given: the demo set's training-set cap (2) would stop the search
# below the memory maximum these tests are about (tests/bundles/test_batch_scaling.py covers the cap)
SPECS = {"universal": {"range_num_images_per_batch": [1, 64]}}


@pytest.fixture(scope="module")
def work(demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("tune_work")
    res = analyze(demo_data, work, num_fold=2, progress=False)
    BundleGen(work, algos="unet", data_stats_filename=res.datastats, data_src_cfg_name=res.data_src).generate(
        work, num_fold=2, overrides=load_overrides("tiny")
    )
    return work


@pytest.fixture(scope="module")
def limit(work: Path) -> int:
    """A limit whose budget holds about three and a half patches' worth: the maximum is small."""
    from autotune.probe.estimate import fit_memory_model

    model = fit_memory_model(work / "unet_0", phase="train", device="cpu")
    return int((model.intercept + 3.5 * model.slope) / (1 - MARGIN))


@pytest.fixture(scope="module")
def tuned(work: Path, limit: int, tmp_path_factory: pytest.TempPathFactory) -> dict:
    storage = f"sqlite:///{tmp_path_factory.mktemp('studies') / 'tune.db'}"
    results = tune([work / "unet_0", work / "unet_1"], SPECS, device="cpu", memory_limit=limit,
                           storage=storage, margin=MARGIN, progress=None, summary_path=work / "summary.json")
    return {"results": results, "storage": storage}


def _trials(storage: str, study_name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=study_name, storage=storage).get_trials()


def test_tuned_values_are_the_measured_maximum(work: Path, limit: int, tuned: dict) -> None:
    first, second = tuned["results"]
    assert first["status"] == second["status"] == "tuned"
    n = first["max_num_patches_per_iter"]  # the hand-off may give training less (tests/search/test_handoff.py)
    assert first["num_patches_per_iter"] in (n, first["handoff"]["reference_batch"])
    budget = first["budget_bytes"]
    assert budget == int(limit * (1 - MARGIN))
    trials = _trials(tuned["storage"], first["study_name"])
    train = {t.params["num_patches_per_iter"]: t for t in trials
             if t.user_attrs.get("phases") == ["train"] and t.state == optuna.trial.TrialState.COMPLETE}
    # n was measured and fits the budget; n + 1 was measured and does not
    assert train[n].user_attrs["status"] == "ok" and train[n].user_attrs["peak_bytes"] <= budget
    assert n + 1 in train and train[n + 1].constraints["memory"] > 0
    assert first["probes"] <= 7, ("training: the prediction and one above; the reference batch for the hand-off; "
                                  "a few sliding-window points")
    assert len(train) <= 4, "at most 4 real training probes (one at the reference batch)"


def test_write_back_and_folds_share_one_search(work: Path, tuned: dict) -> None:
    first, second = tuned["results"]
    assert first["study_name"] == second["study_name"]
    for bundle in ("unet_0", "unet_1"):
        cfg = load_bundle_config(work / bundle)
        n = cfg.num_patches_per_iter
        assert n == first["num_patches_per_iter"]
        assert (cfg.num_images_per_batch * cfg.num_crops_per_image) % n == 0
        assert cfg.num_sw_batch_size == first["num_sw_batch_size"]
        assert cfg.sw_input_on_cpu is False
        block = cfg.plan
        assert block.method == "measured" and block.study_name == first["study_name"]
        assert block.memory_limit == first["memory_limit"] and block.margin == MARGIN
        assert block.peak_bytes <= block.budget_bytes
        assert block.storage == tuned["storage"]  # where the study lives (no password to hide here)
    assert (work / "summary.json").is_file()


def _dashboard_best(storage_url: str, study_name: str) -> optuna.trial.FrozenTrial:
    """The best trial as optuna-dashboard reads it: the storage's ``get_best_trial`` (constraints ignored)."""
    storage = optuna.storages.RDBStorage(storage_url)
    try:
        return storage.get_best_trial(storage.get_study_id_from_name(study_name))
    finally:
        storage.engine.dispose()


def test_dashboard_best_trials_are_the_bundle_values(work: Path, tuned: dict) -> None:
    """At a binding limit (a training point that does not fit is a trial), each study's best trial as the
    dashboard shows it is the tuned value written into the bundles: N in the training study, the sw batch and
    validation device in the inference study; neither study mixes patches with windows."""
    first = tuned["results"][0]
    assert first["infer_study_name"] != first["study_name"]
    train_trials = _trials(tuned["storage"], first["study_name"])
    infer_trials = _trials(tuned["storage"], first["infer_study_name"])
    assert {tuple(t.user_attrs.get("phases", [])) for t in train_trials} == {("train",)}
    assert {tuple(t.user_attrs.get("phases", [])) for t in infer_trials} == {("infer",)}
    non_fits = [t for t in train_trials if t.state == optuna.trial.TrialState.COMPLETE and t.constraints["memory"] > 0]
    assert non_fits, "the limit must bind: some training point does not fit"
    for t in non_fits:  # it keeps its measurement and can never be the best
        assert t.value == 0 and t.user_attrs["verdict"] == "does not fit" and t.user_attrs["peak_bytes"] > 0
    best_train = _dashboard_best(tuned["storage"], first["study_name"])
    best_infer = _dashboard_best(tuned["storage"], first["infer_study_name"])
    for bundle in ("unet_0", "unet_1"):
        cfg = load_bundle_config(work / bundle)
        # the training study answers the memory search (the largest fit); the goodput hand-off may give
        # training the template's batch instead, and says so in the tuning block (tests/search/test_handoff.py)
        plan = cfg.plan
        assert best_train.params["num_patches_per_iter"] == plan.max_num_patches_per_iter
        assert cfg.num_patches_per_iter in (plan.max_num_patches_per_iter, plan.handoff["reference_batch"])
        if cfg.num_patches_per_iter == best_train.params["num_patches_per_iter"]:
            assert best_train.number == plan.train_trial
        else:  # handed the reference batch: its own probe is the training trial, the verdict line says why
            assert plan.train_trial == plan.handoff["reference_trial"]
            assert "hand over" in plan.handoff["line"]
        assert best_infer.params["num_sw_batch_size"] == cfg.num_sw_batch_size
        assert best_infer.params["validation_device"] == plan.validation_device
        assert best_infer.number == plan.infer_trial
        assert plan.infer_study_name == first["infer_study_name"]
        assert plan.infer_trial in plan.infer_trials
    for best in (best_train, best_infer):
        assert best.user_attrs["verdict"] == "fits" and best.constraints["memory"] <= 0


def test_rerun_answers_from_storage_without_trials(work: Path, limit: int, tuned: dict) -> None:
    before = len(_trials(tuned["storage"], tuned["results"][0]["study_name"]))
    again = tune([work / "unet_0"], SPECS, device="cpu", memory_limit=limit, storage=tuned["storage"],
                         margin=MARGIN, progress=None)
    assert again[0]["from_storage"] is True and again[0]["probes"] == 0
    assert again[0]["num_patches_per_iter"] == tuned["results"][0]["num_patches_per_iter"]
    assert len(_trials(tuned["storage"], tuned["results"][0]["study_name"])) == before


def _kill_while_a_trial_runs(argv: list[str], storage: str, study_name: str, logs: Path) -> tuple[set[int], set[int]]:
    """Start the tuner (a forked ``autotune`` process), SIGKILL it while a trial is RUNNING after one has
    finished; the trials COMPLETE and RUNNING as the kill left them (read after it), or two empty sets
    when the tuner finished or ran between trials at the kill (the caller tries again)."""
    proc = start_cli(argv, logs.with_suffix(".out"), logs.with_suffix(".err"))
    deadline = time.time() + 240
    try:
        while time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
            try:
                trials = _trials(storage, study_name)
            except Exception:  # the database or the study is not there yet
                continue
            states = [t.state for t in trials]
            if optuna.trial.TrialState.COMPLETE in states and optuna.trial.TrialState.RUNNING in states:
                break
    finally:
        proc.kill()
    if proc.returncode != -signal.SIGKILL:
        return set(), set()
    trials = _trials(storage, study_name)
    return ({t.number for t in trials if t.state == optuna.trial.TrialState.COMPLETE},
            {t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING})


def test_kill_midway_then_resume(work: Path, limit: int, tuned: dict, tmp_path: Path) -> None:
    study_name = tuned["results"][0]["study_name"]
    for attempt in range(3):  # the kill can land between two trials; then try again on a fresh storage
        storage = f"sqlite:///{tmp_path / f'killed{attempt}.db'}"
        argv = ["tune", str(work / "unet_0"), "--device", "cpu", "--memory-limit", str(limit), "--storage", storage,
                "--quiet", "--range-num-images-per-batch", "1", "64"]
        done_before, running = _kill_while_a_trial_runs(argv, storage, study_name, tmp_path / f"killed{attempt}")
        if done_before and running:
            break
    assert done_before and running, "no kill landed while a trial ran after another had finished (3 tries)"
    resumed = tune([work / "unet_0"], SPECS, device="cpu", memory_limit=limit, storage=storage,
                           margin=MARGIN, progress=None, write_back=False)[0]
    trials = {t.number: t for t in _trials(storage, study_name)}
    for number in done_before:  # nothing finished was lost
        assert trials[number].state == optuna.trial.TrialState.COMPLETE
    for number in running:  # what the kill interrupted is failed as stale, with its reason
        assert trials[number].state == optuna.trial.TrialState.FAIL
        assert trials[number].user_attrs["fail_reason"].startswith("stale"), trials[number].user_attrs
    assert not any(t.state == optuna.trial.TrialState.RUNNING for t in trials.values())
    # the largest fit and the inference point, not the handed batch: the goodput hand-off weighs
    # throughputs measured in each run, which differ between two runs on a busy machine
    for key in ("max_num_patches_per_iter", "num_sw_batch_size", "sw_input_on_cpu"):
        assert resumed[key] == tuned["results"][0][key]


def test_bundlegen_gpu_customization(demo_data: Path, limit: int, tmp_path: Path) -> None:
    res = analyze(demo_data, tmp_path / "w", num_fold=2, progress=False)
    gen = BundleGen(tmp_path / "w", algos=["unet"], data_stats_filename=res.datastats, data_src_cfg_name=res.data_src)
    specs = {"universal": {"range_num_images_per_batch": [1, 2], "range_num_sw_batch_size": [1, 2]}}
    bundles = gen.generate(tmp_path / "w", num_fold=1, overrides=load_overrides("tiny"), gpu_customization=True,
                           gpu_customization_specs=specs, device="cpu", memory_limit=limit,
                           storage=f"sqlite:///{tmp_path / 's.db'}", progress=None)
    cfg = load_bundle_config(bundles[0]["path"])
    assert cfg.plan.status == "tuned"
    assert 1 <= cfg.num_patches_per_iter <= 2 and 1 <= cfg.num_sw_batch_size <= 2


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--range-num-images-per-batch", "8", "2"], "swap"),
        (["--range-num-sw-batch-size", "0", "4"], "from 1 to 65536"),
        (["--strategy", "grid"], "grid"),
        (["--memory-limit", "lots"], "lots"),
        (["--margin", "1.5"], "margin"),
        (["--validation-devices", "tpu"], "tpu"),
        (["--target-gpu", "a100-80gb"], "--strategy estimate"),
        (["--strategy", "estimate", "--target-gpu", "a100-81gb"], "a100-80gb"),
        (["--storage", "notaurl"], "notaurl"),
    ],
    ids=["min>max", "zero", "strategy", "limit", "margin", "valdev", "target-no-estimate", "unknown-gpu", "storage"],
)
def test_tune_bad_arguments_exit_2(work: Path, tmp_path: Path, capsys, extra: list[str], needle: str) -> None:
    storage = ["--storage", f"sqlite:///{tmp_path / 'x.db'}"] if "--storage" not in extra else []
    code = main(["tune", str(work / "unet_0"), "--quiet", *storage, *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err


def test_specs_file_unknown_key_is_named(work: Path, tmp_path: Path, capsys) -> None:
    specs = tmp_path / "specs.yaml"
    specs.write_text("universal:\n  num_trails: 5\n")
    code = main(["tune", str(work / "unet_0"), "--specs", str(specs), "--storage", f"sqlite:///{tmp_path / 'x.db'}"])
    err = capsys.readouterr().err
    assert code == 2 and "num_trails" in err and "num_trials" in err


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql+psycopg://autotune:s3cret@db.example:5432/studies",
     "postgresql+psycopg://autotune:***@db.example:5432/studies"),
    ("postgresql://autotune:p%40ss@127.0.0.1/studies", "postgresql://autotune:***@127.0.0.1/studies"),
    ("mysql+pymysql://u:pw@h/db?charset=utf8", "mysql+pymysql://u:***@h/db?charset=utf8"),
    ("sqlite:////tmp/studies.db", "sqlite:////tmp/studies.db"),
    ("postgresql://autotune@127.0.0.1/studies", "postgresql://autotune@127.0.0.1/studies"),
])
def test_redact_url_hides_only_the_password(url: str, shown: str) -> None:
    """What the bundle's tuning block and every message show of a storage URL."""
    from autotune.search.storage.study import redact_url

    assert redact_url(url) == shown
