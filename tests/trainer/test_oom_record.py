"""What a training run stepped down to after an out-of-memory, as the typed records it is read back from: the
bundle's ``tuning.training_oom`` (``autotune.bundles.oom_record.TrainingOOM``, parsed with the ``tuning:`` block)
and a checkpoint's ``memory_fallbacks`` (``autotune.trainer.fallback.SavedFallbacks``). A value edited by hand is
one line naming the file and the key (exit 2 from the command line), and the bundle is left as it was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from bundle_fixtures import copy_bundle

from autotune.bundles.model import MAX_BATCH
from autotune.bundles.oom_record import MAX_PATCHES
from autotune.bundles.plan import TuningPlan
from autotune.errors import ConfigError
from autotune.tunables import ValidationDevice

LIMIT = 1 << 30
BATCH = {"num_patches_per_iter": 2, "num_images_per_batch": 2, "num_crops_per_image": 1, "num_sw_batch_size": 4}
BLOCK = {"num_patches_per_iter": 2, "num_sw_batch_size": 4, "memory_limit": LIMIT, "device": "cpu",
         "method": "estimated"}
RECORD = {"num_patches_per_iter": 2, "micro_batches": 2, "sw_batch": 2, "validation_device": "device",
          "memory_limit": LIMIT, "device": "cpu",
          "last": {"phase": "training", "epoch": 1, "step": 1, "failed": "training pass of 2 patches",
                   "peak_bytes": LIMIT + 1, "limit_bytes": LIMIT, "done": "split into 2 micro-batches"},
          "date": "2026-01-02T03:04:05+00:00", "study": {"recorded": True, "study_name": "s", "trial": 7}}


def test_the_record_is_typed_and_round_trips() -> None:
    plan = TuningPlan.from_dict({**BLOCK, "training_oom": RECORD}, "hyper_parameters.yaml: tuning")
    record = plan.training_oom
    assert (record.num_patches_per_iter, record.micro_batches, record.sw_batch) == (2, 2, 2)
    assert record.validation_device == "device" and record.memory_limit == LIMIT and record.device == "cpu"
    assert record.study.recorded is True and record.study.trial == 7 and record.last["step"] == 1
    block = plan.as_dict()
    assert block["training_oom"] == RECORD
    assert TuningPlan.from_dict(yaml.safe_load(yaml.safe_dump(block)), "tuning") == plan
    # a run without a limit and before any training step-down: no limit, no study
    bare = {k: v for k, v in RECORD.items() if k not in ("memory_limit", "study")}
    assert TuningPlan.from_dict({**BLOCK, "training_oom": bare}, "tuning").training_oom.memory_limit is None
    assert MAX_PATCHES == MAX_BATCH  # the record's bound on a pass is the bundle's


@pytest.mark.parametrize(("change", "message"), [
    ({"micro_batches": "two"}, "key 'tuning.training_oom.micro_batches': got 'two'; must be a whole number"),
    ({"micro_batches": 1000000}, "key 'tuning.training_oom.micro_batches': got 1000000; must be a whole number"),
    ({"micro_batches": 3}, "key 'tuning.training_oom.micro_batches': got 3; must be a whole number from 1 to "
                           r"num_patches_per_iter \(2\)"),
    ({"micro_batches": 0}, "key 'tuning.training_oom.micro_batches': got 0"),
    ({"micro_batches": True}, "key 'tuning.training_oom.micro_batches': got True"),
    ({"sw_batch": 2.5}, "key 'tuning.training_oom.sw_batch': got 2.5"),
    ({"validation_device": "gpu"}, "key 'tuning.training_oom.validation_device': got 'gpu'; must be 'device' or"),
    ({"memory_limit": -1}, "key 'tuning.training_oom.memory_limit': got -1"),
    ({"device": "tpu"}, "key 'tuning.training_oom.device': got 'tpu'"),
    ({"study": {"recorded": "yes"}}, "key 'tuning.training_oom.study.recorded': got 'yes'; must be true or false"),
    ({"micro_batch": 2}, "unknown key 'tuning.training_oom.micro_batch'; did you mean "
                         "'tuning.training_oom.micro_batches'"),
    ({"micro_batches": None}, "key 'tuning.training_oom.micro_batches' is missing"),
])
def test_a_bad_record_is_one_line_naming_the_file_and_key(change: dict[str, Any], message: str) -> None:
    record = {k: v for k, v in {**RECORD, **change}.items() if v is not None}
    with pytest.raises(ConfigError, match=message) as refused:
        TuningPlan.from_dict({**BLOCK, "training_oom": record}, "b/configs/hyper_parameters.yaml: tuning")
    line = str(refused.value)
    assert line.startswith("b/configs/hyper_parameters.yaml: ") and "\n" not in line


def _tuned_copy(source: Path, dest: Path, record: dict[str, Any]) -> Path:
    """A copy of ``source`` at 2 patches per pass whose ``tuning:`` block holds ``record``, written as a hand
    edit would write it (not through the checks)."""
    bundle = copy_bundle(source, dest, **BATCH)
    path = bundle / "configs" / "hyper_parameters.yaml"
    config = yaml.safe_load(path.read_text())
    config["tuning"] = {**BLOCK, "training_oom": record}
    path.write_text(yaml.safe_dump(config))
    return bundle


@pytest.mark.parametrize("value", ["two", 1000000, 3])
def test_train_refuses_an_edited_split_in_one_line_and_leaves_the_bundle(
        bundles: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], value: Any) -> None:
    from autotune.cli import main

    bundle = _tuned_copy(bundles["segresnet_0"], tmp_path / "segresnet_0", {**RECORD, "micro_batches": value})
    path = bundle / "configs" / "hyper_parameters.yaml"
    before = path.read_bytes()
    capsys.readouterr()
    code = main(["train", str(bundle), "--device", "cpu", "--epochs", "1", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and str(path) in err[0] and "'tuning.training_oom.micro_batches'" in err[0], err
    assert f"got {value!r}" in err[0]
    assert path.read_bytes() == before and not (bundle / "model_fold0").exists()


def test_a_run_starts_from_the_record_of_its_batch_limit_and_device(
        bundles: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from autotune.bundles.config import load_bundle_config
    from autotune.trainer.ddp import DistContext
    from autotune.trainer.learn import start_fallbacks

    record = {**RECORD, "validation_device": "cpu"}
    cfg = load_bundle_config(_tuned_copy(bundles["segresnet_0"], tmp_path / "segresnet_0", record))
    model = torch.nn.Conv3d(1, 1, 1)
    fallbacks = start_fallbacks(cfg, DistContext(device="cpu"), LIMIT, model)
    assert fallbacks.in_force() == {"micro_batches": 2, "sw_batch": 2, "validation_device": "cpu"}
    assert "memory: starting in 2 micro-batches" in fallbacks.from_record
    other = start_fallbacks(cfg, DistContext(device="cpu"), LIMIT // 2, model)  # another limit: its own record
    assert other.micro_batches == 1 and other.from_record == ""


def test_a_step_down_is_recorded_as_a_record_that_parses_back(bundles: dict[str, Path], tmp_path: Path) -> None:
    import torch

    from autotune.bundles.config import load_bundle_config
    from autotune.trainer.ddp import DistContext
    from autotune.trainer.learn import start_fallbacks

    bundle = copy_bundle(bundles["segresnet_0"], tmp_path / "segresnet_0", **BATCH, tuning=BLOCK)
    fallbacks = start_fallbacks(load_bundle_config(bundle), DistContext(device="cpu"), LIMIT, torch.nn.Conv3d(1, 1, 1))
    fallbacks.say = lambda line: None
    fallbacks.training_oom(2, LIMIT + 512, 1, 1)
    fallbacks.validation_oom(LIMIT + 1024, 1, 1)
    record = load_bundle_config(bundle).plan.training_oom
    assert (record.micro_batches, record.sw_batch, record.validation_device) == (2, 2, "device")
    assert record.num_patches_per_iter == 2 and record.memory_limit == LIMIT and record.device == "cpu"
    assert record.last["phase"] == "validation" and record.last["peak_bytes"] == LIMIT + 1024
    assert record.study.recorded is False and "the key is for" in record.study.reason  # an estimated plan


def test_a_checkpoint_s_fallbacks_are_checked_when_put_back() -> None:
    from autotune.trainer.fallback import MemoryFallbacks

    saved = MemoryFallbacks(4, ValidationDevice.DEVICE, "cpu", LIMIT, say=lambda line: None)
    saved.training_oom(4, LIMIT + 1, 1, 1)
    fallbacks = MemoryFallbacks(4, ValidationDevice.DEVICE, "cpu", LIMIT)
    assert fallbacks.load(saved.state(), "m/last.pt") and fallbacks.state() == saved.state()
    assert not fallbacks.load(None)
    for change, message in (({"micro_batches": "2"}, "key 'memory_fallbacks.micro_batches': got '2'"),
                            ({"validation_device": "gpu"}, "key 'memory_fallbacks.validation_device': got 'gpu'"),
                            ({"events": {}}, "key 'memory_fallbacks.events': got {}; must be a list")):
        with pytest.raises(ConfigError, match=message) as refused:
            MemoryFallbacks(4, ValidationDevice.DEVICE, "cpu", LIMIT).load({**saved.state(), **change}, "m/last.pt")
        assert str(refused.value).startswith("m/last.pt: ")
    earlier = {k: v for k, v in saved.state().items() if k != "validation_device"} | {"on_cpu": True}
    assert fallbacks.load(earlier, "m/last.pt")  # a checkpoint written before validation_device held the flag
    assert fallbacks.validation_device is ValidationDevice.CPU and fallbacks.state()["validation_device"] == "cpu"
    assert "on_cpu" not in fallbacks.state()
