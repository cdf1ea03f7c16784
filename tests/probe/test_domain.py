"""A calibration knows its domain: the fit is used inside it only, MONAI's template is not ours, the
estimate's terms add up, a fit worse out of sample than the raw estimator is not installed, old files still load."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from test_device_model import _point, _v2

from autotune.errors import ConfigError
from autotune.probe.allowances import CudaAllowance
from autotune.probe.domain import bundle_domain, domain_check, fit_domain, network_hash

MiB = 1 << 20
FACTORS = {"unet": {"train": 4.0, "infer": 3.0}, "dints": {"train": 2.0, "infer": 1.0}}


@pytest.fixture(scope="module")
def unet_cfg(tmp_path_factory: pytest.TempPathFactory):
    from probe_fixtures import shared_tiny_bundles

    from autotune.bundles.config import load_bundle_config

    return load_bundle_config(shared_tiny_bundles(tmp_path_factory)["unet"])


def _typed(domain: dict) -> dict:
    """A file's ``model.domain`` block, checked as a calibration's is."""
    return CudaAllowance(workspace_factors=FACTORS, domain=domain).fitted.domain


def test_a_bundle_is_inside_only_where_the_fit_measured_it(unet_cfg) -> None:
    own = bundle_domain(unet_cfg, "cuda:0")
    assert own.source == "autotune" and own.precision in ("fp16", "fp32") and len(own.network_hash) == 16
    assert own.network_hash == network_hash(unet_cfg.view["network"])  # the typed section hashes as the view did
    plain = fit_domain([(own, 1, 2), (own, 4, 8)])
    entry = plain["autotune:unet"]
    assert entry["n"] == [1, 4] and entry["roi_sizes"] == [list(own.roi_size)] and entry["phases"] == ["train", "infer"]
    domain = _typed(plain)
    assert domain_check(domain, FACTORS, own).inside
    other_patch = replace(own, roi_size=tuple(v * 2 for v in own.roi_size))
    check = domain_check(domain, FACTORS, other_patch)
    assert not check.inside and "patch" in check.why
    other_network = replace(own, network_hash="0" * 16)
    assert "network" in domain_check(domain, FACTORS, other_network).why
    other_precision = replace(own, precision="bf16" if own.precision != "bf16" else "fp32")
    assert not domain_check(domain, FACTORS, other_precision).inside
    # MONAI's template of the same name is another network: never held by our fit, nor by a name-only file
    monai = replace(own, source="monai")
    for fitted in (domain, None):
        check = domain_check(fitted, FACTORS, monai)
        assert not check.inside and "monai:unet is not among" in check.why
    assert domain_check(None, FACTORS, own).inside  # a version-2 file: autotune's own templates by name


def test_the_allowance_uses_the_fit_inside_and_the_allocator_outside(unet_cfg) -> None:
    own = bundle_domain(unet_cfg, "cuda:0")
    bounds = {"in_domain": {"max_over": 0.1, "max_under": -0.05, "by_template": {"unet": {"max_over": 0.02,
                                                                                          "max_under": -0.01}}},
              "out_of_domain": {"max_over": 0.0, "max_under": -0.5, "by_phase": {"train": {"max_under": -0.25}}}}
    allowance = CudaAllowance(workspace_factors=FACTORS, domain=fit_domain([(own, 1, 1)]), bounds=bounds)
    factors, check = allowance.factors_for(unet_cfg)
    assert check.inside and factors == FACTORS["unet"]
    assert allowance.bound_for(check, "unet")["max_over"] == 0.02  # the template's own out-of-sample bound
    moved = unet_cfg.with_values(roi_size=[v + 16 for v in unet_cfg.roi_size])
    factors, check = allowance.factors_for(moved)
    assert not check.inside and factors == {"train": 0.0, "infer": 0.0}
    assert allowance.factors_for(moved.as_view())[1] == check  # a probe request's view: checked into a config
    bound = allowance.bound_for(check, "unet")
    assert bound["situation"] == "out_of_domain" and bound["max_under"] == -0.5
    assert allowance.plan_scale(check, "unet", "train") == pytest.approx(1 / 0.75)  # its phase's own bound
    assert allowance.plan_scale(check, "unet", "infer") == pytest.approx(2.0)
    # an unknown template by name: no other template's factor (the largest over-predicted by up to 148%)
    assert allowance.factors("swinunetr") == {"train": 0.0, "infer": 0.0}
    assert CudaAllowance().factors_for(unet_cfg) == (None, None)  # version 1: no device model
    with pytest.raises(ConfigError, match=r"^allowances: key 'bounds\.in_domain\.max_under': got 0\.5"):
        CudaAllowance(workspace_factors=FACTORS, bounds={"in_domain": {"max_over": 0.1, "max_under": 0.5}})


def test_explain_adds_the_terms_up_to_the_estimate(tmp_path_factory: pytest.TempPathFactory,
                                                   capsys: pytest.CaptureFixture) -> None:
    from probe_fixtures import shared_tiny_bundles

    from autotune.cli import main
    from autotune.probe import estimate_on_device

    bundle = shared_tiny_bundles(tmp_path_factory)["unet"]
    results = [estimate_on_device(bundle, allowance, device="cuda:0", explain=True, num_patches_per_iter=2,
                                  num_sw_batch_size=2)
               for allowance in (CudaAllowance(workspace_factors=FACTORS), CudaAllowance())]  # device model, affine
    for result in results:
        for phase, terms in result["device_terms"].items():
            parts = sum(v for k, v in terms.items() if k != "reserved")
            assert parts == terms["reserved"] == result[f"{phase}_device_reserved_bytes"]
            assert terms["tensors"] == result[f"{phase}_peak_bytes"]
    simulated, affine = results
    assert affine["device_model"] == "affine"
    assert simulated["device_model_fit"] == "fitted" and simulated["device_terms"]["train"]["workspace"] > 0
    assert main(["estimate", str(bundle), "--device", "cuda:0", "--explain", "--num-patches-per-iter", "2"]) == 0
    out = capsys.readouterr().out
    assert "device model:" in out and "+ workspace" in out and "= reserved" in out and "context" in out


def test_a_fit_worse_out_of_sample_than_the_raw_estimator_is_not_installed(tmp_path: Path) -> None:
    from autotune.calibrate.fit import fit_model

    # each template's workspace factor jumps with the batch: a mean fits its own points, predicts the others badly
    jumping = [_point(1, 0.0, "a"), _point(2, 3.0, "a"), _point(1, 0.0, "b"), _point(3, 3.0, "b")]
    fit = fit_model(jumping, None, workers=1)
    fitted = max(abs(r["error"]) for r in fit["fitted"])
    verdict = fit["verdict"]
    assert not verdict["install"] and verdict["fit_error"] > verdict["raw_error"] and verdict["fit_error"] > fitted
    assert "not installed" in verdict["line"] and f"{100 * verdict['raw_error']:.1f}%" in verdict["line"]
    steady = fit_model([_point(1, 2.0, "a"), _point(2, 2.0, "a"), _point(1, 2.0, "b"), _point(3, 2.0, "b")], None,
                       workers=1)
    assert steady["verdict"]["install"]
    assert steady["bounds"]["out_of_domain"]["max_over"] == 0.0  # the allocator alone never over-predicts here
    assert steady["bounds"]["in_domain"]["by_template"]["a"]["points"] > 0
    single = fit_model([_point(1, 2.0, "a"), _point(1, 2.0, "b")], None, workers=1)
    assert not single["verdict"]["install"] and "two or more batch sizes" in single["verdict"]["line"]


def test_old_calibration_files_still_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unet_cfg: dict) -> None:
    from autotune.probe.allowances import allowance_for
    from autotune.probe.calibration import PACKAGE_DIR, stated_bound

    _v2(tmp_path, "NVIDIA X2", {"unet": {"train": 12.0, "infer": 8.0}})  # version 2: no domain, no bounds
    monkeypatch.setenv("AUTOTUNE_CALIBRATION_DIR", str(tmp_path))
    v2 = allowance_for("cuda:0", gpu_name="NVIDIA X2")
    factors, check = v2.factors_for(unet_cfg)
    assert check.inside and "records no domain" in check.why and factors == {"train": 12.0, "infer": 8.0}
    assert v2.bound_for(check, "unet") is None and stated_bound("NVIDIA X2")["bound"] == 0.1  # its stated one
    v1 = json.loads((tmp_path / "nvidia-x2.json").read_text())
    for key in ("model", "calibration_version"):
        v1.pop(key)
    (tmp_path / "nvidia-x2.json").write_text(json.dumps(v1))
    old = allowance_for("cuda:0", gpu_name="NVIDIA X2")
    assert old.workspace_factors is None and old.cudnn_workspace_bytes == 64 * MiB  # the affine allowance
    # the first GPU run's version-2 file, as it shipped before domains, reads as before
    shipped = tmp_path / "h200-v2"
    shipped.mkdir()
    shutil.copy(Path(__file__).with_name("calibration_h200_v2.json"), shipped / "nvidia-h200.json")
    monkeypatch.setenv("AUTOTUNE_CALIBRATION_DIR", str(shipped))
    legacy = allowance_for("cuda:0", gpu_name="NVIDIA H200")
    assert legacy.factors("dints") == {"train": 4.1335, "infer": 2.6947} and legacy.bounds is None
    monkeypatch.delenv("AUTOTUNE_CALIBRATION_DIR")
    now = json.loads((PACKAGE_DIR / "nvidia-h200.json").read_text())
    assert now["calibration_version"] == 3 and now["model"]["domain"] and now["model"]["bounds"]["out_of_domain"]


def _records(points: list, bundle: str) -> tuple[list, list]:
    """``measure_point``'s records and estimates for synthetic points (their peaks the model's own)."""
    records, estimates = [], []
    for p in points:
        phase = {ph: {"estimate_bytes": 1 << 20, "max_memory_allocated": p.reserved[ph],
                      "max_memory_reserved": p.reserved[ph], "tracked_peak_bytes": None, "nvml_used_bytes": None,
                      "reserved_now": None} for ph in ("train", "infer")}
        records.append({"algo": p.algo, "n": p.n, "m": p.m, "bundle": bundle, "probe": {"status": "ok"}, **phase})
        estimates.append({"train_events": p.train_events, "infer_events": p.infer_events,
                          "train_peak_bytes": 1 << 20, "infer_peak_bytes": 1 << 20})
    return records, estimates


def test_calibrate_keeps_a_refused_fit_out_of_the_users_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture,
                                                               tmp_path_factory: pytest.TempPathFactory) -> None:
    from probe_fixtures import shared_tiny_bundles

    import autotune.calibrate as calibrate_pkg
    from autotune.calibrate.run import _fit_and_write
    from autotune.cli import main

    bundle = str(shared_tiny_bundles(tmp_path_factory)["unet"])
    users = tmp_path / "users"
    users.mkdir()
    monkeypatch.setenv("AUTOTUNE_CALIBRATION_DIR", str(users))
    gpu = {"name": "NVIDIA X3", "torch_total_memory": 80 << 30, "total_memory": 80 << 30}
    jumping = [_point(1, 0.0, "a"), _point(2, 3.0, "a"), _point(1, 0.0, "b"), _point(3, 3.0, "b")]
    report = _fit_and_write(gpu, *_records(jumping, bundle), [], tmp_path / "work", None, False, None, False,
                            lambda line: None)
    assert not report["installed"] and "not installed" in report["refused"]
    assert not any(users.iterdir()) and Path(report["file"]).parent == tmp_path / "work" / "calibration"
    kept = json.loads(Path(report["file"]).read_text())
    assert kept["refused"] == report["refused"] and kept["model"]["domain"]["autotune:unet"]["n"] == [1, 2, 3]
    steady = [_point(1, 2.0, "a"), _point(2, 2.0, "a"), _point(1, 2.0, "b"), _point(3, 2.0, "b")]
    installed = _fit_and_write(gpu, *_records(steady, bundle), [], tmp_path / "work2", None, False, None, False,
                               lambda line: None)
    assert installed["installed"] and Path(installed["file"]).parent == users
    # the command: the refusal is one line with both figures, exit 1
    monkeypatch.setattr(calibrate_pkg, "calibrate", lambda **kwargs: report)
    assert main(["calibrate"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not installed" in err[0] and "%" in err[0] and str(report["file"]) in err[0]
