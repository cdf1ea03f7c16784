"""Two plain ``autotune tune`` processes (no ``--worker``) started together on one storage and the same tuning keys
take the claims workers take: no point is probed twice, both exit 0 and both hand their bundles the same answer.
Fake probes (``AUTOTUNE_FAKE_PROBE``: a probe is a pause, its memory a linear model), on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import optuna
import pytest
from forked_cli import start_cli
from pg_fixtures import pg_database_url, postgres_url  # noqa: F401
from probe_fixtures import one_window_unet

from autotune.bundles.config import load_bundle_config, update_bundle_config
from autotune.bundles.model import BundleConfig
from autotune.search.storage.liveness import is_coordination_study

FAKE = "sleep=0.1,base=64MiB,patch=32MiB,window=16MiB"
ARGS = ["--device", "cpu", "--memory-limit", "300MiB", "--margin", "0.1", "--handoff", "largest",
        "--range-num-images-per-batch", "1", "8", "--range-num-sw-batch-size", "1", "4", "-q"]
KEYS = 2
States = optuna.trial.TrialState


def answer_of(config: BundleConfig) -> dict[str, Any]:
    """The tuned answer a bundle holds: its batch, sliding-window batch and where validation lives."""
    return {"num_patches_per_iter": config.num_patches_per_iter, "num_sw_batch_size": config.num_sw_batch_size,
            "sw_input_on_cpu": config.sw_input_on_cpu}


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two bundles that differ in their optimizer's weight decay: two tuning keys."""
    source = one_window_unet(tmp_path_factory, "plain_src")
    root = tmp_path_factory.mktemp("plain")
    optimizer = load_bundle_config(source).optimizer.as_dict()
    made = []
    for k in range(KEYS):
        made.append(Path(shutil.copytree(source, root / f"unet_{k}")))
        update_bundle_config(made[-1], {"optimizer": {**optimizer, "args": {
            **optimizer["args"], "weight_decay": 1.0e-5 * (k + 1)}}})
    return made


def _probed(url: str) -> Counter[tuple[str, str]]:
    """(study, point) of every point probed (a trial finished by a probe, not one reusing another's result)."""
    storage = optuna.storages.RDBStorage(url)
    try:
        found: Counter[tuple[str, str]] = Counter()
        for study in storage.get_all_studies():
            if is_coordination_study(study.study_name):
                continue
            for trial in storage.get_all_trials(storage.get_study_id_from_name(study.study_name), deepcopy=False):
                if trial.state == States.COMPLETE and "reused_trial" not in trial.user_attrs:
                    found[(study.study_name, str(trial.user_attrs.get("point_id")))] += 1
        return found
    finally:
        storage.engine.dispose()


def _two_plain_runs(bundles: list[Path], url: str, root: Path) -> None:
    env = {**os.environ, "AUTOTUNE_FAKE_PROBE": FAKE}
    runs = []
    for name in ("a", "b"):  # each run its own copies of the same bundles: the same keys
        copies = [str(shutil.copytree(b, root / name / b.name)) for b in bundles]
        runs.append(start_cli(["tune", *copies, "--storage", url, *ARGS], root / f"{name}.out", root / f"{name}.err",
                              env))
    for run in runs:
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err[-3000:]
    probed = _probed(url)
    assert len(probed) >= KEYS and max(probed.values()) == 1, f"a point probed twice: {probed}"
    answers = {name: [answer_of(load_bundle_config(root / name / b.name)) for b in bundles] for name in ("a", "b")}
    assert answers["a"] == answers["b"], answers
    assert all(answer["num_patches_per_iter"] == 6 for answer in answers["a"]), answers  # 64 + 6 x 32 MiB fits 270


def test_two_plain_runs_on_sqlite_probe_no_point_twice(bundles: list[Path], tmp_path: Path) -> None:
    _two_plain_runs(bundles, f"sqlite:///{tmp_path / 'studies.db'}", tmp_path)


@pytest.mark.postgres
def test_two_plain_runs_on_postgresql_probe_no_point_twice(bundles: list[Path], pg_database_url: str,  # noqa: F811
                                                          tmp_path: Path) -> None:
    _two_plain_runs(bundles, pg_database_url, tmp_path)
