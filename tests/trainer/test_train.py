"""The training runner on CPU: outputs, regular mode, resume (also after a real kill), early stop, errors."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from forked_cli import start_cli

from autotune.errors import ConfigError, SpecError


def _rows(bundle: Path) -> list[dict]:
    return json.loads((bundle / "model_fold0" / "metrics.json").read_text())["rows"]


def _adam_steps(path: Path) -> int:
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True)
    return int(next(iter(state["optimizer"]["state"].values()))["step"])


def test_fast_training_writes_every_output(bundle: Path) -> None:
    import torch

    from autotune.trainer.runner import train

    summary = train(bundle, epochs=2, progress=False)
    out = bundle / "model_fold0"
    assert summary["epochs_run"] == 2 and summary["stopped"] == "epochs"
    assert summary["best_metric"] is not None and 0.0 <= summary["best_metric"] <= 1.0
    for name in ("best.pt", "last.pt"):
        state = torch.load(out / name, map_location="cpu", weights_only=True)
        assert {"model", "optimizer", "scheduler", "epoch", "best_metric", "rng"} <= set(state)
    assert torch.load(out / "last.pt", weights_only=True)["epoch"] == 2
    with open(out / "metrics.csv", newline="") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
    for column in ("epoch", "loss", "dice_class1", "dice_class2", "mean_dice", "epoch_s", "data_wait_s",
                   "data_wait_share", "samples_per_s", "lr"):
        assert column in reader.fieldnames
    assert [r["epoch"] for r in rows] == ["1", "2"]
    record = json.loads((out / "metrics.json").read_text())
    assert record["mode"] == "fast" and record["options"]["cache"] and record["options"]["thread_loader"]
    assert record["options"]["amp"] and record["rows"][-1]["samples"] > 0
    assert (out / "curves.png").stat().st_size > 1000
    assert json.loads((out / "train_summary.json").read_text())["last_epoch"] == 2


def test_regular_mode_is_the_seed_baseline(bundle: Path) -> None:
    import torch

    from autotune.bundles.config import update_bundle_config
    from autotune.trainer.runner import train

    update_bundle_config(bundle, {"num_workers": 2})
    summary = train(bundle, mode="regular", epochs=1, progress=False)
    out = bundle / "model_fold0"
    record = json.loads((out / "metrics.json").read_text())
    assert summary["mode"] == "regular" and record["options"]["num_workers"] == 2
    assert not record["options"]["cache"] and not record["options"]["amp"]
    state = torch.load(out / "last.pt", map_location="cpu", weights_only=True)
    assert state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(1e-4)
    assert state["scheduler"] is None and (out / "curves.png").is_file()


def test_resume_continues_epochs_and_optimizer_state(bundle: Path) -> None:
    from autotune.trainer.runner import train

    train(bundle, epochs=1, progress=False)
    last = bundle / "model_fold0" / "last.pt"
    steps_one_epoch = _adam_steps(last)
    assert steps_one_epoch > 0
    summary = train(bundle, epochs=3, resume=True, progress=False)
    assert summary["first_epoch"] == 2 and summary["last_epoch"] == 3
    assert [r["epoch"] for r in _rows(bundle)] == [1, 2, 3]
    assert _adam_steps(last) == 3 * steps_one_epoch  # the optimizer went on counting from epoch 1
    # Nothing left to do: resuming a finished run trains no more epochs.
    assert train(bundle, epochs=3, resume=True, progress=False)["epochs_run"] == 0


def test_resume_after_a_real_kill(bundle: Path) -> None:
    import torch

    from autotune.trainer.runner import train

    last = bundle / "model_fold0" / "last.pt"
    # python -m autotune.trainer, forked with torch imported (forked_cli)
    child = start_cli([str(bundle), "--epochs", "200", "--device", "cpu", "-q"], bundle.parent / "child.out",
                      bundle.parent / "child.err", target="autotune.trainer.__main__:main")
    try:
        deadline = time.monotonic() + 240
        while not last.is_file() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
        assert last.is_file(), "the child never wrote a checkpoint"
    finally:
        child.kill()
    epoch = int(torch.load(last, map_location="cpu", weights_only=True)["epoch"])  # a whole file, never torn
    summary = train(bundle, epochs=epoch + 1, resume=True, progress=False)
    assert summary["first_epoch"] == epoch + 1 and summary["last_epoch"] == epoch + 1
    assert [r["epoch"] for r in _rows(bundle)][-1] == epoch + 1


def test_early_stop_when_the_metric_stalls(bundle: Path) -> None:
    from autotune.bundles.config import update_bundle_config
    from autotune.trainer.runner import train

    # A learning rate too small to change any weight: the Dice cannot improve.
    update_bundle_config(bundle, {"learning_rate": 1e-30, "early_stop_patience": 1, "lr_scheduler": {"name": "none"}})
    summary = train(bundle, epochs=6, val_every=1, progress=False)
    assert summary["stopped"] == "early_stop" and summary["last_epoch"] == 2 and summary["best_epoch"] == 1


def test_max_time_stops_after_the_first_epoch(bundle: Path) -> None:
    from autotune.trainer.runner import train

    summary = train(bundle, epochs=50, max_time=0.01, val_every=10, progress=False)
    assert summary["stopped"] == "max_time" and summary["last_epoch"] == 1
    assert _rows(bundle)[0]["mean_dice"] is not None  # validated before stopping


def test_persistent_cache_on_disk(bundle: Path) -> None:
    from autotune.bundles.config import update_bundle_config
    from autotune.trainer.runner import train

    # fast_training.cache_dir (relative: from the bundle folder) instead of BUNDLE/cache
    update_bundle_config(bundle, {"persistent_cache": True, "fast_training": {"cache_dir": "disk_cache"}})
    train(bundle, epochs=1, progress=False)
    record = json.loads((bundle / "model_fold0" / "metrics.json").read_text())
    assert record["options"]["persistent"] and record["options"]["cache_dir"] == str(bundle / "disk_cache")
    assert list((bundle / "disk_cache" / "train").glob("*.pt")) and not (bundle / "cache").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["train", "{missing}"], "no such bundle"),
        (["train", "{bundle}", "--max-time", "soon"], "not a duration"),
        (["train", "{bundle}", "--epochs", "0"], "--epochs"),
        (["train", "{bundle}", "--nproc", "0"], "--nproc"),
        (["train", "{bundle}", "--device", "tpu"], "--device"),
        (["infer", "{bundle}", "--images", "{missing}", "--output", "{missing}"], "not found"),
    ],
)
def test_bad_inputs_exit_2_with_one_line(bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         args: list[str], needle: str) -> None:
    from autotune.cli import main

    argv = [a.format(bundle=bundle, missing=tmp_path / "missing") for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err


def test_parse_duration() -> None:
    from autotune.trainer.runner import parse_duration

    assert parse_duration("90s") == 90 and parse_duration("30m") == 1800 and parse_duration("2h") == 7200
    assert parse_duration("45") == 45 and parse_duration(1.5) == 1.5 and parse_duration("1.5h") == 5400
    for bad in ("", "soon", "-5m", "0", "10x"):
        with pytest.raises(SpecError):
            parse_duration(bad)


def test_single_fold_holds_out_a_seeded_fifth(bundles: dict[str, Path], tmp_path: Path) -> None:
    from autotune.bundles.config import load_bundle_config
    from autotune.data.split import split_datalist

    datalist = tmp_path / "datalist.json"
    datalist.write_text(json.dumps({"training": [{"image": f"{i}.nii.gz", "label": f"{i}l.nii.gz", "fold": 0}
                                                 for i in range(10)]}))
    config = load_bundle_config(bundles["segresnet_0"]).with_values(datalist=str(datalist), fold=0, num_fold=1,
                                                                     seed=3)
    train_cases, val_cases, note = split_datalist(config)
    assert len(val_cases) == 2 and len(train_cases) == 8 and "20%" in note
    assert split_datalist(config)[1] == val_cases  # deterministic
    assert not {c["image"] for c in val_cases} & {c["image"] for c in train_cases}
    other_seed = split_datalist(config.with_values(seed=4))[1]
    assert other_seed != val_cases and len(other_seed) == 2


def test_fast_options_resolve_from_the_config(bundles: dict[str, Path]) -> None:
    from autotune.bundles.config import load_bundle_config
    from autotune.trainer.data import resolve_options

    config = load_bundle_config(bundles["segresnet_0"]).with_values(amp=True, cache_rate=1.0, num_workers=2,
                                                                     cache_on_device=True)
    cpu = resolve_options(config, "fast", "cpu")
    assert cpu.cache and cpu.thread_loader and not cpu.cache_on_device and not cpu.persistent and not cpu.nvtx
    assert cpu.cache_dir == bundles["segresnet_0"] / "cache" and cpu.amp and cpu.num_workers == 2
    cuda = resolve_options(config, "fast", "cuda:0")
    assert cuda.cache_on_device and cuda.nvtx
    assert resolve_options(config, "fast", "cuda:0", cache_bytes=10**18).persistent  # would not fit in RAM
    big = resolve_options(config, "fast", "cuda:0", cache_bytes=10**9, device_free_bytes=2 * 10**9)
    assert not big.cache_on_device and not big.persistent and "GPU" in big.cache_note
    assert resolve_options(config, "fast", "cuda:0", cache_bytes=10**8, device_free_bytes=2 * 10**9).cache_on_device
    off = resolve_options(config.with_values(fast_training={"cache": False}), "fast", "cuda:0")
    assert not off.cache and not off.thread_loader and not off.cache_on_device
    regular = resolve_options(config, "regular", "cuda:0")
    assert not (regular.cache or regular.amp or regular.thread_loader or regular.template_recipe)
    assert cpu.loader_name() == "ThreadDataLoader" and regular.loader_name() == "DataLoader(2 workers)"
    disk = resolve_options(config.with_values(persistent_cache=True), "fast", "cuda:0")
    assert disk.persistent and not disk.cache_on_device and disk.cache_note == "persistent_cache: true"
    assert (cpu.cache_place(), cuda.cache_place(), disk.cache_place(), regular.cache_place()) == (
        "RAM", "device", "disk", "off")


def test_the_persistent_cache_goes_where_cache_dir_says(bundles: dict[str, Path], tmp_path: Path) -> None:
    from autotune.bundles.config import load_bundle_config
    from autotune.trainer.data import resolve_options

    config = load_bundle_config(bundles["segresnet_0"])
    elsewhere = config.with_values(fast_training={"cache_dir": str(tmp_path / "cache")}, persistent_cache=True)
    assert resolve_options(elsewhere, "fast", "cpu").cache_dir == tmp_path / "cache"
    relative = config.with_values(fast_training={"cache_dir": "scratch/cache"})
    assert resolve_options(relative, "fast", "cpu").cache_dir == bundles["segresnet_0"] / "scratch" / "cache"
    with pytest.raises(ConfigError, match="did you mean"):
        config.with_values(fast_training={"cahce": False})
    with pytest.raises(ConfigError, match="fast_training.ram_fraction"):
        config.with_values(fast_training={"ram_fraction": 5})


def test_nvtx_ranges_wrap_forward_loss_backward_and_step() -> None:
    import torch

    from autotune.step import train_step
    from autotune.trainer.monitor import NvtxRanges

    model = torch.nn.Conv3d(1, 2, 3, padding=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ranges = NvtxRanges(enabled=False, record=True)
    ranges.attach(model, optimizer)
    loss_fn = ranges.wrap_loss(lambda logits, labels: ((logits - labels) ** 2).mean())
    with ranges.range("data"):
        images, labels = torch.randn(2, 1, 8, 8, 8), torch.randn(2, 2, 8, 8, 8)
    train_step(model, loss_fn, optimizer, images, labels)
    ranges.detach()
    assert ranges.opened == ["data", "forward", "loss", "backward", "optimizer"]
    assert NvtxRanges(enabled=False).wrap_loss(len) is len  # off: nothing is wrapped


def test_run_state_counts_validations_and_survives_a_checkpoint(tmp_path: Path) -> None:
    import torch

    from autotune.trainer.checkpoint import RunState, checkpoint_state, resume, save_checkpoint

    state = RunState()
    assert state.validated(None, 1) is False and state.stale == 1 and state.best is None
    assert state.validated(0.5, 2) is True and (state.best, state.best_epoch, state.stale) == (0.5, 2, 0)
    assert state.validated(0.4, 3) is False and state.validated(0.5, 4) is False and state.stale == 2
    model = torch.nn.Linear(2, 2)
    parts = {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "scaler": None,
             "scheduler": None}
    cfg = SimpleNamespace(algo="unet", network=SimpleNamespace(name="UNet"), fold=0)  # what a BundleConfig gives
    saved = checkpoint_state(parts, state, 4, mode="fast", elapsed_s=12.5, total_steps=40, config=cfg)
    assert saved["scaler"] is None and saved["epoch"] == 4 and saved["stale_validations"] == 2
    save_checkpoint(tmp_path / "last.pt", saved)
    said: list[str] = []
    fresh = torch.nn.Linear(2, 2)
    back = resume(tmp_path / "last.pt", "fast", {**parts, "model": fresh}, 40, said.append)
    assert back == RunState(epoch=4, best=0.5, best_epoch=2, stale=2, elapsed_before=12.5) and not said
    assert torch.equal(fresh.weight, model.weight)
    assert resume(tmp_path / "none.pt", "fast", parts, 40, said.append) == RunState() and "no checkpoint" in said[0]
    with pytest.raises(ConfigError, match="trained in fast mode; resume with --mode fast"):
        resume(tmp_path / "last.pt", "regular", parts, 40, said.append)
