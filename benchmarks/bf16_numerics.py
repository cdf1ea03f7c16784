"""Where bf16 autocast on the CPU departs from fp32, op by op, in one training pass of a bundle.

For a few real training batches of BUNDLE (its own loader: crops, flips), with the weights of a
checkpoint (default: freshly built), runs the same forward and backward pass in fp32 and under
``torch.autocast("cpu", dtype=torch.bfloat16)`` and compares, with forward hooks on every module:

- each module's output (relative error ``|bf16 - fp32| / |fp32|``, and whether it is finite);
- the loss, and every parameter's gradient (relative error; the whole gradient's cosine with fp32's);

under CPU autocast as PyTorch has it (``plain CPU autocast``) and as autotune runs it, with CUDA's
float32 op list on top (``autotune autocast``: ``autotune.autocast``). Prints the modules with the largest error, the first non-finite one if any, and
writes JSON. It measures numerics, not speed.

    python -m benchmarks.bf16_numerics WORK/unet_0 [--checkpoint WORK/unet_0/model_fold0/last.pt] [--batches 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.common import cpu_name, parser, write_json

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

REPO = Path(__file__).resolve().parents[1]


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__, report_only=False)
    p.add_argument("bundle")
    p.add_argument("--checkpoint", default=None, help="weights to load (default: the network as built)")
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--top", type=int, default=8, help="modules listed, largest error first")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/bf16_numerics_<algo>.json)")
    return p.parse_args(argv)


def _batches(cfg: BundleConfig, count: int) -> list[tuple[Any, Any]]:
    from autotune.trainer.ddp import DistContext
    from autotune.trainer.infer import plain_tensor
    from autotune.trainer.setup import setup_data

    data = setup_data(cfg, DistContext(), "fast", 1, None, False)
    data.train_transforms.set_random_state(seed=0)
    out = []
    for batch in data.train_loader:
        out.append((plain_tensor(batch["image"]).float(), plain_tensor(batch["label"]).float()))
        if len(out) == count:
            break
    return out


def _pass(model: Any, loss_fn: Any, image: Any, label: Any, dtype: Any, fp32_list: bool) -> dict[str, Any]:
    """Outputs of every module, the loss and the gradients of one pass (``dtype`` None: fp32; ``fp32_list``:
    autotune's autocast, else PyTorch's)."""
    import torch

    from autotune.autocast import autocast

    outputs: dict[str, Any] = {}
    names = {m: n or "network" for n, m in model.named_modules()}

    def hook(module: Any, inputs: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor):
            outputs.setdefault(f"{names[module]} ({type(module).__name__})", output.detach().float().clone())

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    model.zero_grad(set_to_none=True)
    try:
        with (autocast("cpu", dtype) if fp32_list else
              torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None)):
            loss = loss_fn(model(image), label)
        loss.backward()
    finally:
        for h in handles:
            h.remove()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"outputs": outputs, "loss": float(loss.detach()), "grads": grads}


def _rel(a: Any, b: Any) -> float:
    import torch

    if not bool(torch.isfinite(a).all()):
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _compare(ref: dict, low: dict) -> dict[str, Any]:
    import torch

    modules = {k: _rel(low["outputs"][k], v) for k, v in ref["outputs"].items() if k in low["outputs"]}
    first = next((k for k, v in low["outputs"].items() if not bool(torch.isfinite(v).all())), None)
    flat_ref = torch.cat([g.flatten() for g in ref["grads"].values()])
    flat_low = torch.cat([low["grads"][k].flatten() for k in ref["grads"]])
    cosine = float(torch.nn.functional.cosine_similarity(flat_low, flat_ref, dim=0))
    grads = {k: _rel(low["grads"][k], v) for k, v in ref["grads"].items()}
    return {"loss_fp32": ref["loss"], "loss_bf16": low["loss"], "gradient_cosine": cosine,
            "gradient_rel_error": _rel(flat_low, flat_ref), "first_nonfinite_module": first,
            "module_rel_error": modules, "param_grad_rel_error": grads}


def markdown_table(*reports: dict[str, Any]) -> str:
    """One row per bundle and autocast: the loss and gradient against fp32 over the batches, the module with
    the largest output error, and the first non-finite module (what BENCHMARKS.md shows)."""
    lines = ["| bundle (weights) | autocast | loss bf16 - fp32 (max abs) | gradient cosine (min) | gradient rel. error "
             "(max) | largest module output error | first non-finite |", "|---|---|---:|---:|---:|---|---|"]
    for report in reports:
        weights = "trained" if report.get("checkpoint") else "as built"
        for name, batches in report["runs"].items():
            worst: dict[str, float] = {}
            for b in batches:
                for k, v in b["module_rel_error"].items():
                    worst[k] = max(worst.get(k, 0.0), v)
            module, error = max(worst.items(), key=lambda kv: kv[1])
            firsts = sorted({b["first_nonfinite_module"] for b in batches} - {None})
            lines.append(f"| {report['algo']} ({weights}) | {name} | "
                         f"{max(abs(b['loss_bf16'] - b['loss_fp32']) for b in batches):.5f} | "
                         f"{min(b['gradient_cosine'] for b in batches):.4f} | "
                         f"{max(b['gradient_rel_error'] for b in batches):.3f} | {error:.4f} ({module.rsplit(' ', 1)[-1].strip('()')}) | "
                         f"{', '.join(firsts) or 'none'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import torch

    import autotune.build as build
    from autotune.bundles.config import load_bundle_config

    args = _args(argv)
    cfg = load_bundle_config(args.bundle)
    torch.manual_seed(cfg.seed)
    model = build.build_network(cfg)
    if args.checkpoint:
        model.load_state_dict(torch.load(args.checkpoint, map_location="cpu", weights_only=True)["model"])
    model.train()
    loss_fn = build.build_loss(cfg)
    runs: dict[str, list[dict[str, Any]]] = {"plain CPU autocast": [], "autotune autocast": []}
    for image, label in _batches(cfg, args.batches):
        ref = _pass(model, loss_fn, image, label, None, False)
        runs["plain CPU autocast"].append(_compare(ref, _pass(model, loss_fn, image, label, torch.bfloat16, False)))
        runs["autotune autocast"].append(_compare(ref, _pass(model, loss_fn, image, label, torch.bfloat16, True)))
    report = {"bundle": str(args.bundle), "algo": cfg.algo, "checkpoint": args.checkpoint, "cpu": cpu_name(),
              "bf16_native": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()), "torch": torch.__version__,
              "runs": runs}
    for name, batches in runs.items():
        print(f"{name}: loss fp32/bf16 " + ", ".join(f"{b['loss_fp32']:.4f}/{b['loss_bf16']:.4f}" for b in batches)
              + "; gradient cosine " + ", ".join(f"{b['gradient_cosine']:.4f}" for b in batches)
              + "; gradient rel. error " + ", ".join(f"{b['gradient_rel_error']:.3f}" for b in batches))
        worst: dict[str, float] = {}
        for b in batches:
            for k, v in b["module_rel_error"].items():
                worst[k] = max(worst.get(k, 0.0), v)
        for k, v in sorted(worst.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"    {v:9.4f}  {k}")
        firsts = {b["first_nonfinite_module"] for b in batches} - {None}
        print(f"  first non-finite module: {', '.join(sorted(firsts)) or 'none'}")
    out = Path(args.out or REPO / "benchmarks" / "results" / f"bf16_numerics_{cfg.algo}.json")
    write_json(out, report)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
