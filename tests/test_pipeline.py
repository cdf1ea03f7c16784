"""The stages as library functions: ``autotune.run`` end to end, its errors, the CLI's ``run`` over it,
``BundleGen``'s tuner (the base class has none; ``autotune.BundleGen`` tunes with ``autotune.tune``), and which
generator ``autotune.BundleGen`` makes (its ``family``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import autotune
from autotune.bundles.config import load_bundle_config
from autotune.cli import main
from autotune.errors import ConfigError, SpecError
from autotune.facade.bundlegen import BundleGen as PlainBundleGen
from autotune.pipeline import AutotuneBundleGen, generator_family
from autotune.stages import load_specs

# the estimate strategy plans from fake tensors: no probe child, seconds not minutes
OPTIONS: dict[str, Any] = {"algos": "unet", "overrides": "tiny", "strategy": "estimate", "device": "cpu",
                           "memory_limit": "2GiB"}


@pytest.fixture(scope="module")
def ran(demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("run")
    storage = f"sqlite:///{root / 'studies.db'}"
    lines: list[str] = []
    result = autotune.run(demo_data, root / "w", num_fold=2, storage=storage, train=True, epochs=1, folds={1},
                          progress=lines.append, on_tuned=lambda records, path: lines.append(f"tuned {len(records)} {path}"),
                          **OPTIONS)
    return {"result": result, "work": root / "w", "storage": storage, "lines": lines}


def test_run_returns_the_tuned_bundles_and_their_records(ran: dict[str, Any]) -> None:
    result, work = ran["result"], ran["work"]
    assert isinstance(result, autotune.RunResult) and result.ok
    assert [b["identifier"] for b in result.bundles] == ["unet_0", "unet_1"]
    assert result.tuned_bundles == [str(work.resolve() / "unet_0"), str(work.resolve() / "unet_1")]
    assert result.summary_path == work / "autotune_summary.json"
    assert json.loads(result.summary_path.read_text())["results"] == json.loads(json.dumps(result.tuning))
    for record in result.tuning:  # each record is what was written into its bundle
        tuning = load_bundle_config(record["bundle"]).plan
        assert record["status"] == "tuned" and tuning.method == "estimated"
        assert tuning.num_patches_per_iter == record["num_patches_per_iter"] >= 1
    lines = ran["lines"]
    assert lines[0].startswith("[1/3] analysing")
    # on_tuned comes once, when tuning ends and before training starts
    assert [line for line in lines if line.startswith("tuned ")] == [f"tuned 2 {result.summary_path}"]
    assert lines.index(f"tuned 2 {result.summary_path}") < lines.index("[3/3] training the tuned bundles")


def test_run_trains_only_the_folds_asked(ran: dict[str, Any]) -> None:
    trained = ran["result"].trained
    assert list(trained) == ["unet_1"]
    assert trained["unet_1"]["epochs_run"] == 1 and Path(trained["unet_1"]["model_dir"]).is_dir()
    assert not (ran["work"] / "unet_0" / "model_fold0").exists()


def test_cli_run_is_the_library_run(ran: dict[str, Any], demo_data: Path, capsys) -> None:
    work = ran["work"]
    code = main(["run", "--input", str(demo_data), "--work-dir", str(work), "--num-fold", "2", "--algos", "unet",
                 "--overrides", "tiny", "--strategy", "estimate", "--device", "cpu", "--memory-limit", "2GiB",
                 "--storage", ran["storage"], "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err == ""  # --quiet: no progress lines
    assert "unet_0" in out and "unet_1" in out and f"summary: {work / 'autotune_summary.json'}" in out
    records = json.loads((work / "autotune_summary.json").read_text())["results"]
    assert [r["num_patches_per_iter"] for r in records] == [r["num_patches_per_iter"] for r in ran["result"].tuning]


@pytest.mark.parametrize(
    "kwargs, needle",
    [({"num_fold": 0}, "num_fold"), ({"max_time": "soon"}, "soon"), ({"overrides": "huge"}, "huge")],
    ids=["no-folds", "bad-duration", "unknown-preset"],
)
def test_run_refuses_bad_arguments_before_any_work(demo_data: Path, tmp_path: Path, kwargs: dict[str, Any],
                                                   needle: str) -> None:
    with pytest.raises(autotune.AutotuneError, match=needle):
        autotune.run(demo_data, tmp_path / "w", **{**OPTIONS, **kwargs, "progress": None})
    assert not (tmp_path / "w").exists()


def test_run_refuses_an_unknown_keyword_before_any_work(demo_data: Path, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="memroy_limit"):
        autotune.run(demo_data, tmp_path / "w", memroy_limit="8GiB", progress=None)  # type: ignore[call-arg]
    assert not (tmp_path / "w").exists()


def test_cli_run_bad_folds_is_one_line_exit_2(demo_data: Path, tmp_path: Path, capsys) -> None:
    code = main(["run", "--input", str(demo_data), "--work-dir", str(tmp_path / "w"), "--folds", "one", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--folds" in err and "Traceback" not in err
    assert not (tmp_path / "w").exists()


def _plain_gen(work: Path, **kwargs: Any) -> PlainBundleGen:
    return PlainBundleGen(work, algos="unet", data_stats_filename=work / "datastats.yaml",
                          data_src_cfg_name=work / "data_src.yaml", **kwargs)


def test_bundlegen_without_a_tuner_refuses_gpu_customization_before_writing(ran: dict[str, Any],
                                                                           tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no tuner"):
        _plain_gen(ran["work"]).generate(tmp_path / "out", num_fold=1, gpu_customization=True)
    assert not (tmp_path / "out").exists()


def test_bundlegen_calls_the_tuner_it_is_given(ran: dict[str, Any], tmp_path: Path) -> None:
    calls: list[tuple[list[str], Any, dict[str, Any]]] = []

    def tuner(bundles: list[str], specs: Any, **options: Any) -> list[dict[str, Any]]:
        calls.append((bundles, specs, options))
        return []

    specs = {"universal": {"range_num_images_per_batch": [1, 2]}}
    bundles = _plain_gen(ran["work"], tuner=tuner).generate(
        tmp_path / "out", num_fold=1, overrides="tiny", gpu_customization=True, gpu_customization_specs=specs,
        device="cpu", memory_limit="1GiB")
    assert calls == [([bundles[0]["path"]], specs, {"device": "cpu", "memory_limit": "1GiB"})]
    assert AutotuneBundleGen.tuner is autotune.tune and issubclass(AutotuneBundleGen, PlainBundleGen)


def test_bundlegen_makes_the_generator_of_the_family_its_templates_say(ran: dict[str, Any], tmp_path: Path) -> None:
    """``family="auto"`` tells MONAI's templates (a folder of ``<algo>/scripts/algo.py``, or a URL) from autotune's;
    an explicit ``family`` names the generator; an unknown one is refused in one line naming the valid ones."""
    from autotune.families import FAMILIES

    work = ran["work"]
    kwargs = {"data_stats_filename": work / "datastats.yaml", "data_src_cfg_name": work / "data_src.yaml"}
    own = autotune.BundleGen(work, "unet", None, **kwargs)  # MONAI's positional order: algo_path, algos, templates
    assert type(own) is AutotuneBundleGen and own.algos == ["unet"] and own.tuner is autotune.tune
    assert type(autotune.BundleGen(work, algos="unet", family="autotune", **kwargs)) is AutotuneBundleGen
    (tmp_path / "segresnet" / "scripts").mkdir(parents=True)
    (tmp_path / "segresnet" / "scripts" / "algo.py").write_text("")
    monai, autotune_family = (next(f for f in FAMILIES if f.name == n) for n in ("monai", "autotune"))
    assert generator_family(tmp_path) is monai and generator_family("https://example.org/templates.tar.gz") is monai
    assert generator_family(None) is autotune_family and generator_family(tmp_path, "autotune") is autotune_family
    assert generator_family(None, "monai") is monai
    with pytest.raises(ConfigError, match=r"unknown BundleGen family 'monia' \(did you mean 'monai'\?\)"):
        autotune.BundleGen(work, algos="unet", family="monia", **kwargs)
    with pytest.raises(TypeError):  # family is a keyword: a sixth positional argument is not taken for it
        autotune.BundleGen(work, "unet", None, None, None, "monai")


def test_specs_load_from_yaml_and_a_bad_top_level_is_named(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("universal:\n  num_trials: 7\n")
    bad.write_text("- 1\n- 2\n")
    assert load_specs(good) == {"universal": {"num_trials": 7}}
    assert load_specs(None) == {}
    with pytest.raises(SpecError, match="bad.yaml: specs must be a mapping"):
        load_specs(bad)
