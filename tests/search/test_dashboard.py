"""``autotune dashboard`` serves a real tuning study: headless Chromium sees the study and its trials.

One tiny UNet bundle is tuned on the CPU (real probes, two trials), ``autotune dashboard`` is
started on that SQLite storage, and headless Chromium renders the trials page (the page is drawn
by JavaScript, so a plain HTTP fetch would not show the trials). Set
``AUTOTUNE_DASHBOARD_SCREENSHOT=/path/to.png`` to also save a screenshot of the page.
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
# A narrow search so the two real probes take seconds, not a minute.
TINY_SPECS = {"unet": {"range_num_images_per_batch": [1, 2], "range_num_sw_batch_size": [1, 2]}}


@dataclass(frozen=True)
class TunedStudy:
    """A study written by a real ``tune_bundles`` run."""

    storage_url: str
    name: str
    study_id: int
    num_trials: int


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

    from autotune.search.tune import tune_bundles

    try:
        from probe_fixtures import make_tiny_bundles
    except ImportError:  # fall back to building the bundle here
        make_tiny_bundles = None
    root = tmp_path_factory.mktemp("dashboard")
    if make_tiny_bundles is not None:
        bundle = make_tiny_bundles(root, algos=("unet",))["unet"]
    else:
        from autotune.bundles.bundlegen import BundleGen
        from autotune.bundles.templates import load_overrides
        from autotune.data.analyze import analyze
        from autotune.data.synthetic import make_demo_dataset

        demo = make_demo_dataset(root / "data", cases=2, size=32, classes=2, seed=0)
        work = root / "work"
        result = analyze(demo, work, num_fold=1, progress=False)
        BundleGen(work, algos="unet", data_stats_filename=result.datastats,
                  data_src_cfg_name=result.data_src).generate(work, num_fold=1, overrides=load_overrides("tiny"))
        bundle = work / "unet_0"
    storage_url = f"sqlite:///{root / 'studies.db'}"
    # write_back=False: the dashboard only needs the study, not the tuned bundle.
    tune_bundles([bundle], TINY_SPECS, device="cpu", memory_limit="1GiB", storage=storage_url, strategy="fast",
                 progress=None, write_back=False)

    summaries = optuna.get_all_study_summaries(storage_url, include_best_trial=False)
    assert len(summaries) == 1, [s.study_name for s in summaries]
    study = optuna.load_study(study_name=summaries[0].study_name, storage=storage_url)
    trials = study.get_trials(deepcopy=False)
    assert trials, "the tune wrote no trial"
    assert any(t.user_attrs.get("status") == "ok" and t.user_attrs.get("peak_bytes", 0) > 0 for t in trials), \
        [t.user_attrs for t in trials]
    storage = optuna.storages.RDBStorage(storage_url)
    try:
        study_id = storage.get_study_id_from_name(study.study_name)
    finally:
        storage.engine.dispose()
    return TunedStudy(storage_url=storage_url, name=study.study_name, study_id=study_id, num_trials=len(trials))


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
    """The JSON API (what the page reads) lists the tuned study under its name and id."""
    with urllib.request.urlopen(f"{dashboard.base_url}/api/studies", timeout=10) as response:
        summaries = json.load(response)["study_summaries"]
    assert [(s["study_id"], s["study_name"]) for s in summaries] == [(tuned_study.study_id, tuned_study.name)]


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

    screenshot = os.environ.get("AUTOTUNE_DASHBOARD_SCREENSHOT")
    if screenshot:
        _chromium("--window-size=1400,900", f"--screenshot={Path(screenshot).resolve()}", url)
        assert Path(screenshot).stat().st_size > 0
