"""A bundle states its batch once and training reads it through one accessor (``autotune.bundles.tuned``);
bundles written by an earlier autotune still load, and train and probe the batch they state.

``old_bundles/`` holds the configs autotune wrote at commit 13a82f5 (2026-11-23), byte for byte:
``autotune demo-data OUT --cases 6 --size 32 --classes 2``, ``autotune generate --algos dints,unet --num-fold 2
--overrides tiny`` and ``autotune tune unet_0 --device cpu --memory-limit 64MiB --range-num-images-per-batch 1 6
--range-num-sw-batch-size 1 4``: ``unet_0`` tuned (6 patches per pass, a loader batch of 6 x 1, its ``tuning:``
block without a ``version``), ``dints_0`` as generated (loader batches of 2 x 1 in passes of 1, no
``batch_scaling`` block). Their folders, under ``/tmp/h60r_oldrun``, become the test's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.errors import ConfigError

OLD = Path(__file__).parent / "old_bundles"
OLD_WORK, OLD_DATA = "/tmp/h60r_oldrun/work", "/tmp/h60r_oldrun/demo"


@pytest.fixture(scope="module")
def old_bundles(demo_data: Path, demo_bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
                ) -> dict[str, Path]:
    """The old bundles over the session's demo data (the same generator's cases, analysed in two folds)."""
    work = demo_bundles["unet_0"].parent
    out = tmp_path_factory.mktemp("old_bundles")
    bundles = {}
    for source in sorted(OLD.iterdir()):
        text = (source / "configs" / "hyper_parameters.yaml").read_text(encoding="utf-8")
        text = text.replace(f"{OLD_WORK}/{source.name}", str(out / source.name))
        text = text.replace(OLD_WORK, str(work)).replace(OLD_DATA, str(demo_data))
        (out / source.name / "configs").mkdir(parents=True)
        (out / source.name / "configs" / "hyper_parameters.yaml").write_text(text, encoding="utf-8")
        bundles[source.name] = out / source.name
    return bundles


def test_an_old_bundle_loads_with_the_batch_it_states(old_bundles: dict[str, Path]) -> None:
    from autotune.bundles.config import load_bundle
    from autotune.bundles.tuned import tuned_values

    unet, dints = (load_bundle(old_bundles[name]) for name in ("unet_0", "dints_0"))
    tuned = tuned_values(unet.config)
    assert (tuned.num_patches_per_iter, tuned.num_images_per_batch, tuned.num_crops_per_image) == (6, 6, 1)
    assert (tuned.num_sw_batch_size, tuned.validation_device, tuned.passes_per_loader_batch) == (4, "device", 1)
    assert unet.plan is not None and tuned.plan == unet.plan and unet.plan.num_patches_per_iter == 6
    assert unet.plan.version == 1 and tuned.tuned_peak_bytes == unet.plan.peak_bytes
    tuned = tuned_values(dints.config)
    assert (tuned.num_patches_per_iter, tuned.loader_patches, tuned.passes_per_loader_batch) == (1, 2, 2)
    assert tuned.plan is None and tuned.tuned_peak_bytes is None


def test_an_old_bundle_probes_and_trains_the_batch_it_states(old_bundles: dict[str, Path]) -> None:
    """The probe runs its N patches per pass from a loader batch of lcm(N, crops); training draws loader batches
    of num_images_per_batch x crops and steps through them in passes of N (DiNTS: 2 x 1 in two passes of 1)."""
    from autotune.bundles.config import load_bundle_config
    from autotune.probe import resolve_request
    from autotune.trainer.ddp import DistContext
    from autotune.trainer.setup import setup_data

    request = resolve_request(old_bundles["unet_0"], check_device=False)
    assert (request["num_patches_per_iter"], request["num_sw_batch_size"], request["validation_device"]) == \
        (6, 4, "device")
    cfg = load_bundle_config(old_bundles["dints_0"])
    assert resolve_request(cfg, check_device=False)["num_patches_per_iter"] == 1
    data = setup_data(cfg, DistContext(device="cpu"), "regular", 1, None, False)
    assert data.train_loader.batch_size == 2
    assert data.plan.steps_per_epoch == data.num_train_cases  # a pass of one patch per case: two per loader batch


def test_a_batch_stated_inconsistently_is_refused_in_one_line(old_bundles: dict[str, Path], tmp_path: Path) -> None:
    """``num_patches_per_iter`` edited by hand past its loader batch would train passes of 2 while the
    out-of-memory line said 8: refused, naming the three keys and what to set."""
    from bundle_fixtures import copy_bundle

    from autotune.bundles.config import load_bundle_config
    from autotune.bundles.tuned import tuned_values
    from autotune.trainer import train

    bundle = copy_bundle(old_bundles["dints_0"], tmp_path / "dints_0", num_patches_per_iter=8)
    cfg = load_bundle_config(bundle)  # the probe and the tuner read it as stated: 8 patches per pass
    with pytest.raises(ConfigError) as refused:
        tuned_values(cfg)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"{bundle}: num_patches_per_iter 8 is not a whole number of passes")
    assert "num_images_per_batch 2 x num_crops_per_image 1 = 2 patches" in line
    assert "set num_images_per_batch to 8, or num_patches_per_iter to a divisor of 2" in line
    with pytest.raises(ConfigError, match="num_patches_per_iter 8 is not a whole number"):
        train(bundle, device="cpu", epochs=1, progress=False)
    assert not (bundle / "model_fold0").exists()
    fixed = copy_bundle(bundle, tmp_path / "fixed", num_images_per_batch=8)
    assert tuned_values(load_bundle_config(fixed)).passes_per_loader_batch == 1


def test_the_oom_line_names_the_batch_that_trains(old_bundles: dict[str, Path]) -> None:
    import torch

    from autotune.bundles.config import load_bundle_config
    from autotune.trainer.memory import out_of_memory_error

    cfg = load_bundle_config(old_bundles["unet_0"])
    error = out_of_memory_error(torch.OutOfMemoryError("fake"), cfg, 1 << 26, "training", 2, "last.pt")
    assert error is not None and "(6 patches per pass, sw batch 4)" in str(error)


def test_the_trainer_reads_the_tuned_values_only_through_the_accessor() -> None:
    """No module of the trainer (nor the schedule it plans, nor MONAI's launcher) reads a tuned key or the
    ``tuning:`` block from a config itself: ``autotune.bundles.tuned`` is the one reader."""
    import re

    import autotune

    package = Path(autotune.__file__).parent
    raw = re.compile(r"cfg(\.get\(|\[)[\"'](num_patches_per_iter|num_images_per_batch|num_crops_per_image|"
                     r"num_sw_batch_size|sw_input_on_cpu|tuning)[\"']|plan_of\(")
    files = [*sorted((package / "trainer").glob("*.py")), package / "bundles" / "scaling.py",
             package / "auto3dseg" / "launcher.py"]
    found = [f"{path.name}:{number}" for path in files
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if raw.search(line)]
    assert found == []
