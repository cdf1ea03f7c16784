"""The GPU check: section statuses from exit codes, the exit code, the JSON's fields, the install.

The quick tests drive the harness and the JSON assembly with canned outputs; the slow one
runs both calls' CPU dry runs end to end, side by side (minutes on a 2-core CPU)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import gpu_check, gpu_memory, gpu_runs, gpu_training
from benchmarks.gpu_gradnorm import simple_noise_scale
from benchmarks.gpu_harness import FAILED, OK, PARTIAL, SKIPPED, TIMEOUT_RC, Check, exit_code
from benchmarks.gpu_install import InstallError, install
from benchmarks.gpu_report import REQUIRED, missing_fields

ROOT = Path(__file__).resolve().parents[1]

PY = sys.executable


@pytest.fixture
def check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Check:
    monkeypatch.setenv("AUTOTUNE_GPU_CHECK_WORK", str(tmp_path / "work"))
    return Check("memory", tmp_path / "out", 600.0, True, "cpu", gpu_memory.DRY)


def test_a_failed_subprocess_fails_its_section_and_the_run(check: Check) -> None:
    check.section("fine", lambda r: check.run([PY, "-c", "pass"], "fine"))
    check.section("broken", lambda r: check.run([PY, "-c", "import sys; sys.exit(3)"], "broken"))
    sections = json.loads(check.json_path.read_text())["sections"]
    assert sections["fine"]["status"] == OK
    assert sections["broken"]["status"] == FAILED
    assert sections["broken"]["subprocesses"] == [{"log": "broken", "rc": 3, "seconds": pytest.approx(0, abs=30)}]
    assert sections["broken"]["failures"] == ["broken: rc 3"]
    assert exit_code(check.results) == 1
    assert "rc=3" in check.log_path.read_text()


def test_a_subprocess_killed_at_its_limit_fails_its_section(check: Check) -> None:
    record = check.section("slow", lambda r: check.run([PY, "-c", "import time; time.sleep(60)"], "slow", timeout=1))
    assert record["status"] == FAILED and record["subprocesses"][0]["rc"] == TIMEOUT_RC
    assert "killed at its time limit" in record["failures"][0]


def report_where(argv: list[str]) -> int:
    """A forked command's stand-in: where it runs and with what, then exit code 3 (or sleep, to be killed)."""
    if argv[:1] == ["sleep"]:
        import time

        time.sleep(120)
    print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "argv": argv,
                      "env": os.environ.get("CHECK_MARK")}))
    print("a line on stderr", file=sys.stderr)
    return 3


def test_a_dry_run_forks_its_commands_and_kills_them_at_their_limit(check: Check, monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    """A dry run's ``python -m MODULE`` of ``FORKED`` is a child of the fork server (not of this process), run in
    the repository with the asked environment and arguments; its exit code and output are a subprocess's."""
    from benchmarks import gpu_harness

    monkeypatch.setitem(gpu_harness.FORKED, "report_where", "test_gpu_check:report_where")
    monkeypatch.chdir(tmp_path)
    env = dict(check.env, CHECK_MARK="asked", PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), str(ROOT)]))
    record = check.section("forked", lambda r: check.run([PY, "-m", "report_where", "a", "b"], "forked", env=env))
    assert record["status"] == FAILED and record["subprocesses"][0]["rc"] == 3
    seen = json.loads(check.log_path.read_text().split("rc=3")[1].split("\n", 2)[1])
    assert seen["argv"] == ["a", "b"] and seen["cwd"] == str(ROOT) and seen["env"] == "asked"
    assert seen["ppid"] != os.getpid()  # forked from the server, not started by this process
    assert "a line on stderr" in check.log_path.read_text()
    record = check.section("killed", lambda r: check.run([PY, "-m", "report_where", "sleep"], "killed", timeout=1,
                                                        env=env))
    assert record["subprocesses"][0]["rc"] == TIMEOUT_RC and "killed at its time limit" in record["failures"][0]


def test_a_raising_section_fails_and_the_next_one_runs(check: Check) -> None:

    def boom(record: dict[str, Any]) -> None:
        raise RuntimeError("no probe")

    assert check.section("boom", boom)["status"] == FAILED
    assert check.section("after", lambda r: None)["status"] == OK
    assert "RuntimeError: no probe" in check.results["sections"]["boom"]["failures"][0]


def test_the_deadline_skips_or_cuts_and_the_exit_code_says_so(check: Check) -> None:
    assert check.section("cut", lambda r: check.cut(r, "deadline"))["status"] == PARTIAL
    assert check.section("late", lambda r: None, needs_s=1e6)["status"] == SKIPPED
    assert exit_code(check.results) == 3


def test_main_exits_1_when_a_section_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through main: one section's subprocess fails; its status is failed and the run exits 1."""
    def forced_failure(check: Check) -> None:
        check.section("ct_data", lambda r: check.run([PY, "-c", "import sys; sys.exit(5)"], "forced"))

    monkeypatch.setattr(gpu_memory, "run_memory", forced_failure)
    monkeypatch.setenv("AUTOTUNE_GPU_CHECK_WORK", str(tmp_path / "work"))
    out = tmp_path / "out"
    assert gpu_check.main(["memory", "--dry-run", "--out", str(out)]) == 1
    results = json.loads((out / "gpu_check_memory.json").read_text())
    assert results["sections"]["env"]["status"] == OK
    assert results["sections"]["ct_data"]["status"] == FAILED
    assert results["sections"]["ct_data"]["subprocesses"][0]["rc"] == 5
    assert "sections.calibrate.points[].algo" in results["missing_fields"]


def test_a_missing_dataset_is_an_error_before_anything_runs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert gpu_check.main(["training", "--out", str(out), "--hippocampus", str(tmp_path / "none")]) == 2
    assert "no dataset.json" in capsys.readouterr().err
    assert not out.exists()
    broken = tmp_path / "Task04"
    (broken / "imagesTr").mkdir(parents=True)
    (broken / "dataset.json").write_text(json.dumps({"training": [{"image": "./imagesTr/a.nii.gz",
                                                                    "label": "./labelsTr/a.nii.gz"}]}))
    assert gpu_check.main(["training", "--dry-run", "--out", str(out), "--hippocampus", str(broken)]) == 2
    assert "is listed but" in capsys.readouterr().err


def test_point_pairs_split_the_windows() -> None:
    from autotune.calibrate.points import point_pairs

    assert point_pairs((4, 1, 2), 16, (4, 2, 1)) == [(1, 4), (2, 8), (4, 16)]
    assert point_pairs((1,), 98, (4, 2, 1)) == [(1, 98)]
    assert point_pairs((1, 2, 3, 4), 10, (2, 1)) == [(1, 5), (2, 5), (3, 5), (4, 10)]


def test_contract_verdict() -> None:
    record = {"budget_bytes": 1000, "tuned_peak_bytes": 800, "train_peak_bytes": 900, "val_peak_bytes": 500,
              "num_patches_per_iter": 4}
    verdict = gpu_memory.contract_verdict(record, [{"samples": 4}])
    assert verdict["peak_bytes"] == 900 and verdict["within_budget"] is True and verdict["full_step_seen"]
    assert verdict["peak_over_budget"] == pytest.approx(0.9)
    assert verdict["peak_over_tuned_peak"] == pytest.approx(900 / 800)
    assert gpu_memory.contract_verdict(record, [{"samples": 2}])["full_step_seen"] is False


def _point(algo: str, n: int, est: int, allocated: int | None, reserved: int | None, tracked: int | None,
           status: str = "ok") -> dict[str, Any]:
    phase = {"estimate_bytes": est, "max_memory_allocated": allocated, "max_memory_reserved": reserved,
             "nvml_used_bytes": None if reserved is None else reserved + 600, "reserved_now": reserved,
             "tracked_peak_bytes": tracked}
    return {"algo": algo, "n": n, "m": n, "probe": {"status": status, "nvml_baseline_used_bytes": 100},
            "train": dict(phase), "infer": dict(phase)}


def test_calibration_rows_use_reserved_on_cuda_and_the_tracked_peak_on_the_cpu() -> None:
    from autotune.calibrate.points import calibration_rows
    from autotune.probe.calibration import fit_allowance

    cuda = [_point("unet", 1, 1000, 1010, 1200, None), _point("unet", 2, 2000, 2010, 2300, None),
            _point("dints", 1, 5000, 0, 0, None, status="oom")]
    rows = calibration_rows(cuda)
    assert [(r["n"], r["phase"], r["reserved_bytes"], r["context_bytes"]) for r in rows] == [
        (1, "train", 1200, 500), (1, "infer", 1200, 500), (2, "train", 2300, 500), (2, "infer", 2300, 500)]
    fit = fit_allowance(rows)
    assert all(r["estimate_bytes"] * (1 + fit["allocator_slack_fraction"]) + fit["cudnn_workspace_bytes"]
               >= r["reserved_bytes"] for r in rows)
    cpu = calibration_rows([_point("unet", 1, 1000, None, None, 1000)])
    assert cpu[0]["reserved_bytes"] == cpu[0]["allocated_bytes"] == 1000 and cpu[0]["context_bytes"] is None


def test_simple_noise_scale_recovers_a_known_noise_scale() -> None:
    g_sq, trace = 2.0, 30.0  # E|g_B|^2 = |G|^2 + tr(Sigma) / B, so B_simple = 15
    small = [g_sq + trace / 2] * 5
    big = [g_sq + trace / 6] * 3
    result = simple_noise_scale(small, 2, big, 6)
    assert result["g_sq"] == pytest.approx(g_sq) and result["trace_sigma"] == pytest.approx(trace)
    assert result["b_simple"] == pytest.approx(15.0)
    assert simple_noise_scale(small, 2, small, 2)["b_simple"] is None
    noisy = simple_noise_scale([1.0, 1.0], 2, [2.0], 6)  # the larger batch's norm is larger: no estimate
    assert noisy["b_simple"] is None and "not positive" in noisy["why"]


def test_the_gradient_hook_sees_unscaled_gradients(tmp_path: Path) -> None:
    import torch

    import autotune.step as step_module
    from benchmarks.gpu_gradnorm import install as install_hook

    steps: list[tuple[int, Any]] = []
    original = step_module.train_step
    uninstall = install_hook(steps)
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the weights stay, so both steps agree
        images, labels = torch.randn(4, 3), torch.randn(4, 2)
        loss_fn = torch.nn.functional.mse_loss
        step_module.train_step(model, loss_fn, optimizer, images, labels)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        step_module.train_step(model, loss_fn, optimizer, images, labels, None, scaler)
        expected = sum(float(p.grad.square().sum()) for p in model.parameters())
    finally:
        uninstall()
    assert step_module.train_step is original
    assert [b for b, _ in steps] == [4, 4]
    assert [float(sq) for _, sq in steps] == pytest.approx([expected, expected], rel=1e-5)
    optimizer.step()  # the hook is gone: nothing more is recorded
    assert len(steps) == 2


def _run(epochs: list[tuple[float, float | None, float]], patches: int = 2) -> dict[str, Any]:
    rows = [{"epoch": i + 1, "train_s": t, "samples_per_s": 10.0 * (i + 1), "mean_dice": d, "elapsed_s": e,
             "train_peak_bytes": 100 + i, "steps": 5} for i, (t, d, e) in enumerate(epochs)]
    return {**gpu_runs.run_summary(rows, {"best_metric": 0.5}), "num_patches_per_iter": patches}


def test_run_summary_and_dice_per_wall() -> None:
    reference = _run([(10.0, 0.2, 12.0), (10.0, 0.4, 24.0), (10.0, 0.5, 36.0)])
    assert reference["samples_per_s_median"] == 25.0  # epochs 2 and 3 (the first warms up)
    assert reference["train_peak_bytes"] == 102 and reference["first_epoch_train_peak_bytes"] == 100
    assert reference["mean_dice_last"] == 0.5
    large = _run([(6.0, 0.3, 8.0), (6.0, 0.6, 16.0)], patches=4)
    result = gpu_training.dice_per_wall({"reference": reference, "largest": large})
    assert result["common_wall_s"] == 16.0
    assert result["dice_at_common_wall"] == {"reference": 0.2, "largest": 0.6}
    assert result["winner"] == "largest"
    assert result["curves"]["largest"][1]["train_s_cum"] == 12.0


def test_call_b_compares_each_compiled_run_with_its_eager_run(tmp_path: Path) -> None:
    import yaml

    bundle = tmp_path / "unet_0"
    (bundle / "configs").mkdir(parents=True)
    (bundle / "configs" / "hyper_parameters.yaml").write_text(yaml.safe_dump({"seed": 0, "fast_training": {"cache": True}}))
    copy = gpu_training.compiled_copy(bundle)
    assert yaml.safe_load((copy / "configs" / "hyper_parameters.yaml").read_text())["fast_training"] == {
        "cache": True, "compile": True}
    assert "compile" not in (bundle / "configs" / "hyper_parameters.yaml").read_text()
    summary = {"setup_s": 9.0, "techniques": {"compile": {"used": True, "reason": "fast_training.compile: true",
                                                          "first_call_s": 40.0}}}
    compiled = {**gpu_runs.run_summary([], summary), "time_to_target_s": 30.0, "samples_per_s_median": 60.0}
    eager = {**gpu_runs.run_summary([], {"setup_s": 8.0}), "time_to_target_s": 20.0, "samples_per_s_median": 40.0}
    effect = gpu_training.compile_effect(compiled, eager)
    assert effect["used"] and effect["first_call_s"] == 40.0 and effect["setup_s"] == 9.0
    assert effect["time_to_target_over_eager"] == 1.5 and effect["samples_per_s_over_eager"] == 1.5
    assert gpu_training.compile_effect({**compiled, "time_to_target_s": None}, eager)["time_to_target_over_eager"] is None


def test_missing_fields_reads_lists_and_mappings() -> None:
    results = {"a": {"b": [{"c": None}, {"c": 1}], "d": {"x": {"e": 0}, "y": {"e": 1}}}}
    REQUIRED["_test"] = ["a.b[].c", "a.d.*.e", "a.f", "a.g[]"]
    try:
        assert missing_fields(results, "_test") == ["a.f", "a.g[]"]
        results["a"]["b"] = []
        assert "a.b[].c" in missing_fields(results, "_test")
    finally:
        del REQUIRED["_test"]


def test_only_a_dry_runs_section_without_its_material_owes_no_fields() -> None:
    monai = [f for f in REQUIRED["memory"] if f.startswith("sections.monai_dints.")]
    results: dict[str, Any] = {"dry_run": True, "sections": {"monai_dints": {"status": OK, "not_at_hand": "no templates"}}}
    assert monai and not set(monai) & set(missing_fields(results, "memory"))
    results["dry_run"] = False  # on a GPU the material must be there: every field is owed
    assert set(monai) <= set(missing_fields(results, "memory"))


def _result_folder(folder: Path, call: str, gpu: str, dry_run: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"gpu_check_{call}.json").write_text(json.dumps({"call": call, "dry_run": dry_run, "gpu": {"name": gpu},
                                                               "sections": {}}))


def test_install_merges_the_calls_and_copies_the_calibration(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _result_folder(a, "memory", "NVIDIA H100 80GB HBM3")
    _result_folder(b, "training", "NVIDIA H100 80GB HBM3")
    (a / "calibration").mkdir()
    (a / "calibration" / "nvidia-h100-80gb-hbm3.json").write_text('{"gpu_name": "NVIDIA H100 80GB HBM3"}')
    written = install(a, b, tmp_path / "results", tmp_path / "calibrations", redo_estimates=False)
    merged = json.loads(written["results"].read_text())
    assert written["results"].name == "gpu_check_nvidia-h100-80gb-hbm3.json"
    assert merged["memory"]["call"] == "memory" and merged["training"]["call"] == "training"
    assert (tmp_path / "calibrations" / "nvidia-h100-80gb-hbm3.json").is_file()
    _result_folder(b, "training", "NVIDIA H200")
    with pytest.raises(InstallError, match="install each GPU's results on their own"):
        install(a, b, tmp_path / "results", tmp_path / "calibrations", redo_estimates=False)
    _result_folder(a, "memory", "cpu", dry_run=True)
    with pytest.raises(InstallError, match="dry run"):
        install(a, None, tmp_path / "results", tmp_path / "calibrations", redo_estimates=False)


def _dry_runs(tmp_path: Path, calls: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Each call's CPU dry run as its own process, all at once (each runs one torch thread, so two calls
    use both cores of a 2-core machine); each call's JSON, once all have finished and passed."""
    import subprocess

    procs = {}
    for call in calls:
        env = dict(os.environ, AUTOTUNE_GPU_CHECK_WORK=str(tmp_path / call / "work"), OMP_NUM_THREADS="1")
        procs[call] = subprocess.Popen([PY, "-m", "benchmarks.gpu_check", call, "--out",
                                        str(tmp_path / call / "out"), "--dry-run", "--deadline", "1500"],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    outputs = {}
    try:
        for call, proc in procs.items():
            outputs[call] = proc.communicate(timeout=1800)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = {}
    for call, proc in procs.items():
        out = tmp_path / call / "out"
        stdout, stderr = outputs[call]
        assert proc.returncode == 0, f"{call}: " + stdout[-3000:] + stderr[-3000:]
        results[call] = json.loads((out / f"gpu_check_{call}.json").read_text())
        assert results[call]["missing_fields"] == [] and missing_fields(results[call], call) == []
        assert {name: s["status"] for name, s in results[call]["sections"].items() if s["status"] != OK} == {}
        assert (out / f"gpu_check_{call}_logs.txt").is_file()
    return results


@pytest.mark.slow
def test_both_dry_runs_hold_every_field(tmp_path: Path) -> None:
    results = _dry_runs(tmp_path, ("memory", "training"))

    sections = results["memory"]["sections"]
    points = sections["calibrate"]["points"]
    assert {p["algo"] for p in points} == {"segresnet"}
    for p in points:  # on the CPU probe and estimate share one tracker: this checks the fake pass
        assert p["train"]["estimate_bytes"] == p["train"]["tracked_peak_bytes"]
        assert p["infer"]["estimate_bytes"] == p["infer"]["tracked_peak_bytes"]
        assert p["train"]["max_memory_allocated"] is None  # a GPU's figure: null on the CPU
    assert Path(sections["calibrate"]["file"]).is_file() and sections["calibrate"]["before"]["rows"]
    assert sections["plan"]["method"] == "estimated" and sections["plan"]["num_patches_per_iter"] >= 1
    contract = sections["contract"]
    assert contract["within_budget"] is True and contract["full_step_seen"] is True
    monai = sections["monai_dints"]
    if any((t / "dints" / "scripts" / "algo.py").is_file() for t in (ROOT / ".gpu_data" / "monai" / "algorithm_templates",
                                                                    ROOT.parent / "shared" / "monai" / "algorithm_templates")):
        assert monai["points"][0]["train_peak_bytes"] == monai["points"][0]["estimate_train_bytes"]  # one tracker
        assert monai["largest_n_that_trains"] == monai["predicted_largest_n"] == 1
    else:  # MONAI's templates are test material outside the repository: the section says it did not run
        assert "neither in .gpu_data/monai nor ../shared/monai" in monai["not_at_hand"] and "points" not in monai
    assert sections["expandable"]["points"][0]["child_alloc_conf"] == "expandable_segments:True"

    sections = results["training"]["sections"]
    ttd = sections["time_to_dice"]
    assert all(run["rc"] == 0 for run in ttd["runs"].values()) and ttd["concurrent"] == 8
    for name, label in (("fp16", "unet_fast_compiled"), ("bf16", "unet_fast_bf16_compiled")):
        # compiled against eager: on the CPU it compiles, or says in one line why not
        assert ttd["compile"][name]["used"] or "torch.compile" in ttd["compile"][name]["reason"]
        assert ttd["runs"][label]["setup_s"] > 0 and ttd["runs"][label]["compile"]["asked"]
    assert ttd["runs"]["unet_fast"]["schedule"]["set_by"] == "max_time"
    assert ttd["runs"]["unet_fast"]["phases_mean_s"]["compute_s"] > 0
    handoff = sections["handoff"]
    assert handoff["largest_fit"] == 3 and handoff["runs"]["largest"]["num_patches_per_iter"] == 3
    assert {b for b, _ in handoff["grad_sq_norms"]["largest"]["steps"]} >= {3}
    assert sections["ddp"]["world_size"] == 1
    oom = sections["oom_recovery"]  # narrowed to 0.6 x the reference's peak, the run completes by stepping down
    assert oom["completed"] is True and oom["micro_batches"] > 1 and oom["memory_fallbacks"]
