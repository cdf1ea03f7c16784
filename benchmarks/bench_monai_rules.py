"""autotune's answer next to MONAI's own batch rules, on MONAI's own bundles, measured under the same limit.

    python -m benchmarks.bench_monai_rules WORK/segresnet_0 WORK/dints_0 --limits 1.25GiB,1.75GiB,16GiB \\
        --device cpu --json benchmarks/results/monai_rules.json

For each bundle and memory limit L:

- MONAI's rule, executed from the bundle's own (hash-checked) scripts: SegResNet's
  ``auto_adjust_network_settings(..., gpu_mem=L in GiB)`` (``scripts/utils.py``; the batch ``train()`` turns
  into crops of one image: the step batch), DiNTS's ``pre_operation`` (``scripts/train.py``, its source run
  with the visible GPU's free memory replaced by L) on a copy of the config: ``training#num_patches_per_iter``;
- autotune's answer: the fast search answered by the estimator alone (``strategy="estimate"``; on the CPU the
  estimator counts exactly what the probe counts, ``benchmarks/monai_parity.py``), in a private storage;
- each batch measured: one probe (the template's own step, ``autotune.auto3dseg``) under L: fits, or out of
  memory (the CPU probe raises the moment its tracked memory crosses L, as a GPU allocator would).
"""

from __future__ import annotations

import ast
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import parser

GIB = 1024**3


def _bundle_module(bundle: Path, module: str) -> Any:
    from benchmarks.monai_parity import _bundle_scripts

    return _bundle_scripts(bundle, module)


def segresnet_rule(bundle: Path, limit: int) -> int:
    """The step batch MONAI's SegResNet picks on a GPU of ``limit`` bytes (Segmenter.__init__ and train())."""
    from autotune.auto3dseg.view import read_parser

    utils = _bundle_module(bundle, "utils")
    parser = read_parser(bundle, "segresnet")
    _, _, _, batch = utils.auto_adjust_network_settings(
        auto_scale_batch=True, auto_scale_roi=bool(parser.get_parsed_content("auto_scale_roi")),
        auto_scale_filters=bool(parser.get_parsed_content("auto_scale_filters")),
        image_size_mm=parser.get_parsed_content("image_size_mm_median"),
        spacing=parser.get_parsed_content("resample_resolution"),
        anisotropic_scales=bool(parser.get_parsed_content("anisotropic_scales")),
        levels=len(parser.get_parsed_content("network#blocks_down")),
        output_classes=int(parser.get_parsed_content("output_classes")), gpu_mem=limit / GIB)
    return int(batch)  # crop mode ratio: batch crops of one image; else batch images: one step either way


def dints_rule(bundle: Path, limit: int) -> int:
    """``training#num_patches_per_iter`` after DiNTS train.py's ``pre_operation`` with ``limit`` bytes free."""
    import torch
    import yaml
    from monai.bundle import ConfigParser

    source = (bundle / "scripts" / "train.py").read_text()
    tree = ast.parse(source)
    wanted = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "pre_operation"]
    module = ast.Module(body=wanted, type_ignores=[])
    namespace: dict[str, Any] = {"ConfigParser": ConfigParser, "os": __import__("os"), "torch": torch,
                                 "get_mem_from_visible_gpus": lambda: [limit]}
    exec(compile(module, str(bundle / "scripts" / "train.py"), "exec"), namespace)  # noqa: S102 - MONAI's own
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "hyper_parameters.yaml"
        shutil.copy(bundle / "configs" / "hyper_parameters.yaml", config)
        raw = yaml.safe_load(config.read_text())
        raw["training"]["auto_scale_allowed"] = True  # the rule as the generated bundle runs it
        config.write_text(yaml.safe_dump(raw, sort_keys=False))
        namespace["pre_operation"]([str(config)])
        return int(yaml.safe_load(config.read_text())["training"]["num_patches_per_iter"])


def probe_under(bundle: Path, n: int, limit: int, device: str, timeout: float) -> dict[str, Any]:
    """One training probe at ``n`` patches under ``limit``: status (ok / oom) and the tracked peak."""
    from autotune.probe.runner import run_probe

    started = time.perf_counter()
    result = run_probe(bundle, num_patches_per_iter=n, phases=("train",), device=device, memory_limit=limit,
                       timeout=timeout)
    return {"num_patches_per_iter": n, "status": result["status"], "train_peak_bytes": result.get("train_peak_bytes"),
            "seconds": round(time.perf_counter() - started, 1)}


def autotune_answer(bundle: Path, limit: int, device: str, storage: str) -> dict[str, Any]:
    """The fast search answered by the estimator (no probe), without writing into the bundle."""
    from autotune.stages import tune

    started = time.perf_counter()
    record = tune([bundle], device=device, memory_limit=limit, storage=storage, strategy="estimate",
                          write_back=False, progress=None)[0]
    return {"status": record["status"], "num_patches_per_iter": record.get("num_patches_per_iter"),
            "max_num_patches_per_iter": record.get("max_num_patches_per_iter"),
            "batch": record.get("batch"), "seconds": round(time.perf_counter() - started, 1)}


def compare(bundle: Path, limit: int, device: str, storage: str, timeout: float) -> dict[str, Any]:
    from autotune.bundles.config import load_bundle_config

    template = load_bundle_config(bundle).monai_template
    monai_n = (segresnet_rule if template == "segresnet" else dints_rule)(bundle, limit)
    ours = autotune_answer(bundle, limit, device, storage)
    row: dict[str, Any] = {"template": template, "memory_limit": limit, "memory_limit_gib": limit / GIB,
                           "monai_rule": probe_under(bundle, monai_n, limit, device, timeout), "autotune": ours}
    if ours["status"] == "tuned":
        row["autotune"]["measured"] = probe_under(bundle, int(ours["num_patches_per_iter"]), limit, device, timeout)
    return row


def main(argv: list[str] | None = None) -> int:
    from autotune.utils import parse_bytes

    p = parser(__doc__, report_only=False)
    p.add_argument("bundles", nargs="+", type=Path)
    p.add_argument("--limits", required=True, help="comma-separated, e.g. 1.25GiB,1.75GiB,16GiB")
    p.add_argument("--device", default="cpu")
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    storage = f"sqlite:///{tempfile.mkdtemp(prefix='monai_rules_')}/studies.db"
    rows = []
    for bundle in args.bundles:
        for text in args.limits.split(","):
            row = compare(bundle, parse_bytes(text.strip()), args.device, storage, args.timeout)
            rows.append(row)
            ours = row["autotune"]
            print(f"{row['template']:10s} limit {row['memory_limit_gib']:.2f} GiB: MONAI's rule "
                  f"{row['monai_rule']['num_patches_per_iter']} -> {row['monai_rule']['status']}; autotune "
                  f"{ours.get('num_patches_per_iter')} ({ours['status']})"
                  + (f" -> {ours['measured']['status']}" if "measured" in ours else ""), flush=True)
            if args.json:
                args.json.write_text(json.dumps({"device": args.device, "results": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
