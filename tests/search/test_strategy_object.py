"""Strategies are objects passed in, as Optuna's samplers are: a strategy defined in this file (no file of
``autotune/`` edited) is given to ``autotune.tune`` and to ``BundleGen.generate``, searches a key with the fake
probe (``AUTOTUNE_FAKE_PROBE``: a probe is an instant answer from a linear memory model) and its result is written
to the bundle; the shipped strategies are objects too, and the names the command line takes resolve to them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from probe_fixtures import one_window_unet, shared_tiny_bundles

from autotune.errors import SpecError
from autotune.search.strategies import (
    STRATEGIES,
    FastStrategy,
    KeyRun,
    Searched,
    SearchOutcome,
    Strategy,
    TpeStrategy,
    strategy_of,
)

FAKE = "sleep=0,base=64MiB,patch=32MiB,window=16MiB"
LIMIT = "300MiB"  # budget 270 MiB at margin 0.1: 6 patches (64 + 6 x 32) and 12 windows (64 + 12 x 16) fit
SPECS = {"universal": {"range_num_images_per_batch": [1, 8], "range_num_sw_batch_size": [1, 4]}}


@dataclass(frozen=True)
class DescendingStrategy(Strategy):
    """Each batch from the top of the range down until one fits, then the sliding-window batch the same way on the
    first validation device; ``runs`` counts the keys it searched."""

    name = "descending"
    runs: list[str] = field(default_factory=list, compare=False)

    def run(self, key: KeyRun) -> Searched:
        self.runs.append(key.label)
        tried = []
        lo, hi = key.spec.patches_range
        train = None
        for n in range(hi, lo - 1, -1):
            tried.append(key.evaluator.evaluate({"num_patches_per_iter": n}, ("train",)))
            if tried[-1].feasible:
                train = tried[-1]
                break
        if train is None:
            return Searched(SearchOutcome.nothing(tried))
        n, device = train.point["num_patches_per_iter"], key.devices[0]
        infer = None
        for m in range(key.spec.sw_range[1], key.spec.sw_range[0] - 1, -1):
            tried.append(key.evaluator.evaluate(
                {"num_patches_per_iter": n, "num_sw_batch_size": m, "validation_device": device}, ("infer",)))
            if tried[-1].feasible:
                infer = tried[-1]
                break
        return Searched(SearchOutcome.of_points(n, train, infer, tried))


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return one_window_unet(tmp_path_factory, "strategy_object")


@pytest.fixture()
def bundle(source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import shutil

    monkeypatch.setenv("AUTOTUNE_FAKE_PROBE", FAKE)
    return Path(shutil.copytree(source, tmp_path / "unet_0"))


def _tune(bundle: Path, strategy: Any, storage: str) -> dict[str, Any]:
    from autotune import tune

    [record] = tune([bundle], SPECS, device="cpu", memory_limit=LIMIT, margin=0.1, handoff="largest", progress=None,
                    storage=storage, strategy=strategy)
    return record


def test_a_strategy_defined_here_searches_a_key_and_its_result_is_written(bundle: Path, tmp_path: Path) -> None:
    from autotune.bundles.config import load_bundle

    strategy = DescendingStrategy()
    storage = f"sqlite:///{tmp_path / 's.db'}"
    record = _tune(bundle, strategy, storage)
    assert strategy.runs == ["unet"]
    assert record["status"] == "tuned" and record["strategy"] == "descending"
    assert (record["num_patches_per_iter"], record["num_sw_batch_size"]) == (6, 4)
    assert record["probes"] == 4  # 8 and 7 patches do not fit, 6 do; 4 windows fit at once
    written = load_bundle(bundle)
    assert (written.config.num_patches_per_iter, written.config.num_sw_batch_size) == (6, 4)
    assert written.plan.strategy == "descending" and written.plan.num_patches_per_iter == 6
    again = _tune(bundle, strategy, storage)  # its stored result, keyed by its name: not searched again
    assert strategy.runs == ["unet"] and again["num_patches_per_iter"] == 6 and again.get("from_storage")


def test_the_shipped_strategies_pass_as_objects_and_the_names_stand_for_them(bundle: Path, tmp_path: Path) -> None:
    record = _tune(bundle, FastStrategy(), f"sqlite:///{tmp_path / 'fast.db'}")
    assert record["status"] == "tuned" and record["strategy"] == "fast" and record["num_patches_per_iter"] == 6
    assert strategy_of("fast") is STRATEGIES["fast"] and strategy_of("fast") == FastStrategy()
    assert strategy_of("estimate") == FastStrategy(estimates_only=True) and strategy_of("tpe") == TpeStrategy()
    mine = DescendingStrategy()
    assert strategy_of(mine) is mine
    with pytest.raises(SpecError, match="fastest"):
        strategy_of("fastest")
    with pytest.raises(SpecError, match="a name .* or an autotune.search.strategies.Strategy, got int"):
        strategy_of(3)  # type: ignore[arg-type]


def test_bundlegen_takes_a_strategy_object(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """MONAI's shape: ``generate(..., gpu_customization=True, strategy=...)`` tunes with the object."""
    from autotune import BundleGen
    from autotune.bundles.config import load_bundle

    monkeypatch.setenv("AUTOTUNE_FAKE_PROBE", FAKE)
    work = shared_tiny_bundles(tmp_path_factory, algos=("unet",))["unet"].parent  # its analysis
    strategy = DescendingStrategy()
    gen = BundleGen(tmp_path / "gen", algos=["unet"], data_stats_filename=work / "datastats.yaml",
                    data_src_cfg_name=work / "data_src.yaml")
    gen.generate(tmp_path / "gen", num_fold=1, overrides="tiny", gpu_customization=True, gpu_customization_specs=SPECS,
                 device="cpu", memory_limit=LIMIT, margin=0.1, handoff="largest", progress=None,
                 storage=f"sqlite:///{tmp_path / 'g.db'}", strategy=strategy)
    assert strategy.runs == ["unet"]
    [made] = gen.get_bundles()
    plan = load_bundle(made["path"]).plan
    assert plan.strategy == "descending" and plan.num_patches_per_iter == 6


def test_the_interface_is_abstract() -> None:
    with pytest.raises(TypeError, match="abstract"):
        Strategy()  # type: ignore[abstract]

    class Nameless(Strategy):
        def run(self, key: KeyRun) -> Searched:
            raise NotImplementedError

    with pytest.raises(TypeError, match="name"):
        Nameless()  # type: ignore[abstract]
    mine = DescendingStrategy()
    estimated = mine.estimated()
    assert (estimated.key_name, estimated.label, mine.key_name) == ("descending-estimate",
                                                                   "descending (estimates only)", "descending")
    assert estimated.claims_key and estimated.phase == "train" and estimated.sampler(0, None, False) is None
