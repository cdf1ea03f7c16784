"""The seed's snippet on a CPU-only host: ``autotune.BundleGen`` over MONAI's official templates, MONAI's default
algorithms, ``gpu_customization=True`` and a CPU memory limit; then each bundle read back through MONAI's own
``ConfigParser`` and held against the template family's key table.

    python -m benchmarks.monai_snippet --templates ../shared/monai/algorithm_templates --work /tmp/snippet \\
        --memory-limit 6GiB [--anisotropic] [--out benchmarks/results/monai_snippet.json]

``--anisotropic`` keeps every fourth slice 4 mm apart (1 x 1 x 4 mm), so MONAI's ``pre_check_skip_algo``
generates SegResNet2D too; without it the data is isotropic and MONAI skips SegResNet2D. The networks stay as
MONAI generates them (no shrinking); the images are small synthetic ones, so the rois are the templates' own
for such data. What it checks: every generated bundle is tuned (``autotune/tuning.yaml`` status), its tuned
values are in the template's own keys as MONAI's ``ConfigParser`` resolves them (``num_patches_per_iter``,
``num_sw_batch_size``, the validation device), and ``auto_scale_allowed`` is off. A failed check is a row with
``ok: false`` and exit code 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import parser


def _dataset(out: Path, anisotropic: bool) -> Path:
    import nibabel as nib
    import numpy as np

    from autotune.data.synthetic import make_demo_dataset

    data = make_demo_dataset(out, cases=8, size=48, classes=2, seed=0)
    if anisotropic:
        for path in sorted((data / "imagesTr").glob("*.nii.gz")) + sorted((data / "labelsTr").glob("*.nii.gz")):
            array = np.asarray(nib.load(path).dataobj)[:, :, ::4].copy()
            nib.save(nib.Nifti1Image(array, np.diag([1.0, 1.0, 4.0, 1.0])), path)
    return data


def _resolved(root: Path) -> Any:
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config(sorted(str(p) for p in (root / "configs").iterdir() if p.suffix in (".yaml", ".json")))
    return parser


def _get(parser: Any, *keys: str) -> Any:
    for key in keys:
        if key in parser:
            return parser.get_parsed_content(key)
    return None


def _check(root: Path) -> dict[str, Any]:
    """One bundle: its record, the values MONAI's ConfigParser resolves, and whether they are the tuned ones."""
    from autotune.families import family_of

    tuning_path = root / "autotune" / "tuning.yaml"
    tuning = yaml.safe_load(tuning_path.read_text()) if tuning_path.is_file() else {}
    parser = _resolved(root)
    view = family_of(root).load_config(root)
    keys = family_of(root).tunable_keys(view)
    resolved = {"num_patches_per_iter": view["num_patches_per_iter"], "num_sw_batch_size": view["num_sw_batch_size"],
                "sw_input_on_cpu": view["sw_input_on_cpu"]}
    scale = _get(parser, "auto_scale_allowed", "training#auto_scale_allowed")
    status = (tuning or {}).get("status")
    sw_key = keys["num_sw_batch_size"][0]  # the key table's key, resolved by MONAI's ConfigParser itself
    sw_resolved = _get(parser, sw_key)
    ok = (status == "tuned" and scale is False
          and resolved["num_patches_per_iter"] == tuning.get("num_patches_per_iter")
          and resolved["num_sw_batch_size"] == tuning.get("num_sw_batch_size") == sw_resolved
          and resolved["sw_input_on_cpu"] == (tuning.get("validation_device") == "cpu"))
    return {"bundle": root.name, "status": status, "reason": (tuning or {}).get("reason"), "keys": keys,
            "tuned": {k: tuning.get(k) for k in ("num_patches_per_iter", "num_sw_batch_size", "validation_device")},
            "read_back_by_monai": resolved, "sw_batch_by_its_key": sw_resolved, "auto_scale_allowed": scale,
            "ok": bool(ok)}


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, report_only=False)
    p.add_argument("--templates", required=True, help="MONAI's algorithm_templates folder")
    p.add_argument("--work", required=True, help="an empty work folder")
    p.add_argument("--memory-limit", default="6GiB")
    p.add_argument("--strategy", default="fast")
    p.add_argument("--anisotropic", action="store_true")
    p.add_argument("--out", default=None)
    p.add_argument("--check-only", action="store_true",
                        help="run the checks on the bundles already in --work/run (tuned by an earlier run)")
    args = p.parse_args(argv)

    import autotune

    out = Path(args.out).resolve() if args.out else None
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)  # MONAI's SegResNet algo writes runner.log into the working folder
    if args.check_only:
        return _report(args, out, [str(p.parent.parent) for p in sorted((work / "run").glob("*/scripts/algo.py"))],
                       None)
    data = _dataset(work / "data", args.anisotropic)
    analysed = autotune.analyze(data, work / "run", num_fold=2, progress=False)
    started = time.perf_counter()
    # the seed's snippet, with autotune.BundleGen in place of MONAI's and a CPU limit
    gen = autotune.BundleGen(algo_path=str(work / "run"), data_stats_filename=analysed.datastats,
                             data_src_cfg_name=analysed.data_src, templates_path_or_url=args.templates)
    bundles = gen.generate(str(work / "run"), num_fold=1, gpu_customization=True,
                           gpu_customization_specs={"universal": {"num_trials": 20,
                                                                  "range_num_images_per_batch": [1, 4],
                                                                  "range_num_sw_batch_size": [1, 8]}},
                           device="cpu", memory_limit=args.memory_limit, strategy=args.strategy)
    return _report(args, out, bundles, time.perf_counter() - started)


def _report(args: argparse.Namespace, out: Path | None, bundles: list[str], seconds: float | None) -> int:
    import torch

    rows = [_check(Path(b)) for b in bundles]
    native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    print(f"{'bundle':16} {'status':11} {'patches':>7} {'sw':>4} {'monai reads':>14} {'auto_scale':>10}  ok")
    for row in rows:
        back = row["read_back_by_monai"]
        print(f"{row['bundle']:16} {str(row['status']):11} {str(row['tuned']['num_patches_per_iter']):>7} "
              f"{str(row['tuned']['num_sw_batch_size']):>4} {back['num_patches_per_iter']:>7}/{back['num_sw_batch_size']:<6} "
              f"{str(row['auto_scale_allowed']):>10}  {row['ok']}")
    command = "python " + " ".join(sys.argv)
    result = {"command": command,
              "machine": f"{os.cpu_count()} CPU cores, {platform.processor() or platform.machine()}, native bf16 "
                         f"{native}; torch {torch.__version__}", "anisotropic": args.anisotropic,
              "memory_limit": args.memory_limit, "strategy": args.strategy,
              "generate_and_tune_seconds": None if seconds is None else round(seconds, 1),
              "bundles": rows, "all_ok": all(r["ok"] for r in rows)}
    if seconds is None and out is not None and out.is_file():  # checks rerun: the run's own command and time kept
        earlier = json.loads(out.read_text())
        result.update(command=earlier.get("command"), checks_rerun_by=command,
                      generate_and_tune_seconds=earlier.get("generate_and_tune_seconds"))
    if out is not None:
        from autotune.files import atomic_write_json

        atomic_write_json(out, result)
    return 0 if result["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
