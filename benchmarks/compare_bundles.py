"""Compare the bundles of two runs field by field: the tuned values and the tuning records.

    python -m benchmarks.compare_bundles BEFORE_WORK AFTER_WORK [--out results/compare.json]

Every key of each bundle's ``configs/hyper_parameters.yaml`` is compared, the ``tuning:`` block
key by key (nested records flattened as ``tuning.handoff.line``). Fields a rerun changes by
nature are listed apart, not compared: timings (samples/s, step spreads, wall seconds, dates,
the hand-off's measured speeds and the verdict they give), paths (the work folder, the storage)
and the plan's ``version`` (absent in blocks written before the field). The hand-off's
verdict depends on measured samples/s: where it differs the table says so, and the memory
answers (largest fit, sliding-window batch, peaks) are what must match.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

TIMING = re.compile(r"(samples_per_s|seconds|spread|speedup|margin$|date$|wall_|efficiency|\.line$|reason$|"
                    r"handed$|^tuning\.num_patches_per_iter$|^num_patches_per_iter$|^num_images_per_batch$|"
                    r"learning_rate|warmup|steps|train_trial|reference_trial|largest_fit_trial|train_peak_bytes$|"
                    r"^tuning\.peak_bytes$|^tuning\.probes$|^tuning\.trials$|handed_to_training|recipe\.batch$)")
PATHS = re.compile(r"(bundle_root|dataroot|datalist|datastats|data_src|storage|study_name|^tuning\.version$)")


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay values."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def compare(before: Path, after: Path) -> dict[str, Any]:
    rows = []
    for config in sorted(before.glob("*/configs/hyper_parameters.yaml")):
        name = config.parent.parent.name
        old = flatten(yaml.safe_load(config.read_text()))
        new = flatten(yaml.safe_load((after / name / "configs" / "hyper_parameters.yaml").read_text()))
        for key in sorted(set(old) | set(new)):
            kind = "timing" if TIMING.search(key) else "path" if PATHS.search(key) else "value"
            same = old.get(key) == new.get(key)
            rows.append({"bundle": name, "key": key, "kind": kind, "same": same,
                         "before": old.get(key, "(absent)"), "after": new.get(key, "(absent)")})
    values = [r for r in rows if r["kind"] == "value"]
    return {"bundles": sorted({r["bundle"] for r in rows}), "fields": len(rows), "values_compared": len(values),
            "values_differing": [r for r in values if not r["same"]],
            "timing_or_path_differing": [r for r in rows if r["kind"] != "value" and not r["same"]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    result = compare(args.before, args.after)
    print(f"{len(result['bundles'])} bundles, {result['fields']} fields, {result['values_compared']} compared as "
          f"values: {len(result['values_differing'])} differ")
    for row in result["values_differing"]:
        print(f"  {row['bundle']}: {row['key']}: {row['before']!r} -> {row['after']!r}")
    print(f"timing and path fields that differ (not compared): {len(result['timing_or_path_differing'])}")
    for row in result["timing_or_path_differing"]:
        print(f"  {row['bundle']}: {row['key']}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 1 if result["values_differing"] else 0


if __name__ == "__main__":
    sys.exit(main())
