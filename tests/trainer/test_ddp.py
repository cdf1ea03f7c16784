"""DistributedDataParallel on CPU: two gloo processes train one short epoch together."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bundle_fixtures import copy_bundle


@pytest.fixture(scope="module")
def unet_bundle(demo_bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_bundle(demo_bundles["unet_0"], tmp_path_factory.mktemp("ddp") / "unet_0")


def test_two_cpu_processes_share_one_epoch(unet_bundle: Path) -> None:
    import torch

    from autotune.build import build_network
    from autotune.bundles.config import load_bundle_config
    from autotune.data.split import split_datalist
    from autotune.trainer.runner import train

    # a budget too short for a second epoch: the ranks plan together (one collective) and stop together
    summary = train(unet_bundle, max_time=0.5, nproc=2, progress=False)
    assert summary["world_size"] == 2 and summary["epochs_run"] == 1
    assert summary["schedule"]["set_by"] == "max_time" and summary["schedule"]["planned_epochs"] == 1
    config = load_bundle_config(unet_bundle)
    train_cases, _, _ = split_datalist(config)
    # Each rank cached only its shard: half of the training cases (rounded up, padded to equal length).
    assert summary["train_cases_per_rank"] == -(-len(train_cases) // 2)
    row = json.loads((unet_bundle / "model_fold0" / "metrics.json").read_text())["rows"][-1]
    per_rank = summary["train_cases_per_rank"] * config.num_crops_per_image
    assert row["world_size"] == 2 and row["rank_samples"] == [per_rank, per_rank]  # both ranks trained
    assert row["samples"] == 2 * per_rank and row["mean_dice"] is not None
    state = torch.load(unet_bundle / "model_fold0" / "last.pt", map_location="cpu", weights_only=True)
    model = build_network(config)
    model.load_state_dict(state["model"])  # saved unwrapped: no "module." prefix
    assert state["epoch"] == 1


def test_a_child_error_comes_back_as_the_same_error(unet_bundle: Path, tmp_path: Path) -> None:
    from autotune.errors import DataError
    from autotune.trainer.runner import train

    # The datalist is first read inside the spawned processes.
    bundle = copy_bundle(unet_bundle, tmp_path / "broken", datalist=str(tmp_path / "gone.json"))
    with pytest.raises(DataError, match="gone.json"):
        train(bundle, epochs=1, nproc=2, progress=False)


def test_cuda_without_a_gpu_is_refused_before_spawning(unet_bundle: Path) -> None:
    import torch

    from autotune.errors import SpecError
    from autotune.trainer.runner import train

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SpecError, match="CUDA is not available"):
        train(unet_bundle, epochs=1, nproc=2, device="cuda", progress=False)
