"""Search benchmark on full-size templates: the edge found and confirmed, the probes it took,
the same answer undisturbed, killed and resumed, and with two workers; `fast` against `tpe`.

Cases are (dataset, template, memory limit): full-size templates (no preset), the demo data
(``autotune demo-data`` defaults) and the shared Task04_Hippocampus, limits chosen by hand as
round figures (not from the estimator). For each case:

- truth: on the CPU the probe and the estimator count bytes with the same tracker, so the
  estimator scanned at every N from 1 up to the first that does not fit gives the true
  edge for the tracked peak (``est_max``); the search's own real probe at N (fits) and at
  N+1 (does not), or N+1 settled by the CPU calibration's stated bound (``edge_check``: 0%, the
  probe and the estimator share one tracker), confirm it, and where the edge is small (``--exhaustive-probe-max``) real
  probes at every N = 1 .. edge+1 check it again;
- ``fast`` undisturbed (fresh study): maximum found, real training probes, all probes, wall s;
- the same search killed with SIGKILL after its first finished trial and resumed;
- two workers started together on one fresh study (``workers_share``);
- ``tpe`` with 20 trials on the cases in ``--tpe-cases`` (wall time against ``fast``).

Every search is given the template's range of patches per iteration explicitly (``[1, top]``), so the
training-set cap (``autotune.search.handoff.cap_range``: 2 on the 6-case demo data) does not stop it
below the memory edge this benchmark checks.

    python -m benchmarks.bench_search                      # writes benchmarks/results/search.json
    python -m benchmarks.bench_search --cases demo:unet:256MiB --tpe-cases ''
    python -m benchmarks.bench_search --table-from benchmarks/results/search.json   # the table, from the JSON(s)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import LoadSampler, parser, read_json, write_json

REPO = Path(__file__).resolve().parents[1]


MARGIN = 0.10
HIPPOCAMPUS = Path("/work/shared/datasets/Task04_Hippocampus")
DEFAULT_CASES = "demo:unet:128MiB,demo:unet:256MiB,demo:unet:512MiB,demo:segresnet:1GiB,demo:dints:1GiB," \
                "hippocampus:unet:256MiB"
VALUES = ("num_patches_per_iter", "max_num_patches_per_iter", "num_sw_batch_size", "validation_device")
WORKER = """
import json
from autotune.stages import tune
r = tune([{bundle!r}], {specs!r}, device="cpu", memory_limit={limit}, storage={storage!r}, margin={margin},
                 workers_share=True, write_back=False, progress=None)[0]
print(json.dumps({{k: r.get(k) for k in {values!r}}}))
"""


def _bundles(root: Path, dataset: str, algos: list[str]) -> dict[str, Path]:
    from autotune.data.analyze import analyze
    from autotune.data.synthetic import make_demo_dataset
    from autotune.facade.bundlegen import BundleGen

    source = make_demo_dataset(root / "demo-data") if dataset == "demo" else HIPPOCAMPUS
    work = root / f"work-{dataset}"
    res = analyze(source, work, num_fold=1, progress=False)
    gen = BundleGen(work, algos=algos, data_stats_filename=res.datastats, data_src_cfg_name=res.data_src)
    return {b["algo"]: Path(b["path"]) for b in gen.generate(work, num_fold=1)}


def _estimate_edge(bundle: Path, budget: int, hi: int) -> tuple[int, dict[int, int], float]:
    """Scan the estimator at N = 1, 2, ... until one does not fit: (edge, peaks, seconds)."""
    from autotune.probe.estimate import estimate

    start, peaks, edge = time.perf_counter(), {}, 0
    for n in range(1, hi + 1):
        peaks[n] = int(estimate(bundle, phases=("train",), num_patches_per_iter=n)["train_peak_bytes"])
        if peaks[n] > budget:
            break
        edge = n
    return edge, peaks, time.perf_counter() - start


def _probe_edge(bundle: Path, limit: int, budget: int, upto: int) -> dict[str, Any]:
    from autotune.probe.runner import run_probe

    start, peaks, edge = time.perf_counter(), {}, 0
    for n in range(1, upto + 1):
        res = run_probe(bundle, num_patches_per_iter=n, device="cpu", memory_limit=limit, phases=("train",))
        peaks[n] = res.get("peak_bytes")
        if res["status"] != "ok" or res["peak_bytes"] > budget:
            break
        edge = n
    return {"edge": edge, "peaks": peaks, "seconds": round(time.perf_counter() - start, 1)}


def _trials(storage: str, study_name: str) -> list[Any]:
    """Trials of a key's study and of its ``-infer`` sibling (fast, estimate: one study per phase)."""
    import optuna

    names = {s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    return [t for name in (study_name, study_name + "-infer") if name in names
            for t in optuna.load_study(study_name=name, storage=storage).get_trials()]


def _specs(hi: int, trials: int | None = None) -> dict[str, Any]:
    """The template's whole range, given explicitly (past the training-set cap); ``trials`` for tpe."""
    return {"universal": {"range_num_patches_per_iter": [1, hi], **({"num_trials": trials} if trials else {})}}


def _fast(bundle: Path, limit: int, storage: str, hi: int, strategy: str = "fast", trials: int = 20
          ) -> dict[str, Any]:
    from autotune.stages import tune

    specs = _specs(hi, trials if strategy == "tpe" else None)
    start = time.perf_counter()
    with LoadSampler() as load:
        res = tune([bundle], specs, device="cpu", memory_limit=limit, storage=storage, strategy=strategy,
                           margin=MARGIN, progress=None, write_back=False)[0]
    seconds = time.perf_counter() - start
    done = [t for t in _trials(storage, res["study_name"]) if t.user_attrs.get("kind") == "probe"
            and "reused_trial" not in t.user_attrs]
    train = {t.params["num_patches_per_iter"]: t.user_attrs for t in done if t.user_attrs.get("phases") == ["train"]}
    return {"values": {k: res.get(k) for k in VALUES}, "status": res.get("status"), "seconds": round(seconds, 1),
            "probes": len(done), "train_probes": len(train), "study_name": res["study_name"],
            "train_points": {n: [a.get("status"), a.get("peak_bytes")] for n, a in sorted(train.items())},
            "edge_check": res.get("edge_check"),
            "load_during_search": load.summary()}


def _killed_and_resumed(bundle: Path, limit: int, storage: str, study_name: str, hi: int) -> dict[str, Any]:
    from optuna.trial import TrialState

    from autotune.stages import tune

    cmd = [sys.executable, "-m", "autotune", "tune", str(bundle), "--device", "cpu", "--memory-limit", str(limit),
           "--storage", storage, "--range-num-images-per-batch", "1", str(hi), "--quiet"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    killed_after = None
    while proc.poll() is None:
        time.sleep(0.5)
        try:
            trials = _trials(storage, study_name)
        except Exception:  # the study does not exist yet
            continue
        complete = [t for t in trials if t.state == TrialState.COMPLETE]
        if complete:
            killed_after = len(complete)
            os.killpg(proc.pid, signal.SIGKILL)
            break
    proc.wait()
    res = tune([bundle], _specs(hi), device="cpu", memory_limit=limit, storage=storage, margin=MARGIN,
               progress=None, write_back=False)[0]
    return {"values": {k: res.get(k) for k in VALUES}, "killed_after_trials": killed_after,
            "finished_before_kill": killed_after is None}


def _two_workers(bundle: Path, limit: int, storage: str, hi: int) -> list[dict[str, Any]]:
    code = WORKER.format(bundle=str(bundle), specs=_specs(hi), limit=limit, storage=storage,
                         margin=MARGIN, values=VALUES)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, cwd=str(REPO)) for _ in range(2)]
    out = []
    for proc in procs:
        stdout, _ = proc.communicate()
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        out.append(json.loads(lines[-1]) if lines else {"error": f"exit {proc.returncode}"})
    return out


def _case(root: Path, bundle: Path, dataset: str, algo: str, limit_text: str, args: argparse.Namespace) -> dict:
    from autotune.bundles.config import load_bundle_config
    from autotune.probe.allowances import NO_ALLOWANCE, allocator_budget
    from autotune.utils import parse_bytes

    limit = parse_bytes(limit_text, "limit")
    budget = allocator_budget(limit, MARGIN, NO_ALLOWANCE)  # the CPU: no context outside the allocator
    hi = int(load_bundle_config(bundle)["tuning_ranges"]["num_patches_per_iter"][1]) \
        if "tuning_ranges" in load_bundle_config(bundle) else 64
    tag = f"{dataset}-{algo}-{limit_text}"
    row: dict[str, Any] = {"dataset": dataset, "algo": algo, "limit": limit_text, "limit_bytes": limit,
                           "budget_bytes": budget, "range_hi": hi}
    est_max, est_peaks, est_s = _estimate_edge(bundle, budget, hi)
    row["estimate_scan"] = {"edge": est_max, "estimates": len(est_peaks), "seconds": round(est_s, 1)}
    fast = _fast(bundle, limit, f"sqlite:///{root / f'{tag}-fast.db'}", hi)
    row["fast"] = fast
    points = fast["train_points"]
    found = fast["values"]["max_num_patches_per_iter"]
    bounded = (fast.get("edge_check") or {}).get("train") or {}
    above = found + 1 if found else None
    row["confirmed"] = bool(found and points.get(found, [None])[0] == "ok" and points[found][1] <= budget and (
        found == hi or (above in points and (points[above][0] == "oom" or points[above][1] > budget))
        or (bounded.get("how") == "bounded" and bounded.get("n") == above)))
    row["edge_above"] = "top of range" if found == hi else ("probed" if above in points else bounded.get("how"))
    row["estimate_equals_measured"] = all(est_peaks.get(n) == p[1] for n, p in points.items() if p[0] == "ok"
                                          and n in est_peaks)
    row["estimates_at_probes"] = {n: est_peaks.get(n) for n in points}
    row["exact"] = found == est_max
    if est_max <= args.exhaustive_probe_max:
        row["probe_scan"] = _probe_edge(bundle, limit, budget, min(est_max + 1, hi))
    print(f"  {tag}: fast {fast['values']} in {fast['seconds']} s, {fast['train_probes']} training probes "
          f"({fast['probes']} in all); estimator edge {est_max}", flush=True)
    if not args.skip_kill:
        row["killed_resumed"] = _killed_and_resumed(bundle, limit, f"sqlite:///{root / f'{tag}-kill.db'}",
                                                    fast["study_name"], hi)
        print(f"  {tag}: killed+resumed {row['killed_resumed']}", flush=True)
    if not args.skip_workers:
        row["two_workers"] = _two_workers(bundle, limit, f"sqlite:///{root / f'{tag}-workers.db'}", hi)
        print(f"  {tag}: two workers {row['two_workers']}", flush=True)
    same = [fast["values"]]
    same += [row["killed_resumed"]["values"]] if "killed_resumed" in row else []
    same += row.get("two_workers", [])
    row["same_values_everywhere"] = all(v == fast["values"] for v in same)
    if f"{dataset}:{algo}:{limit_text}" in args.tpe_cases.split(","):
        row["tpe"] = _fast(bundle, limit, f"sqlite:///{root / f'{tag}-tpe.db'}", hi, "tpe", args.tpe_trials)
        print(f"  {tag}: tpe {row['tpe']['values']} in {row['tpe']['seconds']} s", flush=True)
    return row


def markdown_table(*reports: dict[str, Any]) -> str:
    """The markdown table of one or more result JSONs, their rows in order (what BENCHMARKS.md shows)."""
    return _table([row for report in reports for row in report["rows"]])


def _table(rows: list[dict[str, Any]]) -> str:
    head = ("| data | algo | limit | est. edge (scan) | real scan | fast: max found | confirmed N/N+1 | est = measured "
            "| training probes (all) | fast s | killed+resumed | 2 workers | tpe-20 max / s |")
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        f = r["fast"]
        scan = r.get("probe_scan", {}).get("edge", "-")
        kill = r.get("killed_resumed", {}).get("values")
        kill_txt = "-" if kill is None else ("same" if kill == f["values"] else f"DIFFERENT {kill}")
        workers = r.get("two_workers")
        work_txt = "-" if workers is None else ("same" if all(w == f["values"] for w in workers) else "DIFFERENT")
        tpe = r.get("tpe")
        tpe_txt = "-" if tpe is None else f"{tpe['values']['max_num_patches_per_iter']} / {tpe['seconds']}"
        above = f" (N+1 {r['edge_above']})" if r.get("edge_above") else ""
        lines.append(f"| {r['dataset']} | {r['algo']} | {r['limit']} | {r['estimate_scan']['edge']} | {scan} | "
                     f"{f['values']['max_num_patches_per_iter']} (N={f['values']['num_patches_per_iter']}, "
                     f"sw {f['values']['num_sw_batch_size']}) | {'yes' if r['confirmed'] else 'NO'}{above} | "
                     f"{'yes' if r['estimate_equals_measured'] else 'NO'} | {f['train_probes']} ({f['probes']}) | "
                     f"{f['seconds']} | {kill_txt} | {work_txt} | {tpe_txt} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, "search.json", report_only=False)
    p.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated dataset:algo:limit")
    p.add_argument("--tpe-cases", default="demo:unet:128MiB", help="cases also run with tpe")
    p.add_argument("--tpe-trials", type=int, default=20)
    p.add_argument("--exhaustive-probe-max", type=int, default=6,
                        help="probe every N up to edge+1 for real where the edge is at most this")
    p.add_argument("--skip-kill", action="store_true")
    p.add_argument("--skip-workers", action="store_true")
    p.add_argument("--table-from", nargs="+", default=None, help="print the markdown table of result JSONs and exit")
    args = p.parse_args(argv)
    if args.table_from:
        print(markdown_table(*(read_json(Path(path)) for path in args.table_from)))
        return 0

    import monai
    import torch

    cases = [tuple(c.split(":")) for c in args.cases.split(",") if c]
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        root = Path(tmp)
        bundles: dict[str, dict[str, Path]] = {}
        for dataset in sorted({c[0] for c in cases}):
            bundles[dataset] = _bundles(root, dataset, sorted({c[1] for c in cases if c[0] == dataset}))
        for dataset, algo, limit_text in cases:
            rows.append(_case(root, bundles[dataset][algo], dataset, algo, limit_text, args))
            write_json(Path(args.out), {"rows": rows, "partial": True})  # keep what is done should a later case fail
    tpe_rows = [r for r in rows if "tpe" in r]
    summary = {
        "rows": rows,
        "exact_everywhere": all(r["exact"] and r["confirmed"] for r in rows),
        "most_training_probes": max(r["fast"]["train_probes"] for r in rows),
        "same_values_everywhere": all(r["same_values_everywhere"] for r in rows),
        "tpe_over_fast_wall": [round(r["tpe"]["seconds"] / r["fast"]["seconds"], 2) for r in tpe_rows],
        "wall_seconds": round(time.perf_counter() - started, 1),
        "load_average_end": os.getloadavg(),
        "torch": torch.__version__, "monai": monai.__version__,
        "command": " ".join(["python", "benchmarks/bench_search.py", *(argv if argv is not None else sys.argv[1:])]),
    }
    print()
    print(markdown_table(summary))
    print(f"exact and confirmed everywhere: {summary['exact_everywhere']}; most training probes: "
          f"{summary['most_training_probes']}; same values undisturbed/killed+resumed/2 workers: "
          f"{summary['same_values_everywhere']}; tpe/fast wall: {summary['tpe_over_fast_wall']}")
    write_json(Path(args.out), summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
