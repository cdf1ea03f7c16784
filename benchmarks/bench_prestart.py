"""A fresh process's first fast search with and without starting the probe fork server early.

``autotune.probe.isolation.prestart`` starts the fork server (which imports torch and MONAI)
before the estimator's trace, so the two overlap where there is a second core. Each run is a
fresh interpreter (the one-off start is what is measured), the same full-size bundle, a fresh
study, the order alternating; ``off`` replaces ``prestart`` with a no-op.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_prestart --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import cpu_name, write_json

REPO = Path(__file__).resolve().parents[1]


CHILD = """
import json, sys, tempfile, time
from pathlib import Path
import autotune.probe.isolation as iso
if sys.argv[2] == "off":
    iso.prestart = lambda: False
from autotune.stages import tune
root = Path(tempfile.mkdtemp())
r = tune([sys.argv[1]], {sys.argv[3]: {"range_num_patches_per_iter": [1, 64]}}, device="cpu",
                 memory_limit="1GiB", storage=f"sqlite:///{root}/s.db", strategy="fast", write_back=False,
                 progress=None, handoff="largest")[0]
print(json.dumps({"search_s": r["wall_seconds"], "n": r["max_num_patches_per_iter"]}))
"""


def main() -> None:
    from benchmarks.bench_search import _bundles

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--algo", default="dints")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "prestart.json"))
    args = parser.parse_args()
    bundle = _bundles(Path(tempfile.mkdtemp(prefix="prestart-")), "demo", [args.algo])[args.algo]
    runs: list[dict] = []
    for i in range(args.rounds):
        for mode in (("on", "off") if i % 2 == 0 else ("off", "on")):
            out = subprocess.run([sys.executable, "-c", CHILD, str(bundle), mode, args.algo], capture_output=True,
                                 text=True, check=True)
            runs.append({"mode": mode, **json.loads(out.stdout.strip().splitlines()[-1])})
            print(runs[-1], flush=True)
    median = {m: statistics.median(r["search_s"] for r in runs if r["mode"] == m) for m in ("on", "off")}
    write_json(args.out, {"runs": runs, "median_search_s": median, "algo": args.algo, "machine": cpu_name(),
                          "command": " ".join(sys.argv)})
    print(f"median first search: prestart {median['on']:.2f} s, without {median['off']:.2f} s")


if __name__ == "__main__":
    main()
