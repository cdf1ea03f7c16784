"""Profile one fast search: estimator passes (count, seconds each), probe wall, and the rest (study, key).

Counts in process around ``autotune.probe.estimate.estimate`` and ``autotune.probe.runner.run_probe``.
``REPO`` picks the checkout profiled (to compare a branch with main):

    REPO=/path/to/checkout taskset -c 0 python -m benchmarks.profile_fast hippocampus 1GiB
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = os.environ.get("REPO", str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, REPO)
sys.path.insert(0, REPO + "/benchmarks")


def main() -> None:
    from benchmarks.bench_search import _bundles

    est = importlib.import_module("autotune.probe.estimate")
    runner = importlib.import_module("autotune.probe.runner")
    calls: dict[str, list[Any]] = {"estimate": [], "probe": []}
    orig_est, orig_probe = est.estimate, runner.run_probe

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            start = time.perf_counter()
            out = fn(*a, **k)
            calls[name].append((k.get("phases"), k.get("num_patches_per_iter"), k.get("num_sw_batch_size"),
                                round(time.perf_counter() - start, 2)))
            return out
        return wrapper

    est.estimate, runner.run_probe = timed("estimate", orig_est), timed("probe", orig_probe)
    root = Path(tempfile.mkdtemp(prefix="profile-fast-"))
    dataset = sys.argv[1] if len(sys.argv) > 1 else "hippocampus"
    limit = sys.argv[2] if len(sys.argv) > 2 else "1GiB"
    bundle = _bundles(root, dataset, ["unet"])["unet"]
    from autotune.stages import tune

    start = time.perf_counter()
    r = tune([str(bundle)], {"unet": {"range_num_patches_per_iter": [1, 64]}}, device="cpu",
                     memory_limit=limit, storage=f"sqlite:///{root}/s.db", strategy="fast", write_back=False,
                     progress=None, handoff="largest")[0]
    wall = time.perf_counter() - start
    out = {"wall_s": round(wall, 2), "answer": [r.get("num_patches_per_iter"), r.get("num_sw_batch_size")],
           "probes": r.get("probes"), "estimate_calls": calls["estimate"],
           "estimate_s": round(sum(c[-1] for c in calls["estimate"]), 2), "probe_calls": calls["probe"],
           "probe_s": round(sum(c[-1] for c in calls["probe"]), 2), "passes": r.get("estimator_passes"),
           "edge_check": r.get("edge_check"), "repo": REPO}
    out["other_s"] = round(wall - out["estimate_s"] - out["probe_s"], 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
