"""What the claims cost one plain run alone: ``autotune.tune`` of one tiny UNet bundle on a fresh SQLite storage,
with the key and point claims every run takes, against the same run with them left out (a run that shares its
storage with no one), side by side, in turns, in one process.

The probes are the fake-probe hook (``AUTOTUNE_FAKE_PROBE``, no sleep: a point costs no compute), so the storage
is the whole load: the figures are its wall time and its storage calls (every call of Optuna's storage API the
run made, counted on the storage object), per run, median over ``--repeats`` turns of each.

    python -m benchmarks.bench_plain_claims [--repeats 5] [--out benchmarks/results/plain_claims.json]
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import cpu_name, parser, report

FAKE = "sleep=0,base=64MiB,patch=32MiB,window=16MiB"
SPECS = {"universal": {"range_num_images_per_batch": [1, 8], "range_num_sw_batch_size": [1, 4]}}
CALLS = ("create_new_study", "get_study_id_from_name", "get_all_studies", "get_study_user_attrs",
         "set_study_user_attr", "create_new_trial", "set_trial_state_values", "set_trial_param",
         "set_trial_user_attr", "set_trial_system_attr", "get_trial", "get_all_trials", "get_n_trials",
         "get_best_trial", "get_study_directions", "get_trial_id_from_study_id_trial_number")


def _bundle(root: Path) -> Path:
    import autotune

    autotune.make_demo_dataset(root / "data", cases=4, size=24)
    [made] = autotune.generate(root / "data", root / "work", algos="unet", num_fold=1, overrides="tiny",
                               progress=False)
    return Path(made["path"])


@contextlib.contextmanager
def _counted(calls: Counter[str], claims: bool) -> Iterator[None]:
    """Count every storage call the run makes; without ``claims``, the run opens no claim store."""
    from autotune.search.storage import claims as claims_module
    from autotune.search.storage import study

    real_open, real_claims = study.open_storage, claims_module.ClaimStore

    def counting_open(*args: Any, **kwargs: Any) -> Any:
        storage = real_open(*args, **kwargs)
        for name in CALLS:
            method = getattr(storage, name)

            def counted(*a: Any, _name: str = name, _method: Any = method, **k: Any) -> Any:
                calls[_name] += 1
                return _method(*a, **k)

            setattr(storage, name, counted)
        return storage

    study.open_storage = counting_open
    if not claims:
        claims_module.ClaimStore = lambda liveness: None  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        study.open_storage, claims_module.ClaimStore = real_open, real_claims


def _one_run(bundle: Path, root: Path, claims: bool, turn: int) -> dict[str, Any]:
    import shutil

    from autotune.stages import tune

    folder = root / f"{'claims' if claims else 'none'}_{turn}"
    copy = Path(shutil.copytree(bundle, folder / bundle.name))
    calls: Counter[str] = Counter()
    with _counted(calls, claims):
        started = time.perf_counter()
        [record] = tune([copy], SPECS, device="cpu", memory_limit="300MiB", margin=0.1, handoff="largest",
                        storage=f"sqlite:///{folder / 'studies.db'}", progress=None)
        seconds = time.perf_counter() - started
    assert record["status"] == "tuned", record
    return {"seconds": round(seconds, 3), "storage_calls": sum(calls.values()), "by_call": dict(calls),
            "answer": [record["num_patches_per_iter"], record["num_sw_batch_size"]]}


def measure(repeats: int) -> dict[str, Any]:
    os.environ["AUTOTUNE_FAKE_PROBE"] = FAKE
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        bundle = _bundle(root)
        _one_run(bundle, root, True, -1)  # warm: imports, the estimator's trace cache
        runs: dict[str, list[dict[str, Any]]] = {"claims": [], "none": []}
        for turn in range(repeats):
            for claims in (turn % 2 == 0, turn % 2 == 1):  # in turns, each first half the time
                runs["claims" if claims else "none"].append(_one_run(bundle, root, claims, turn))
    summary = {name: {"median_seconds": round(statistics.median(r["seconds"] for r in got), 3),
                      "median_storage_calls": statistics.median(r["storage_calls"] for r in got),
                      "answers": sorted({tuple(r["answer"]) for r in got})}
               for name, got in runs.items()}
    return {"cpu": cpu_name(), "python": platform.python_version(), "repeats": repeats, "fake_probe": FAKE,
            "summary": summary, "runs": runs,
            "date": time.strftime("%Y-%m-%d", time.gmtime())}


def table(report: dict[str, Any]) -> str:
    rows = ["| run | median wall (s) | median storage calls | answer (patches, sw batch) |", "|---|---:|---:|---|"]
    for name, label in (("none", "without claims (before)"), ("claims", "with claims (now)")):
        got = report["summary"][name]
        rows.append(f"| {label} | {got['median_seconds']} | {got['median_storage_calls']:g} | "
                    f"{', '.join(str(list(a)) for a in got['answers'])} |")
    return "\n".join(rows)


def main() -> int:
    p = parser(__doc__, "plain_claims.json")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    report(args, lambda: measure(args.repeats), table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
