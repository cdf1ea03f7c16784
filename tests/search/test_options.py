"""The tuning options declared once (``TuningOptions``) and the strategies behind one interface (the registry):
the CLI, the stages and the session agree on every default; stored results keep their tags."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from autotune.cli import build_parser
from autotune.errors import SpecError
from autotune.search.driver.options import TuneOptions, TuningOptions, option_flag
from autotune.search.strategies.registry import STRATEGIES, strategy_named

PACKAGE = Path(__file__).resolve().parents[2] / "autotune"


def _subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _defaults(parser: argparse.ArgumentParser) -> dict[str, object]:
    return {a.dest: a.default for a in parser._actions if a.option_strings}


@pytest.mark.parametrize("command", ["tune", "run", "worker"])
def test_the_command_line_takes_each_option_with_its_declared_default(command: str) -> None:
    defaults = _defaults(_subparser(command))
    flags = {s for a in _subparser(command)._actions for s in a.option_strings}
    for name in TuningOptions.cli_names():
        assert option_flag(name) in flags
        assert defaults[name] == getattr(TuningOptions, name), name


def test_a_help_text_that_states_a_default_states_the_declared_one() -> None:
    stated = 0
    for one in dataclasses.fields(TuningOptions):
        found = re.search(r"(?:^|: )([\w.-]+) \(default[:)]|\(default:? ([\w.-]+)\)", one.metadata["help"] or "")
        if found is None:
            continue
        stated += 1
        value = found.group(1) or found.group(2)
        assert (float(value) if isinstance(one.default, float) else value) == one.default, one.name
    assert stated >= 5


def test_the_stages_and_verify_take_the_declared_defaults() -> None:
    from autotune.stages import tune, verify

    assert set(TuneOptions.__optional_keys__) == set(TuningOptions.names())
    signature = inspect.signature(tune).parameters
    assert not set(signature) & set(TuningOptions.names()), "tune declares an option of its own"
    for name, param in inspect.signature(verify).parameters.items():
        if name in TuningOptions.names() and name != "memory_limit":  # verify's limit: the tuned one
            assert param.default == getattr(TuningOptions, name), name
    verify_cli = _defaults(_subparser("verify"))
    assert {n: verify_cli[n] for n in ("device", "storage", "timeout")} == {
        n: getattr(TuningOptions, n) for n in ("device", "storage", "timeout")}


def test_the_session_and_settings_declare_no_option_again() -> None:
    from autotune.search.driver.bundles import SearchSettings
    from autotune.search.driver.session import Session

    for holder in (SearchSettings, Session):
        assert not {f.name for f in dataclasses.fields(holder)} & set(TuningOptions.names()) - {"strategy"}, holder
    from autotune.search.driver.key import result_tag

    assert inspect.signature(result_tag).parameters["handoff"].default is inspect.Parameter.empty


def test_an_unknown_option_is_refused_before_any_work(tmp_path: Path) -> None:
    import autotune

    with pytest.raises(TypeError, match="devise"):
        autotune.tune([str(tmp_path / "missing")], devise="cpu")
    with pytest.raises(TypeError, match="devise"):
        autotune.run(str(tmp_path / "missing"), tmp_path / "work", devise="cpu")
    from autotune.pipeline import AutotuneBundleGen

    gen = AutotuneBundleGen.__new__(AutotuneBundleGen)
    with pytest.raises(TypeError, match="devise"):
        gen.generate(tmp_path, 1, gpu_customization=True, devise="cpu")


def test_strategies_are_looked_up_once_by_name() -> None:
    assert set(STRATEGIES) == {"fast", "tpe", "estimate"}
    fast, tpe, estimate = (strategy_named(n) for n in ("fast", "tpe", "estimate"))
    assert (fast.key_name, estimate.key_name, tpe.key_name) == ("fast", "fast-estimate", "tpe")
    assert estimate.name == "fast" and estimate.estimates_only and estimate.claims_key
    assert tpe.shares_points and not tpe.claims_key and tpe.phase == "joint" and not tpe.times_handoff
    assert fast.times_handoff and fast.phase == "train" and fast.sampler(0, None, False) is None
    assert tpe.estimated().key_name == "tpe-estimate"
    with pytest.raises(SpecError, match="strategy"):
        strategy_named("fastest")


def test_no_module_but_the_registry_compares_a_strategy_name() -> None:
    pattern = re.compile(r"strategy\s*[!=]=|[!=]=\s*\"(tpe|fast|estimate)\"|startswith\(\"tpe")
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line) and "mode" not in line:  # the trainer's fast mode is not a strategy
                offenders.append(f"{path.relative_to(PACKAGE)}:{number}")
    assert offenders == []


def test_result_tags_of_the_same_settings_stay_byte_identical() -> None:
    """Stored results are found by these tags: a change strands every stored search."""
    from autotune.search.driver.key import result_tag
    from autotune.search.strategies.space import AlgoSpec

    spec = AlgoSpec()
    small = AlgoSpec(num_trials=5, patches_range=(1, 8), sw_range=(2, 4), validation_devices=("device",))
    ref = {"reference_batch": 2, "lr_scaling": "linear"}
    fast, tpe, estimate = (strategy_named(n) for n in ("fast", "tpe", "estimate"))
    tags = [
        result_tag(fast.name, 0.1, spec, ("device", "cpu"), fast.estimates_only, "largest"),
        result_tag(fast.name, 0.1, spec, ("device", "cpu"), fast.estimates_only, "goodput"),
        result_tag(estimate.name, 0.1, small, ("device",), estimate.estimates_only, "goodput"),
        result_tag(tpe.name, 0.2, small, ("device",), tpe.estimates_only, "goodput", ref),
        result_tag(fast.name, 0.1, spec, ("device",), False, "largest", ref),
    ]
    assert tags == ["result:8846b67d2728", "result:1509a519c09b", "result:ed5427d3e2b3", "result:232daa160ae4",
                    "result:8e116b4fc670"]
