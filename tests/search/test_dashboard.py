"""``autotune dashboard`` serves real tuning studies: headless Chromium sees the studies, their trials,
the best trial (the tuned answer) and the memory-against-batch picture.

One tiny UNet bundle is tuned on the CPU at a binding limit (real probes; a training point that
does not fit is a trial), ``autotune dashboard`` is started on that SQLite storage, and headless
Chromium renders the pages (drawn by JavaScript, so a plain HTTP fetch would not show them). Set
``AUTOTUNE_DASHBOARD_SCREENSHOT=/path/to.png`` to also keep the training study's screenshot.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from system_deps import unavailable

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SERVER_START_TIMEOUT_S = 30.0
CHROMIUM_TIMEOUT_S = 60.0
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    # Without these Chromium keeps trying to reach the (closed) network.
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--virtual-time-budget=8000",
)
# A narrow sliding-window range so the real probes take seconds, not a minute.
TINY_SPECS = {"unet": {"range_num_images_per_batch": [1, 64], "range_num_sw_batch_size": [1, 2]}}
MARGIN = 0.10
BUDGET_RGB = (0xFF, 0x7F, 0x0E)  # the budget line's colour in autotune.search.curves.key_curves.memory_figure


@dataclass(frozen=True)
class TunedStudy:
    """The training study written by a real ``tune_bundles`` run (and its inference sibling)."""

    storage_url: str
    name: str
    study_id: int
    num_trials: int
    infer_name: str
    infer_study_id: int
    result: dict


@dataclass(frozen=True)
class Dashboard:
    """A running ``autotune dashboard`` server."""

    base_url: str
    port: int
    process: subprocess.Popen[bytes]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _kill_group(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Terminate ``process`` and everything in its process group (it was started in its own session)."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):  # stragglers (Chromium helpers) and a stuck leader
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=timeout)


def _listening_addresses(port: int) -> set[str]:
    """Local addresses of TCP sockets listening on ``port``, from ``/proc/net/tcp`` and ``tcp6``."""
    found: set[str] = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with contextlib.suppress(OSError), open(table, encoding="ascii") as handle:
            next(handle)  # header
            for line in handle:
                fields = line.split()
                local, state = fields[1], fields[3]
                address_hex, port_hex = local.split(":")
                if state != "0A" or int(port_hex, 16) != port:  # 0A = LISTEN
                    continue
                raw = bytes.fromhex(address_hex)
                # The kernel prints each 32-bit word in host (little-endian) order.
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                family = socket.AF_INET if width == 8 else socket.AF_INET6
                found.add(socket.inet_ntop(family, words))
    return found


def _ss_listening(port: int) -> set[str] | None:
    """Local addresses listening on ``port`` according to ``ss -ltn``; None if ``ss`` is missing."""
    if shutil.which("ss") is None:
        return None
    out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, timeout=10).stdout
    return {line.split()[3].rsplit(":", 1)[0].strip("[]") for line in out.splitlines() if line.strip()}


@pytest.fixture(scope="module")
def tuned_study(tmp_path_factory: pytest.TempPathFactory) -> TunedStudy:
    """Tune one tiny UNet bundle on the CPU into a fresh SQLite storage (real probes)."""
    import optuna

    from autotune.stages import tune

    try:
        from probe_fixtures import make_tiny_bundles
    except ImportError:  # fall back to building the bundle here
        make_tiny_bundles = None
    root = tmp_path_factory.mktemp("dashboard")
    if make_tiny_bundles is not None:
        bundle = make_tiny_bundles(root, algos=("unet",))["unet"]
    else:
        from autotune.bundles.templates import load_overrides
        from autotune.data.analyze import analyze
        from autotune.data.synthetic import make_demo_dataset
        from autotune.facade.bundlegen import BundleGen

        demo = make_demo_dataset(root / "data", cases=2, size=32, classes=2, seed=0)
        work = root / "work"
        result = analyze(demo, work, num_fold=1, progress=False)
        BundleGen(work, algos="unet", data_stats_filename=result.datastats,
                  data_src_cfg_name=result.data_src).generate(work, num_fold=1, overrides=load_overrides("tiny"))
        bundle = work / "unet_0"
    from autotune.probe.estimate import fit_memory_model

    model = fit_memory_model(bundle, phase="train", device="cpu")
    limit = int((model.intercept + 3.5 * model.slope) / (1 - MARGIN))  # binds: about 3.5 patches' worth
    storage_url = f"sqlite:///{root / 'studies.db'}"
    # write_back=False: the dashboard only needs the studies, not the tuned bundle.
    [result] = tune([bundle], TINY_SPECS, device="cpu", memory_limit=limit, storage=storage_url,
                            strategy="fast", margin=MARGIN, progress=None, write_back=False)
    assert result["status"] == "tuned", result

    summaries = optuna.get_all_study_summaries(storage_url, include_best_trial=False)
    # the key's two studies, its claims (every run claims what it probes) and the one of the workers that tuned
    # here (this run, ended)
    assert sorted(s.study_name for s in summaries) == sorted([result["study_name"], result["infer_study_name"],
                                                              f"{result['study_name']}-claims", "autotune-workers"])
    [worker] = optuna.load_study(study_name="autotune-workers", storage=storage_url).get_trials()
    assert worker.state == optuna.trial.TrialState.COMPLETE and worker.user_attrs["pid"] == str(os.getpid())
    study = optuna.load_study(study_name=result["study_name"], storage=storage_url)
    trials = study.get_trials(deepcopy=False)
    assert any(t.user_attrs.get("status") == "ok" and t.user_attrs.get("peak_bytes", 0) > 0 for t in trials), \
        [t.user_attrs for t in trials]
    assert any(t.user_attrs.get("verdict") == "does not fit" for t in trials), "the limit must bind"
    storage = optuna.storages.RDBStorage(storage_url)
    try:
        study_id = storage.get_study_id_from_name(study.study_name)
        infer_id = storage.get_study_id_from_name(result["infer_study_name"])
    finally:
        storage.engine.dispose()
    return TunedStudy(storage_url=storage_url, name=study.study_name, study_id=study_id, num_trials=len(trials),
                      infer_name=result["infer_study_name"], infer_study_id=infer_id, result=result)


@pytest.fixture(scope="module")
def dashboard(tuned_study: TunedStudy, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    """``python -m autotune dashboard`` on the tuned storage, on a free 127.0.0.1 port; killed afterwards."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("dashboard-log") / "server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "autotune", "dashboard", "--storage", tuned_study.storage_url,
             "--host", "127.0.0.1", "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"autotune dashboard exited with {process.returncode}: "
                            f"{log_path.read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(f"{base_url}/api/studies", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"autotune dashboard did not answer on {base_url} within {SERVER_START_TIMEOUT_S:.0f} s: "
                            f"{log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.2)
        yield Dashboard(base_url=base_url, port=port, process=process)
    finally:
        _kill_group(process)


def _chromium(*args: str) -> str:
    """Run headless Chromium with a throw-away profile; returns its stdout."""
    assert CHROMIUM is not None
    profile = tempfile.mkdtemp(prefix="autotune-chromium-")
    process = subprocess.Popen([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=CHROMIUM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"chromium did not finish within {CHROMIUM_TIMEOUT_S:.0f} s")
    finally:
        _kill_group(process)
        shutil.rmtree(profile, ignore_errors=True)
    assert process.returncode == 0, stderr.decode(errors="replace")[-2000:]
    return stdout.decode("utf-8", errors="replace")


def test_dashboard_api_lists_the_study(dashboard: Dashboard, tuned_study: TunedStudy) -> None:
    """The JSON API (what the page reads) lists the key's two studies (training, inference) by name and id, and
    the bookkeeping studies: the workers' and the key's claims."""
    from autotune.search.storage.liveness import is_coordination_study

    with urllib.request.urlopen(f"{dashboard.base_url}/api/studies", timeout=10) as response:
        summaries = json.load(response)["study_summaries"]
    listed = [(s["study_id"], s["study_name"]) for s in summaries if not is_coordination_study(s["study_name"])]
    assert sorted(listed) == sorted(
        [(tuned_study.study_id, tuned_study.name), (tuned_study.infer_study_id, tuned_study.infer_name)])
    assert sorted(s["study_name"] for s in summaries if is_coordination_study(s["study_name"])) == [
        f"{tuned_study.name}-claims", "autotune-workers"]


def test_dashboard_listens_on_loopback_only(dashboard: Dashboard) -> None:
    """The server is bound to 127.0.0.1 (the CLI default too), never to all interfaces."""
    from autotune.cli import build_parser

    args = build_parser().parse_args(["dashboard"])
    assert args.host == "127.0.0.1", "autotune dashboard must bind to 127.0.0.1 unless --host says otherwise"

    assert _listening_addresses(dashboard.port) == {"127.0.0.1"}
    from_ss = _ss_listening(dashboard.port)
    if from_ss is not None:
        assert from_ss == {"127.0.0.1"}


@pytest.fixture(scope="session")
def chromium() -> str:
    """The headless Chromium binary; skips (fails under AUTOTUNE_REQUIRE_SYSTEM_DEPS) where it is missing.

    Session-scoped so that it is checked before the module's tuning fixtures spend their time.
    """
    if CHROMIUM is None:
        unavailable("headless Chromium", "not installed (apt-get install chromium); .ci/run installs it")
    return CHROMIUM


@pytest.mark.chromium
def test_chromium_renders_the_trials_page(chromium: str, dashboard: Dashboard, tuned_study: TunedStudy) -> None:
    """The JavaScript-drawn trials page shows the study name, the trial count and a user attribute name."""
    url = f"{dashboard.base_url}/dashboard/studies/{tuned_study.study_id}/trials"
    dom = _chromium("--dump-dom", url)
    assert tuned_study.name in dom, dom[-2000:]
    assert "peak_bytes" in dom, dom[-2000:]
    assert f"{tuned_study.num_trials} Trials" in dom, dom[-2000:]



@pytest.mark.chromium
@pytest.mark.parametrize("phase", ["train", "infer"])
def test_chromium_shows_the_answer_and_the_memory_picture(chromium: str, dashboard: Dashboard, tuned_study: TunedStudy,
                                                          phase: str, tmp_path: Path) -> None:
    """Each study's page shows the tuned value as its best trial and the peak-against-batch plot with the
    budget and limit lines (fits and, for training at this limit, non-fits marked); the screenshot has the
    budget line's colour in it."""
    result = tuned_study.result
    study_id = tuned_study.study_id if phase == "train" else tuned_study.infer_study_id
    url = f"{dashboard.base_url}/dashboard/studies/{study_id}"
    size = "num_patches_per_iter" if phase == "train" else "num_sw_batch_size"
    for _attempt in range(3):  # on a busy machine the page can need more than one virtual-time budget
        dom = _chromium("--window-size=1400,1800", "--dump-dom", url)
        if f"peak memory against {size}" in dom:
            break
    best = result["train_trial"] if phase == "train" else result["infer_trial"]
    value = result[size]
    if phase == "train" and result["num_patches_per_iter"] != result["max_num_patches_per_iter"]:
        # the goodput hand-off gave training the template's batch: the study's best is still the largest fit
        value, best = result["max_num_patches_per_iter"], None
    assert (f"Best Trial (number={best})" if best is not None else "Best Trial (number=") in dom, dom[-3000:]
    assert f"{size}: {value}" in dom, dom[-3000:]
    assert f"peak memory against {size}" in dom, dom[-3000:]
    assert ">budget<" in dom and ">limit<" in dom, "the budget and limit lines are in the plot's legend"
    assert "fits<" in dom, "the points that fit are marked"
    if phase == "train":
        assert "does not fit" in dom, "the non-fitting training point is marked"

    env = os.environ.get("AUTOTUNE_DASHBOARD_SCREENSHOT")
    screenshot = Path(env).resolve() if env and phase == "train" else tmp_path / f"{phase}.png"
    _chromium("--window-size=1400,1800", f"--screenshot={screenshot}", url)
    assert screenshot.stat().st_size > 0
    image = pytest.importorskip("PIL.Image").open(screenshot).convert("RGB")
    near = sum(count for count, rgb in image.getcolors(image.width * image.height)
               if all(abs(a - b) <= 24 for a, b in zip(rgb, BUDGET_RGB, strict=True)))
    assert near >= 50, f"the budget line ({near} pixels of its colour) is not in the screenshot {screenshot}"
