"""``fast_training.compile``: the run trains through torch.compile's module, falls back to eager in one line where
it fails, and says in its summary what it trained with (compile, loader, cache, precision) and what set-up cost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml


def _ask_compile(bundle: Path) -> None:
    path = bundle / "configs" / "hyper_parameters.yaml"
    config = yaml.safe_load(path.read_text())
    config.setdefault("fast_training", {})["compile"] = True
    path.write_text(yaml.safe_dump(config))


class _Counting:
    """What torch.compile is patched to return: calls the network and counts; or raises as a compiler would."""

    def __init__(self, model: Any, fail: bool) -> None:
        self.model, self.fail, self.calls = model, fail, 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        if self.fail:
            raise RuntimeError("InductorError: CppCompileError: C++ compile error\nmore lines")
        return self.model(*args)


@pytest.mark.parametrize("fail", [False, True], ids=["compiled", "compiler-fails"])
def test_a_fast_run_trains_through_torch_compile_or_falls_back_in_one_line(
        bundle: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fail: bool) -> None:
    import torch

    from autotune.trainer.runner import train

    made: list[_Counting] = []
    monkeypatch.setattr(torch, "compile", lambda model: made.append(_Counting(model, fail)) or made[-1])
    _ask_compile(bundle)
    summary = train(bundle, epochs=1, progress=False)
    assert summary["stopped"] == "epochs" and summary["best_metric"] is not None
    [compiled] = made
    record = json.loads((bundle / "model_fold0" / "train_summary.json").read_text())["techniques"]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "torch.compile" in line]
    if fail:
        assert compiled.calls == 1  # the first call failed; every later one went to the plain network
        assert record["compile"]["asked"] and not record["compile"]["used"]
        assert warnings == ["warning: torch.compile failed, training eagerly: RuntimeError: InductorError: "
                            "CppCompileError: C++ compile error"]
    else:
        assert compiled.calls == summary["epochs_run"] * json.loads(
            (bundle / "model_fold0" / "metrics.json").read_text())["rows"][0]["steps"]
        assert record["compile"]["used"] and record["compile"]["first_call_s"] > 0 and not warnings
    assert record["loader"] == "ThreadDataLoader" and record["cache"] == "RAM" and record["precision"] == summary["precision"]
    assert 0 < summary["setup_s"] < summary["seconds"] + summary["setup_s"]


def test_compile_off_is_the_default_and_an_out_of_memory_is_not_a_compiler_failure() -> None:
    import torch

    from autotune.trainer.compiled import CompiledNet, CompileRecord, compiled_net

    model = torch.nn.Linear(2, 2)
    net, record = compiled_net(model, asked=False)
    assert net is model and not record.asked and not record.used

    def out_of_memory(*_: Any) -> Any:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    said: list[str] = []
    wrapped = CompiledNet(model, out_of_memory, CompileRecord(asked=True, used=True), said.append)
    with pytest.raises(torch.OutOfMemoryError):
        wrapped(torch.ones(1, 2))
    assert wrapped.compiled is not None and wrapped.record.used and not said  # the step-down handles it, not eager
    assert wrapped.training and list(wrapped.parameters()) == list(model.parameters())
