"""Train with the squared gradient norm of every optimizer step recorded, and the simple noise scale.

    python -m benchmarks.gpu_gradnorm --out grads.json -- BUNDLE --device cuda:0 --epochs 5 ...

runs ``python -m autotune.trainer`` with the same arguments in this process, with a global
optimizer step pre-hook that adds up the squared norms of the gradients the step is about to
apply (after a GradScaler has unscaled them; a step the scaler skips for an inf is not
recorded) and the patches of the forward pass behind them. It writes ``{"steps": [[patches,
|g|^2], ...]}`` to ``--out`` when training ends, whatever its exit code.

``simple_noise_scale`` is McCandlish et al.'s B_simple = tr(Sigma) / |G|^2 ("An Empirical Model
of Large-Batch Training", 2018, Appendix A.1) from the mean squared gradient norms at two batch
sizes: with E|g_B|^2 = |G|^2 + tr(Sigma) / B,

    |G|^2     = (B_big |g_big|^2 - B_small |g_small|^2) / (B_big - B_small)
    tr(Sigma) = (|g_small|^2 - |g_big|^2) / (1 / B_small - 1 / B_big)

Here the two batches come from two training runs (the template's batch and the largest fit),
so the norms are taken along two trajectories, not at the same weights: an estimate of the
noise scale over those epochs, as AdaptDL's smoothed one is, not a measurement at a point.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["install", "simple_noise_scale", "main"]


def install(steps: list[tuple[int, Any]]) -> Callable[[], None]:
    """Record (patches, squared gradient norm as a device scalar) for every optimizer step into ``steps``;
    returns the function that removes the hook and the wrapper again."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    import autotune.step as step_module

    original = step_module.train_step
    current = {"patches": 0}

    def train_step(model: Any, loss_fn: Any, optimizer: Any, images: Any, *args: Any, **kwargs: Any) -> Any:
        current["patches"] = int(images.shape[0])  # the rest (labels, precision, scaler, guard) passed on as given
        return original(model, loss_fn, optimizer, images, *args, **kwargs)

    def hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if grads:  # one device scalar per step; read back once, at the end (no sync per step)
            norms = torch._foreach_norm(grads)
            steps.append((current["patches"], torch.stack([n.float() for n in norms]).square().sum()))

    step_module.train_step = train_step  # the epoch loop imports it from the module at each epoch
    handle = register_optimizer_step_pre_hook(hook)

    def uninstall() -> None:
        handle.remove()
        step_module.train_step = original

    return uninstall


def simple_noise_scale(small: Sequence[float], b_small: int, big: Sequence[float], b_big: int) -> dict[str, Any]:
    """B_simple from the squared gradient norms of steps at ``b_small`` and ``b_big`` patches (module
    docstring). ``b_simple`` is None, with ``why``, where the data do not allow it (too few steps,
    equal batches, or an estimate of |G|^2 or tr(Sigma) that is not positive)."""
    out: dict[str, Any] = {"b_small": b_small, "b_big": b_big, "steps_small": len(small), "steps_big": len(big),
                           "mean_sq_small": None, "mean_sq_big": None, "g_sq": None, "trace_sigma": None,
                           "b_simple": None, "why": None}
    if b_small == b_big or not small or not big:
        out["why"] = "needs steps at two different batch sizes"
        return out
    g_small, g_big = statistics.fmean(small), statistics.fmean(big)
    g_sq = (b_big * g_big - b_small * g_small) / (b_big - b_small)
    trace = (g_small - g_big) / (1.0 / b_small - 1.0 / b_big)
    out.update(mean_sq_small=g_small, mean_sq_big=g_big, g_sq=g_sq, trace_sigma=trace)
    if g_sq <= 0 or trace <= 0:
        out["why"] = "the estimate of |G|^2 or tr(Sigma) is not positive: the steps' noise hides the difference"
        return out
    out["b_simple"] = trace / g_sq
    return out


def steps_of(path: Path, patches: int) -> list[float]:
    """The finite squared norms of the steps of ``patches`` patches in a file this script wrote."""
    import math

    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return [float(sq) for b, sq in data.get("steps") or [] if int(b) == int(patches) and math.isfinite(float(sq))]


def _write(path: Path, steps: list[tuple[int, Any]]) -> None:
    import torch

    from autotune.files import atomic_write_json

    values = torch.stack([sq for _, sq in steps]).cpu().tolist() if steps else []
    atomic_write_json(path, {"steps": [[b, v] for (b, _), v in zip(steps, values, strict=True)]})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file for the recorded steps")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then the arguments of autotune train")
    args = parser.parse_args(argv)
    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    from autotune.trainer.__main__ import main as train_main

    steps: list[tuple[int, Any]] = []
    install(steps)
    try:
        return train_main(train_args)
    finally:
        _write(Path(args.out), steps)


if __name__ == "__main__":
    sys.exit(main())
