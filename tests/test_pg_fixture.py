"""The private PostgreSQL fixture works: Optuna's RDBStorage round-trips a study and a trial."""

from __future__ import annotations

import optuna
import pytest
import sqlalchemy
from pg_fixtures import pg_database_url, postgres_url  # noqa: F401

pytestmark = pytest.mark.postgres


def test_optuna_storage_round_trip(pg_database_url: str) -> None:  # noqa: F811
    """A study and a trial with user attributes written through RDBStorage are read back intact."""
    storage = optuna.storages.RDBStorage(pg_database_url)
    try:
        study = optuna.create_study(study_name="pg-fixture", storage=storage, direction="maximize")
        trial = study.ask({"num_patches_per_iter": optuna.distributions.IntDistribution(1, 8)})
        trial.set_user_attr("peak_bytes", 123_456)
        study.tell(trial, 4.5)

        loaded = optuna.load_study(study_name="pg-fixture", storage=storage)
        (frozen,) = loaded.get_trials(deepcopy=False)
        assert frozen.state == optuna.trial.TrialState.COMPLETE
        assert frozen.value == 4.5
        assert frozen.params == {"num_patches_per_iter": trial.params["num_patches_per_iter"]}
        assert frozen.user_attrs == {"peak_bytes": 123_456}
    finally:
        storage.remove_session()
        storage.engine.dispose()


def test_server_answers_and_listens_on_loopback_only(pg_database_url: str) -> None:  # noqa: F811
    """``SELECT version()`` answers, the database is the fresh one, and nothing listens beyond 127.0.0.1."""
    engine = sqlalchemy.create_engine(pg_database_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(sqlalchemy.text("SELECT version()")).scalar_one().startswith("PostgreSQL")
            assert conn.execute(sqlalchemy.text("SELECT current_database()")).scalar_one().startswith(
                "autotune_test_")
            assert conn.execute(sqlalchemy.text("SHOW listen_addresses")).scalar_one() == "127.0.0.1"
    finally:
        engine.dispose()
