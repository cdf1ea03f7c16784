"""``autotune calibrate``: refused in one line without a GPU, its options checked; the batch report's line when
a range stopped the search (what memory would hold)."""

from __future__ import annotations

import pytest

from autotune.cli import main


def test_calibrate_refuses_without_a_gpu_and_checks_its_points(capsys: pytest.CaptureFixture,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["calibrate"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA device is visible" in err and "--dry-run" in err
    for bad in ("--points=unet", "--points=vnet=1,2", "--points=unet=0", "--points=unet=a"):
        assert main(["calibrate", bad]) == 2
        assert "--points" in capsys.readouterr().err


def test_calibrate_refuses_points_it_would_not_use_before_anything(tmp_path, capsys: pytest.CaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.calibrate import calibrate
    from autotune.errors import SpecError

    users, work = tmp_path / "users", tmp_path / "work"
    users.mkdir()
    monkeypatch.setenv("AUTOTUNE_CALIBRATION_DIR", str(users))
    for args, said in ((["--points", "unet=2,2,2"], "give two or more distinct batch sizes"),
                       (["--templates", "unet", "--points", "dints=1,2"],
                        "dints is not among the templates calibrated (--templates unet)"),
                       (["--points", "unet=1,2", "--points", "unet=4,8"], "unet's batch sizes are given twice")):
        assert main(["calibrate", "--dry-run", "--work", str(work), *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err and "--points" in err, err
        assert not work.exists() and not any(users.iterdir())  # nothing made, nothing written
    # the library refuses the same, before its set is made
    with pytest.raises(SpecError, match="--points unet=3,3: one distinct batch size"):
        calibrate(dry_run=True, work_dir=work, templates=["unet"], n_values={"unet": (3, 3)})
    with pytest.raises(SpecError, match="dints is not among the templates calibrated"):
        calibrate(dry_run=True, work_dir=work, templates=["unet"], n_values={"dints": (1, 2)})
    assert not work.exists()


def test_the_report_says_what_memory_would_hold_past_the_range() -> None:
    from autotune.search.handoff import EXTEND_LIMIT, batch_report

    record = {"num_patches_per_iter": 20, "max_num_patches_per_iter": 20}
    top = batch_report(record, {"range": [1, 20], "template_range": [1, 20], "applied": False}, 37)
    assert top["reason"] == ("the top of the searched range [1, 20] stopped the search; memory would hold about 37 "
                             "(the estimator's N at the budget, not probed)")
    assert top["predicted_largest_fit"] == 37
    capped = batch_report({"num_patches_per_iter": 8, "max_num_patches_per_iter": 8},
                          {"range": [1, 8], "template_range": [1, 20], "applied": True, "train_cases": 80},
                          EXTEND_LIMIT)
    assert "the training-set cap 8 stops the range" in capped["reason"]
    assert f"memory would hold at least {EXTEND_LIMIT}" in capped["reason"]
    fits = batch_report({"num_patches_per_iter": 5, "max_num_patches_per_iter": 5},
                        {"range": [1, 20], "template_range": [1, 20]}, 5)
    assert fits["reason"] == "memory: 5 is the largest that fits the budget"


def test_the_estimators_fit_is_read_past_the_range_when_its_top_fits() -> None:
    from autotune.search.driver.key import predicted_fit
    from autotune.search.handoff import EXTEND_LIMIT

    class Line:
        cap = None

        def predict(self, n: int) -> float:
            return 100.0 * n

    cap = {"range": [1, 8], "template_range": [1, 20]}
    assert predicted_fit(Line(), cap, 1550) == 15  # inside the whole range: as before
    assert predicted_fit(Line(), cap, 3799) == 37  # the range's top fits: read past it
    assert predicted_fit(Line(), cap, 10**12) == EXTEND_LIMIT
