"""The probe: a real trial in an isolated child, its statuses, the fault hook and the CLI."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from probe_fixtures import ALGOS, shared_tiny_bundles

from autotune.bundles.config import load_bundle_config
from autotune.cli import main
from autotune.errors import ConfigError, ProbeError
from autotune.probe.estimate import estimate
from autotune.probe.runner import run_probe

QUICK: dict[str, Any] = {"warmup_steps": 0, "measure_steps": 1, "num_patches_per_iter": 1, "num_sw_batch_size": 1,
                         "timeout": 240}
RESULT_KEYS = {
    "status", "phase_failed", "num_patches_per_iter", "num_sw_batch_size", "validation_device", "device",
    "device_name", "device_total_memory", "memory_limit", "train_peak_bytes", "infer_peak_bytes", "peak_bytes",
    "train_peak_rss_bytes", "infer_peak_rss_bytes", "step_seconds_median", "samples_per_s", "sw_seconds_per_volume",
    "roi_size", "infer_volume_shape", "amp", "precision", "torch_version", "monai_version", "error_type", "error_tail", "signal",
    "wall_seconds", "measured",
}


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return shared_tiny_bundles(tmp_path_factory)


@pytest.fixture(scope="module")
def probes(bundles: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """The slower probes, run side by side (run_probe is safe to call from threads): one ok probe of
    each template, one over a memory limit, a kill in a named phase and a hang. First used after the
    fault tests, so it also shows the calling process carries on."""
    # Configs with a one-window validation volume keep these quick; the estimate tests cover 8 windows. The
    # UNet's is given as plain data (a dict), the others as loaded configs: run_probe takes either.
    configs = {algo: load_bundle_config(bundles[algo]).with_values(infer_volume_shape=[32, 32, 32])
               for algo in ALGOS}
    unet = configs["unet"]
    unet_peak = estimate(unet.as_view(), phases=("train",), num_patches_per_iter=1)["train_peak_bytes"]
    jobs: dict[str, tuple[Any, dict[str, Any]]] = {
        "segresnet": (configs["segresnet"], QUICK),
        "dints": (configs["dints"], QUICK),
        "unet": (unet.as_view(), {**QUICK, "warmup_steps": 1}),  # two steps: the optimizer state is counted
        "oom": (bundles["unet"], {**QUICK, "memory_limit": unet_peak // 2}),
        "killed_in_infer": (bundles["unet"], {**QUICK, "phases": ("infer",),
                                              "env": {"AUTOTUNE_PROBE_FAULT": "sigkill@phase=infer"}}),
        "hang": (bundles["unet"], {**QUICK, "timeout": 3, "env": {"AUTOTUNE_PROBE_FAULT": "hang"}}),
        # an optimizer that blows the weights up (the largest learning rate a config may give, SGD with a
        # momentum of 1e30): the second step's loss is nan
        "diverged": (unet.with_values(learning_rate=1000.0, optimizer={
                         **unet.optimizer.as_dict(), "args": {**unet.optimizer.args, "momentum": 1e30}}),
                     {**QUICK, "warmup_steps": 1, "phases": ("train",), "precision": "fp32"}),
    }
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {name: pool.submit(run_probe, bundle, **kw) for name, (bundle, kw) in jobs.items()}
        results = {name: future.result() for name, future in futures.items()}
    results["unet_peak_estimate"] = {"train_peak_bytes": unet_peak}
    return results


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize(
    ("fault", "status", "signal", "error_type"),
    [
        ("oom", "oom", None, "OutOfMemoryError"),
        ("segfault", "killed", 11, "SIGSEGV"),
        ("sigkill", "killed", 9, "SIGKILL"),
        ("raise", "error", None, "ValueError"),
        # rules chosen by the trial's values: N=1 here, so the first rule does not fire
        ("segfault@num_patches_per_iter=3,raise@num_patches_per_iter=1", "error", None, "ValueError"),
    ],
)
def test_injected_faults(bundles: dict[str, Path], fault: str, status: str, signal: int | None,
                         error_type: str) -> None:
    result = run_probe(bundles["unet"], env={"AUTOTUNE_PROBE_FAULT": fault}, **QUICK)
    assert result["status"] == status
    assert result["signal"] == signal
    assert result["error_type"] == error_type
    assert result["phase_failed"] == "train"
    assert result["measured"] is True and result["wall_seconds"] > 0
    assert _group_gone(result["child_pid"])


@pytest.mark.parametrize("algo", ALGOS)
def test_probe_each_template_ok(probes: dict[str, dict[str, Any]], bundles: dict[str, Path], algo: str) -> None:
    result = probes[algo]
    assert result["status"] == "ok", result["error_tail"]
    assert RESULT_KEYS <= set(result)
    assert result["train_peak_bytes"] > 0 and result["infer_peak_bytes"] > 0
    assert result["peak_bytes"] == max(result["train_peak_bytes"], result["infer_peak_bytes"])
    # one measured step is one loader batch (images x crops patches), stepped through N at a time as training does
    crops = load_bundle_config(bundles[algo]).num_crops_per_image
    assert result["loader_batch_patches"] == math.lcm(result["num_patches_per_iter"], crops)
    assert result["samples_per_s"] == pytest.approx(result["loader_batch_patches"] / result["step_seconds_median"])
    assert result["infer_volume_shape"] == [32, 32, 32]
    assert result["sw_seconds_per_volume"] > 0
    assert result["measured"] is True and result["phase_failed"] is None and result["signal"] is None
    assert result["device"] == "cpu" and result["device_total_memory"] > 0 and result["torch_version"]
    assert result["roi_size"] == [32, 32, 32] and result["exit_code"] == 0
    assert _group_gone(result["child_pid"])


def test_memory_limit_below_peak_is_oom_and_stops_early(probes: dict[str, dict[str, Any]]) -> None:
    peak = probes["unet"]["train_peak_bytes"]
    assert peak == probes["unet_peak_estimate"]["train_peak_bytes"]  # the estimate is exact on CPU
    result = probes["oom"]
    limit = result["memory_limit"]
    assert result["status"] == "oom" and result["phase_failed"] == "train"
    assert result["error_type"] == "OutOfMemoryError" and result["exit_code"] == 3
    # stopped at the op that crossed the limit: no step finished, the infer phase never ran
    assert limit < result["train_peak_bytes"] < peak
    assert result["step_seconds_median"] is None and result["infer_peak_bytes"] is None


def test_hang_past_timeout_kills_the_process_group(probes: dict[str, dict[str, Any]]) -> None:
    result = probes["hang"]
    assert result["status"] == "timeout" and result["error_type"] == "Timeout"
    assert 3 <= result["wall_seconds"] < 60
    assert _group_gone(result["child_pid"])


def test_fault_in_a_named_phase(probes: dict[str, dict[str, Any]]) -> None:
    result = probes["killed_in_infer"]
    assert result["status"] == "killed" and result["signal"] == 9 and result["phase_failed"] == "infer"
    assert result["torch_version"]  # known from the child's state file, though it wrote no result


def test_a_probe_whose_loss_goes_nonfinite_is_not_a_fit(probes: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    import optuna

    from autotune.search.strategies.evaluate import Evaluator
    from autotune.search.strategies.outcome import distributions
    from autotune.search.strategies.space import AlgoSpec

    result = probes["diverged"]
    assert result["status"] == "nonfinite" and result["exit_code"] == 5 and result["phase_failed"] == "train"
    assert result["error_type"] == "NonFiniteLoss"
    assert result["error_tail"].startswith("the loss was nan at loader batch 2 of 2 (float32): the training steps diverged")
    assert result["train_peak_bytes"] > 0  # measured all the same

    class Diverging:  # the prober a search asks: every point answers with that result
        measured = True

        def probe(self, point: dict, phases: tuple) -> dict[str, Any]:
            return dict(result)

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'studies.db'}")
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    spec = AlgoSpec(patches_range=(1, 8), sw_range=(1, 8))
    evaluator = Evaluator(study, Diverging(), 2**30, distributions(spec, ("device",)), storage=storage)
    evaluation = evaluator.evaluate({"num_patches_per_iter": 1}, ("train",))
    assert evaluation.failed and not evaluation.feasible
    [trial] = study.get_trials()
    assert trial.state == optuna.trial.TrialState.FAIL and trial.user_attrs["status"] == "nonfinite"
    assert trial.user_attrs["fail_reason"].startswith("nonfinite: NonFiniteLoss the loss was nan")
    assert "verdict" not in trial.user_attrs


def test_bad_arguments(bundles: dict[str, Path], tmp_path: Path) -> None:
    bundle = bundles["unet"]
    with pytest.raises(ProbeError, match="num_patches_per_iter"):
        run_probe(bundle, num_patches_per_iter=0)
    with pytest.raises(ProbeError, match="device"):
        run_probe(bundle, device="gpu0")
    with pytest.raises(ProbeError, match="phase"):
        run_probe(bundle, phases=("train", "valid"))
    with pytest.raises(ProbeError, match="validation_device"):
        run_probe(bundle, validation_device="disk")
    with pytest.raises(ProbeError, match="timeout"):
        run_probe(bundle, timeout=0)
    with pytest.raises(ProbeError, match="unknown fault"):
        run_probe(bundle, env={"AUTOTUNE_PROBE_FAULT": "explode"})
    with pytest.raises(ConfigError):
        run_probe(tmp_path / "no_bundle")
    with pytest.raises(ConfigError):
        run_probe({"algo": "unet"})
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(ProbeError, match="no CUDA device"):
            run_probe(bundle, device="cuda:0")


def test_cli_exit_codes(bundles: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                        capsys: pytest.CaptureFixture[str]) -> None:
    bundle = str(bundles["unet"])
    monkeypatch.setenv("AUTOTUNE_PROBE_FAULT", "oom")
    assert main(["probe", bundle, "--device", "cpu", "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["status"] == "oom"
    monkeypatch.setenv("AUTOTUNE_PROBE_FAULT", "segfault")
    assert main(["probe", bundle, "--device", "cpu"]) == 1
    assert "killed" in capsys.readouterr().out
    monkeypatch.delenv("AUTOTUNE_PROBE_FAULT")
    assert main(["probe", bundle, "--device", "cpu", "--num-patches-per-iter", "0"]) == 2
    assert main(["estimate", bundle, "--device", "cpu", "--memory-limit", "64MiB", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["estimate"]["measured"] is False
    assert report["fits"]["train"]["max_fitting_raw"] >= 1


def test_cli_modules_do_not_import_torch() -> None:
    code = ("import sys, autotune.cli, autotune.commands.probe, autotune.probe; "
            "autotune.cli.build_parser(); "
            "sys.exit(1 if any(m == 'torch' or m == 'monai' for m in sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_estimate_report_is_the_library_side_of_the_cli(bundles: dict[str, Path],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """``autotune.estimate_report`` answers what ``autotune estimate`` prints: the largest N whose
    estimated training peak fits the limit (the next one does not)."""
    from autotune import estimate_report
    from autotune.probe import estimate

    bundle = bundles["unet"]
    limit = 64 * 2**20
    report = estimate_report(bundle, device="cpu", memory_limit="64MiB")
    n = report["fits"]["train"]["max_fitting_raw"]
    assert n >= 1 and report["allowance"] is None  # no allowance on the CPU
    at = estimate(bundle, num_patches_per_iter=n, device="cpu")["train_peak_bytes"]
    above = estimate(bundle, num_patches_per_iter=n + 1, device="cpu")["train_peak_bytes"]
    assert at <= limit < above
    assert main(["estimate", str(bundle), "--device", "cpu", "--memory-limit", "64MiB"]) == 0
    assert f"largest N within 64.00 MiB: {n} (raw)" in capsys.readouterr().out
