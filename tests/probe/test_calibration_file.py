"""A calibration file is parsed once into a typed ``Calibration``: the shipped files load and give what they
gave, a malformed user file is refused in one line naming the file and the key (never skipped, never used),
and no edit of any value of the shipped H200 file raises anything but that refusal."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.errors import ConfigError
from autotune.probe.allowances import allowance_for, allowance_from_record, default_allowance
from autotune.probe.calibration import PACKAGE_DIR, find_calibration, stated_bound
from autotune.probe.calibration_file import parse_calibration
from autotune.probe.domain import DomainCheck, Place, domain_check

H200 = PACKAGE_DIR / "nvidia-h200.json"
RAW = json.loads(H200.read_text())


def test_the_shipped_files_load_and_give_what_they_gave() -> None:
    cpu = find_calibration("cpu", dirs=[PACKAGE_DIR])
    assert cpu.version == 1 and cpu.model is None and len(cpu.points) == 72
    h200 = find_calibration("NVIDIA H200", dirs=[PACKAGE_DIR])
    assert h200.version == 3 and h200.path == H200
    # the allowance: the device model's context and factors, the version-1 slack and workspace, the domain and
    # bounds as the file holds them (what a plan records)
    model = RAW["model"]
    for allowance in (allowance_for("cuda:0", gpu_name="NVIDIA H200"), default_allowance()):
        assert allowance.context_bytes == model["context_bytes"] == 673185792
        assert allowance.cudnn_workspace_bytes == RAW["allowance"]["cudnn_workspace_bytes"]
        assert allowance.allocator_slack_fraction == RAW["allowance"]["allocator_slack_fraction"] == 0.7956
        assert allowance.workspace_factors == model["workspace"] and allowance.release_after_search is True
        assert allowance.domain == model["domain"] and allowance.bounds == model["bounds"]
        assert allowance.factors("unet") == {"train": 15.7695, "infer": 10.834}
        assert allowance.factors("swinunetr") == {"train": 0.0, "infer": 0.0}
    calibrated = allowance_for("cuda:0", gpu_name="NVIDIA H200")
    assert calibrated.source.startswith("calibration: nvidia-h200.json (NVIDIA H200; driver 580.159.04")
    # the bounds per situation, as read before they were typed
    entry = model["domain"]["autotune:segresnet"]
    inside = domain_check(calibrated.fitted.domain, calibrated.fitted.workspace_factors, Place(
        "segresnet", "autotune", entry["network_hash"], tuple(entry["roi_sizes"][0]),
        tuple(entry["infer_volume_shapes"][0]), "fp16"))
    assert inside.inside and inside.key == "autotune:segresnet"
    own = model["bounds"]["in_domain"]["by_template"]["segresnet"]
    found = calibrated.bound_for(inside, "segresnet")
    assert (found["situation"], found["max_over"], found["max_under"]) == ("in_domain", own["max_over"],
                                                                           own["max_under"])
    assert found["by_phase"] == own["by_phase"] and found["source"] == own["source"]
    assert calibrated.plan_scale(inside, "segresnet", "train") == 1 / (1 + own["by_phase"]["train"]["max_under"])
    outside = DomainCheck(False, None, "elsewhere")
    out = model["bounds"]["out_of_domain"]
    assert calibrated.bound_for(outside)["max_under"] == out["max_under"]
    assert calibrated.plan_scale(outside, None, "infer") == 1 / (1 + out["by_phase"]["infer"]["max_under"])
    # the stated bounds (the fast search's edge)
    assert stated_bound("NVIDIA H200", [PACKAGE_DIR], "dints")["bound"] == RAW["fit"]["by_template"]["dints"][
        "max_over_prediction"]
    assert stated_bound("NVIDIA H200", [PACKAGE_DIR])["bound"] == RAW["fit"]["max_over_prediction"]
    from autotune.probe import calibration_file, model_fit

    assert calibration_file.MAX_FACTOR == model_fit.MAX_FACTOR  # a factor the fit can give is one a file may hold
    # a plan records the allowance as plain data and reads the same one back
    from dataclasses import asdict

    again = allowance_from_record({"allowances": asdict(calibrated)}, "cuda:0")
    assert again == calibrated and again.bound_for(inside, "segresnet") == found


def _copy(folder: Path, edit: Any, text: str | None = None) -> Path:
    """A copy of the shipped H200 file in ``folder`` after ``edit(data)`` (or with ``text`` as its content)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = copy.deepcopy(RAW)
    edit(data)
    path = folder / "nvidia-h200.json"
    path.write_text(text if text is not None else json.dumps(data))
    return path


def _set(*keys: Any, value: Any) -> Any:
    def edit(data: Any) -> None:
        for key in keys[:-1]:
            data = data[key]
        data[keys[-1]] = value
    return edit


@pytest.mark.parametrize(("edit", "key", "said"), [
    (_set("model", "domain", "autotune:unet", value="unet"), "model.domain.autotune:unet", "must be a mapping"),
    (_set("model", "context_bytes", value=-5e9), "model.context_bytes", "got -5000000000.0"),
    (_set("calibration_version", value=99), "calibration_version", "reads versions 1 to 3"),
    (_set("model", "workspace", "unet", "train", value=float("nan")), "model.workspace.unet.train", "got nan"),
    (_set("allowance", "cudnn_workspace_bytes", value=2**60), "allowance.cudnn_workspace_bytes", "from 0 to"),
    (_set("model", "bounds", "in_domain", "max_under", value=0.5), "model.bounds.in_domain.max_under",
     "above -1 and at most 0"),
])
def test_a_malformed_user_calibration_is_refused_naming_the_file_and_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: Any, key: str, said: str) -> None:
    path = _copy(tmp_path / "user", edit)
    monkeypatch.setenv("AUTOTUNE_CALIBRATION_DIR", str(path.parent))
    for call in (lambda: allowance_for("cuda:0", gpu_name="NVIDIA H200"),
                 lambda: stated_bound("NVIDIA H200")):
        with pytest.raises(ConfigError) as caught:
            call()
        line = str(caught.value)
        assert "\n" not in line and line.startswith(f"{path}: key {key!r}") and said in line
        assert str(path.parent) in line  # what to do: fix it or move it out of that folder


def test_a_broken_file_for_another_gpu_is_passed_over_with_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture) -> None:
    path = _copy(tmp_path / "user", _set("gpu_name", value="NVIDIA A100 80GB"))
    bad = json.loads(path.read_text())
    bad["model"]["domain"]["autotune:unet"] = "unet"
    path.write_text(json.dumps(bad))
    monkeypatch.setenv("AUTOTUNE_CALIBRATION_DIR", str(path.parent))
    used = allowance_for("cuda:0", gpu_name="NVIDIA H200")
    assert used.source.startswith("calibration: nvidia-h200.json")  # the shipped one, this GPU's
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: {path}: key 'model.domain.autotune:unet'")
    assert "it names NVIDIA A100 80GB, not this device's NVIDIA H200: not used" in err[0]
    with pytest.raises(ConfigError, match="model.domain.autotune:unet"):  # the A100's own lookup refuses it
        allowance_for("cuda:0", gpu_name="NVIDIA A100 80GB")


def test_a_user_calibration_shadows_the_shipped_one_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture) -> None:
    path = _copy(tmp_path / "user", _set("model", "context_bytes", value=700 << 20))
    monkeypatch.setenv("AUTOTUNE_CALIBRATION_DIR", str(path.parent))
    used = allowance_for("cuda:0", gpu_name="NVIDIA H200")
    assert used.context_bytes == 700 << 20 and used.source.startswith(f"calibration: {path} (NVIDIA H200")
    err = capsys.readouterr().err
    assert f"note: calibration {H200} is not used: {path} comes first" in err


def test_a_plans_malformed_allowances_are_refused_in_one_line() -> None:
    record = {"allowances": {"context_bytes": -5, "cudnn_workspace_bytes": 0, "allocator_slack_fraction": 0.1}}
    with pytest.raises(ConfigError, match=r"^the plan's allowances \(tuning\.allowances\): key 'context_bytes'"):
        allowance_from_record(record, "cuda:0")
    record = {"allowances": {**RAW["allowance"], "domain": {"autotune:unet": "unet"}}}
    with pytest.raises(ConfigError, match=r"key 'domain\.autotune:unet': got 'unet'"):
        allowance_from_record(record, "cuda:0")


def test_the_tune_refuses_a_malformed_calibration_before_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture,
                                                                 tmp_path_factory: pytest.TempPathFactory) -> None:
    import shutil

    from probe_fixtures import shared_tiny_bundles

    from autotune.bundles.config import bundle_config_path
    from autotune.cli import main

    bundle = tmp_path / "unet_0"
    shutil.copytree(shared_tiny_bundles(tmp_path_factory)["unet"], bundle)
    before = bundle_config_path(bundle).read_bytes()
    path = _copy(tmp_path / "user", _set("model", "context_bytes", value=-5e9))
    monkeypatch.setenv("AUTOTUNE_CALIBRATION_DIR", str(path.parent))
    capsys.readouterr()
    code = main(["tune", str(bundle), "--strategy", "estimate", "--target-gpu", "h200", "--storage",
                 f"sqlite:///{tmp_path}/s.db"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"{path}: key 'model.context_bytes': got -5000000000.0" in err[0]
    assert bundle_config_path(bundle).read_bytes() == before and not (tmp_path / "s.db").exists()


# -- every value of the shipped H200 file, edited: a located refusal or a calibration that works


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in ``node`` (containers too): key paths from the top."""
    out = [prefix] if prefix else []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        out += _paths(value, (*prefix, key))
    return out


PATHS = _paths(RAW)
EDITS = ["x", "", True, None, [], {}, [1, 2], {"a": 1}, float("nan"), float("inf"), -float("inf"), -1, -1.5, -5e9,
         0, 0.5, 7, 1e30, -1e30, 2**62, 10**400 // 10**390]


def _shown(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _on_path(a: str, b: str) -> bool:
    """True when one key path is the other or lies under it."""
    short, long = sorted((a, b), key=len)
    return long == short or long.startswith(short + ".") or long.startswith(short + "[")


def _use(calibration: Any) -> None:
    """What a lookup does with an accepted calibration: its allowance, factors, domain checks and bounds."""
    from autotune.probe.allowances import _from_calibration

    allowance = _from_calibration(calibration, "calibration: test")
    fitted = allowance.fitted
    for template in ("unet", "segresnet", "dints", "other"):
        allowance.factors(template)
    for key, entry in ((fitted.domain or {}) if fitted else {}).items():
        for roi in entry.roi_sizes or [(1, 1, 1)]:
            place = Place(entry.template, entry.source, entry.network_hash, tuple(roi), None, entry.precision)
            check = domain_check(fitted.domain, fitted.workspace_factors, place)
            for phase in ("train", "infer"):
                scale = allowance.plan_scale(check, entry.template, phase)
                assert math.isfinite(scale) and scale >= 1.0, key


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PATHS), st.sampled_from(EDITS))
def test_any_edit_of_the_h200_file_is_refused_where_it_is_or_works(path: tuple, value: Any) -> None:
    data = copy.deepcopy(RAW)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    try:
        calibration = parse_calibration(json.loads(json.dumps(data)), "F.json")
    except ConfigError as exc:
        line = str(exc)
        assert "\n" not in line and line.startswith("F.json: ")
        named = re.search(r"key '([^']*)'", line)
        assert named is not None, line
        key = named.group(1)
        shown = _shown(path)
        # the key named is on the edited value's path: the value, a key above it (a whole triple, a bound's pair)
        # or below it (a key a mapping put in its place lacks); or the version the file's content contradicts
        assert _on_path(key, shown) or key in ("calibration_version", "model"), (line, shown)
        return
    _use(calibration)
