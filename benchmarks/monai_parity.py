"""Does the probe allocate what MONAI's training allocates? The template's own code against autotune's loop.

    python -m benchmarks.monai_parity WORK/segresnet_0 WORK/dints_0 WORK/segresnet2d_0 [--patches 2] [--json out.json]

For each MONAI bundle (hash-checked first: the code run here is the known version's), on the CPU in fp32,
with the same network, loss, optimizer and loader batch (built by ``autotune.auto3dseg``), the tracked peak
(``autotune.probe.memory``, the probe's own count) of:

- SegResNet: MONAI's ``Segmenter.train_epoch`` itself, imported from the bundle's ``scripts/segmenter.py``,
  over a loader of the same batch, against ``autotune.auto3dseg``'s loop (what the probe and the estimator run);
- SegResNet2D: the same ``Segmenter.train_epoch`` (its bundle's copy) over the 2D network wrapped in the bundle's
  own ``segmenter_2d.WrappedModel2D``, against autotune's loop and wrapper;
- DiNTS: ``train.py``'s training loop, its own source lines (from ``inputs_l = (`` to ``idx_iter += 1``,
  lines 574-621 of version 21ed8e5) executed as they are on the CPU (the script itself insists on CUDA),
  against the same.

Each runs three loader batches from the same freshly built state; the peak of the steady state is compared.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.common import parser

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

#: train.py lines (1-based, inclusive) of DiNTS 21ed8e5's loop body over one loader batch
DINTS_LOOP_LINES = {"21ed8e5": (571, 621)}


def _parts(bundle: Path, seed: int = 0) -> tuple[BundleConfig, Any, Any, Any, Any]:
    import torch

    from autotune.auto3dseg.build import build_model_loss_optimizer
    from autotune.bundles.config import load_bundle_config

    cfg = load_bundle_config(bundle)
    torch.manual_seed(seed)
    model, loss, optimizer_part, accuracy = build_model_loss_optimizer(cfg, "cpu")
    return cfg, model, loss, optimizer_part.instantiate(params=model.parameters()), accuracy


def _batch(cfg: BundleConfig, patches: int) -> tuple[Any, Any]:
    from autotune.auto3dseg.workload import MonaiWorkload

    batch, _ = MonaiWorkload(cfg, None, None).make_loader_batches(cfg, patches, "cpu")
    return batch


def _tracked(run: Any, *existing: Any) -> int:
    from autotune.probe.tracker import MemoryTracker, tensors_of

    tracker = MemoryTracker("cpu")
    tracker.track(tensors_of(*existing))
    with tracker, contextlib.redirect_stdout(io.StringIO()):
        run()
    peak = tracker.peak_bytes
    tracker.stop()
    return int(peak)


def autotune_loop_peak(bundle: Path, patches: int) -> int:
    """The tracked peak of ``autotune.auto3dseg``'s loop over three loader batches."""
    from autotune.auto3dseg.workload import MonaiWorkload

    cfg, model, loss, optimizer, accuracy = _parts(bundle)
    batch = _batch(cfg, patches)
    workload = MonaiWorkload(cfg, loss, accuracy)

    def run() -> None:
        for _ in range(2):  # a new loop runs one batch more: three in all
            workload.train_loader_batch(model, loss, optimizer, batch, patches, None)

    return _tracked(run, model, optimizer, batch)


def _bundle_scripts(bundle: Path, module: str) -> Any:
    """The bundle's ``scripts/<module>.py`` imported as a package module (after its hash was checked)."""
    from autotune.auto3dseg.recognise import identify

    identify(bundle)
    package = f"_monai_bundle_{abs(hash(str(bundle)))}"
    if package not in sys.modules:
        spec = importlib.util.spec_from_file_location(package, bundle / "scripts" / "__init__.py",
                                                      submodule_search_locations=[str(bundle / "scripts")])
        assert spec is not None and spec.loader is not None
        sys.modules[package] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[package])
    return importlib.import_module(f"{package}.{module}")


def segresnet_train_epoch_peak(bundle: Path, patches: int) -> int:
    """The tracked peak of MONAI's ``Segmenter.train_epoch`` over three loader batches of ``patches``; for
    SegResNet2D, over the same 2D network wrapped in the bundle's own ``segmenter_2d.WrappedModel2D``."""
    import torch

    segmenter = _bundle_scripts(bundle, "segmenter").Segmenter
    cfg, model, loss, optimizer, accuracy = _parts(bundle)
    if cfg.monai_template == "segresnet2d":  # MONAI's wrapper around the same network (same parameters)
        wrapper = _bundle_scripts(bundle, "segmenter_2d").WrappedModel2D
        with contextlib.redirect_stdout(io.StringIO()):
            model = wrapper(model.net, memory_format=model.memory_format)
    batch = _batch(cfg, patches)
    loader = [{"image": batch[0], "label": batch[1]}] * 3

    def run() -> None:
        segmenter.train_epoch(segmenter.__new__(segmenter), model=model, train_loader=loader, optimizer=optimizer,
                              loss_function=loss, acc_function=accuracy,
                              grad_scaler=torch.amp.GradScaler("cuda", enabled=False), epoch=0, rank=0,
                              global_rank=0, num_epochs=1, sigmoid=cfg.sigmoid, use_amp=False,
                              use_cuda=False, channels_last=cfg.channels_last, num_steps_per_image=1)

    return _tracked(run, model, optimizer, batch)


def dints_train_loop_peak(bundle: Path, patches: int) -> int:
    """The tracked peak of DiNTS ``train.py``'s own loop lines, run on the CPU over three loader batches."""
    import monai
    import torch

    from autotune.auto3dseg.recognise import identify

    version = identify(bundle)
    first, last = DINTS_LOOP_LINES[version.version]
    lines = (bundle / "scripts" / "train.py").read_text().splitlines()[first - 1:last]
    code = compile(textwrap.dedent("\n".join(lines)), str(bundle / "scripts" / "train.py"), "exec")
    cfg, model, loss, optimizer, _ = _parts(bundle)
    batch = _batch(cfg, patches)
    device = torch.device("cpu")
    namespace: dict[str, Any] = {
        "monai": monai, "torch": torch, "train_loader": [{"image": batch[0], "label": batch[1]}] * 3,
        "num_patches_per_iter": cfg.num_patches_per_iter if patches is None else patches, "device": device,
        "model": model, "amp": False, "loss_function": loss, "optimizer": optimizer, "step": 0, "idx_iter": 0,
        "epoch_loss": 0.0, "loss_torch": None,
    }

    def run() -> None:
        model.train()
        namespace["loss_torch"] = torch.zeros(2, dtype=torch.float, device=device)
        exec(code, namespace)  # noqa: S102 - MONAI's own lines, hash-checked: what its training runs

    return _tracked(run, model, optimizer, batch)


def compare(bundle: Path, patches: int) -> dict[str, Any]:
    """MONAI's own code against autotune's loop for one bundle: both peaks and their difference."""
    from autotune.bundles.config import load_bundle_config

    template = load_bundle_config(bundle).monai_template
    monai_peak = (dints_train_loop_peak if template == "dints" else segresnet_train_epoch_peak)(bundle, patches)
    ours = autotune_loop_peak(bundle, patches)
    return {"bundle": str(bundle), "template": template, "patches": patches, "monai_code_peak_bytes": monai_peak,
            "autotune_loop_peak_bytes": ours, "difference_bytes": ours - monai_peak,
            "relative_difference": (ours - monai_peak) / monai_peak}


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, report_only=False)
    p.add_argument("bundles", nargs="+", type=Path)
    p.add_argument("--patches", type=int, default=2)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    results = [compare(bundle, args.patches) for bundle in args.bundles]
    for row in results:
        print(f"{row['template']:10s} N={row['patches']}: MONAI's code {row['monai_code_peak_bytes']:,} B, autotune's loop "
              f"{row['autotune_loop_peak_bytes']:,} B, difference {row['difference_bytes']:+,} B "
              f"({100 * row['relative_difference']:+.4f}%)")
    if args.json:
        args.json.write_text(json.dumps({"results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
