"""Every long-running command, stopped by SIGTERM, SIGINT or SIGHUP mid-work, ends its whole process tree within
10 s and exits 143, 130 or 129: ``probe``, ``estimate``, ``tune``, ``run``, ``worker``, ``train`` (one process
and ``--nproc 2``), ``infer`` and ``python -m autotune.launch``. A child that can outlive its parent (a probe
forked from the fork server, a DDP rank) ends when its parent is killed outright (SIGKILL).

Each command is a real process of its own, forked with torch imported (``forked_cli``, through
``stop_hook``: a light probe fork server, and a hold at a known point of the work where a test needs one).
Its tree is every descendant seen while it ran (``psutil``), so a child reparented to init is still found.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from forked_cli import CliProcess, start_cli
from probe_fixtures import one_window_unet

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads processes from /proc (Linux)")

CODES = {signal.SIGTERM: 143, signal.SIGINT: 130, signal.SIGHUP: 129}
GONE_WITHIN_S = 10.0
LAUNCHED_SCRIPT = '''
import subprocess, sys, time
from pathlib import Path
sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
Path(sys.argv[1]).write_text(str(sleeper.pid))
time.sleep(600)
'''


@dataclass
class Tree:
    """A command's process and every descendant seen while it ran (``psutil.Process`` objects: a pid reused by
    another process later does not count as alive)."""

    proc: CliProcess
    seen: dict[int, psutil.Process] = field(default_factory=dict)

    def look(self) -> None:
        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                self.seen.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass

    def alive(self) -> list[int]:
        return [pid for pid, p in self.seen.items() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

    def wait_for(self, ready: Callable[[Tree], bool], timeout: float = 240.0) -> None:
        """Watch the tree until ``ready`` holds (the command is mid-work)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.look()
            if ready(self):
                return
            assert self.proc.poll() is None, (self.proc.communicate()[1] or "")[-3000:]
            time.sleep(0.05)
        raise AssertionError(f"{self.proc.args}: never reached the point to stop it at")

    def ends_within(self, seconds: float) -> float:
        """Seconds until the command and every descendant seen are gone (at most ``seconds``, else fail)."""
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            self.look()
            if self.proc.poll() is not None and not self.alive():
                return time.monotonic() - start
            time.sleep(0.05)
        raise AssertionError(f"{self.proc.args}: still alive {seconds} s after the signal: command "
                             f"{self.proc.poll()}, descendants {self.alive()}")

    def kill_all(self) -> None:
        for pid in self.alive():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()


def _trial_running(tree: Tree) -> bool:
    """A probe's trial runs: a descendant leads a session of its own (the trial's ``setsid``)."""
    for pid, process in tree.seen.items():
        try:
            if os.getsid(pid) == pid and process.is_running():
                return True
        except ProcessLookupError:
            continue
    return False


def _file(path: Path) -> Callable[[Tree], bool]:
    return lambda _tree: path.exists()


def _ranks(count: int, joined: bool = False) -> Callable[[Tree], bool]:
    """``count`` DDP ranks have started (``joined``: and each has a TCP connection, the process group's store,
    which it opens after ``watch_parent``; a rank still importing torch would end only once it got there)."""
    def ready(tree: Tree) -> bool:
        ranks = [p for p in tree.seen.values() if p.is_running() and "spawn_main" in " ".join(_cmdline(p))]
        return len(ranks) >= count and (not joined or all(_connected(p) for p in ranks))

    return ready


def _ranks_importing(count: int) -> Callable[[Tree], bool]:
    """``count`` DDP ranks are importing torch: its library is mapped, and no rank has joined the process group (a
    SIGINT there once raised ``KeyboardInterrupt`` inside an import: a traceback per rank)."""
    def ready(tree: Tree) -> bool:
        ranks = [p for p in tree.seen.values() if p.is_running() and "spawn_main" in " ".join(_cmdline(p))]
        return len(ranks) >= count and all(_maps_torch(p) and not _connected(p) for p in ranks)

    return ready


def _maps_torch(process: psutil.Process) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{process.pid}/maps").read_text()
    except OSError:
        return False


def _connected(process: psutil.Process) -> bool:
    try:
        return bool(process.net_connections(kind="tcp"))
    except psutil.Error:
        return False


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


@pytest.fixture(scope="module")
def unet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return one_window_unet(tmp_path_factory, "stop_signals_unet")


@pytest.fixture(scope="module")
def checkpoint(small_demo_bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Weights of the small SegResNet bundle's network, as ``autotune infer --checkpoint`` takes them."""
    import torch

    from autotune.build import build_network
    from autotune.bundles.config import load_bundle_config

    path = tmp_path_factory.mktemp("stop_signals_ckpt") / "weights.pt"
    torch.save({"model": build_network(load_bundle_config(small_demo_bundles["segresnet_0"])).state_dict()}, path)
    return path


def _start(argv: list[str], tmp_path: Path, **env: str) -> Tree:
    base = {**os.environ, "OMP_NUM_THREADS": "1", "AUTOTUNE_PROBE_ISOLATION": "forkserver", **env}
    return Tree(start_cli(argv, tmp_path / "cmd.out", tmp_path / "cmd.err", base, target="stop_hook:main"))


def _case(name: str, tmp_path: Path, unet: Path, small: dict[str, Path], small_data: Path, checkpoint: Path
          ) -> tuple[list[str], dict[str, str], Callable[[Tree], bool]]:
    """The command line, environment and mid-work point of case ``name``."""
    import shutil

    hang = {"AUTOTUNE_PROBE_FAULT": "hang"}
    held = {"HOLD_FILE": str(tmp_path / "held")}
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    tuning = ["--device", "cpu", "--storage", storage, "--timeout", "120", "--strategy", "tpe", "-q"]
    if name == "probe":
        return ["probe", str(unet), "--device", "cpu", "--timeout", "120"], hang, _trial_running
    if name == "estimate":
        return (["estimate", str(unet), "--device", "cpu"], {**held, "HOLD_AT": "autotune.probe.estimate:_trace_training"},
                _file(tmp_path / "held"))
    if name in ("tune", "worker"):
        bundle = Path(shutil.copytree(unet, tmp_path / "work" / "unet_0"))
        where = [str(bundle)] if name == "tune" else ["--work-dir", str(bundle.parent)]
        return [name, *where, *tuning], hang, _trial_running
    if name == "run":
        return (["run", "--input", str(small_data), "--work-dir", str(tmp_path / "work"), "--algos", "unet",
                 "--num-fold", "1", "--overrides", "tiny", *tuning], hang, _trial_running)
    if name.startswith("train"):
        bundle = Path(shutil.copytree(small["segresnet_0"], tmp_path / "segresnet_0"))
        if name == "train":
            return (["train", str(bundle), "--device", "cpu", "--epochs", "2", "-q"],
                    {**held, "HOLD_AT": "autotune.step:train_step"}, _file(tmp_path / "held"))
        ready = _ranks_importing(2) if name == "train-nproc-starting" else _ranks(2)
        return ["train", str(bundle), "--device", "cpu", "--epochs", "2", "-q", "--nproc", "2"], {}, ready
    if name == "infer":
        image = small_data / "imagesTr" / "case_000.nii.gz"
        return (["infer", str(small["segresnet_0"]), "--images", str(image), "--output", str(tmp_path / "preds"),
                 "--device", "cpu", "--checkpoint", str(checkpoint), "-q"],
                {**held, "HOLD_AT": "autotune.step:sliding_window_predict"}, _file(tmp_path / "held"))
    assert name == "launch"
    script = tmp_path / "bundle" / "scripts" / "train.py"
    script.parent.mkdir(parents=True)
    script.write_text(LAUNCHED_SCRIPT)
    return (["--memory-limit", "64MiB", "--device", "cpu", "--", str(script), str(tmp_path / "sleeper")],
            {"STOP_HOOK_TARGET": "autotune.auto3dseg.launcher:main"}, _file(tmp_path / "sleeper"))


# Each signal on several commands, each command once (the CLI maps the three signals alike): the fork-server
# probe (the orphan it once left) under all three.
CASES = [("probe", signal.SIGTERM), ("probe", signal.SIGINT), ("probe", signal.SIGHUP),
         ("estimate", signal.SIGHUP), ("tune", signal.SIGINT), ("worker", signal.SIGHUP), ("run", signal.SIGTERM),
         ("train", signal.SIGINT), ("train-nproc", signal.SIGHUP), ("train-nproc-starting", signal.SIGINT),
         ("infer", signal.SIGTERM),
         ("launch", signal.SIGHUP)]


@pytest.mark.parametrize(("name", "signum"), CASES, ids=[f"{n}-{signal.Signals(s).name}" for n, s in CASES])
def test_a_stop_signal_ends_the_whole_tree_with_its_code(name: str, signum: int, tmp_path: Path, unet: Path,
                                                         small_demo_bundles: dict[str, Path], small_demo_data: Path,
                                                         checkpoint: Path) -> None:
    argv, env, ready = _case(name, tmp_path, unet, small_demo_bundles, small_demo_data, checkpoint)
    tree = _start(argv, tmp_path, **env)
    try:
        tree.wait_for(ready)
        if name == "train-nproc-starting":  # Ctrl-C: the terminal signals the whole process group
            os.killpg(tree.proc.pid, signum)
        else:
            tree.proc.send_signal(signum)
        took = tree.ends_within(GONE_WITHIN_S)
    finally:
        tree.kill_all()
    err = (tmp_path / "cmd.err").read_text(errors="replace")
    assert tree.proc.returncode == CODES[signum], err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert took <= GONE_WITHIN_S
    if name == "launch":
        record = json.loads((tmp_path / "bundle" / "autotune" / "launch.json").read_text())
        assert (record["status"], record["signal"]) == ("stopped", signal.Signals(signum).name)
    else:
        stop_lines = [line for line in err.splitlines() if line.startswith("autotune ")]
        assert len(stop_lines) == 1, err[-3000:]
        assert "KeyboardInterrupt" not in err, err[-3000:]
        assert signal.Signals(signum).name in stop_lines[0] or (signum == signal.SIGINT and "interrupted" in
                                                                 stop_lines[0]), stop_lines


@pytest.mark.parametrize("name", ["probe", "train-nproc"])
def test_children_end_when_their_parent_is_killed_outright(name: str, tmp_path: Path, unet: Path,
                                                          small_demo_bundles: dict[str, Path], small_demo_data: Path,
                                                          checkpoint: Path) -> None:
    """SIGKILL leaves the command no chance to clean up: the probe's trial (a child of the fork server) and the
    DDP ranks watch their parent and end with it (``autotune.stopping.watch_parent``)."""
    argv, env, ready = _case(name, tmp_path, unet, small_demo_bundles, small_demo_data, checkpoint)
    tree = _start(argv, tmp_path, **env)
    try:
        tree.wait_for(_ranks(2, joined=True) if name == "train-nproc" else ready)
        assert tree.seen, "the command has children to outlive it"
        tree.proc.send_signal(signal.SIGKILL)
        tree.ends_within(GONE_WITHIN_S)
    finally:
        tree.kill_all()
    assert tree.proc.returncode == -signal.SIGKILL


WATCHER = '''
import subprocess, sys, time
from pathlib import Path
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]])
time.sleep(600)
'''
WATCHED = '''
import sys, time
from pathlib import Path
from autotune.stopping import watch_parent
how = watch_parent(kernel=sys.argv[1] == "kernel", poll_s=0.05)
Path(sys.argv[2]).write_text(how)
time.sleep(600)
'''


@pytest.mark.parametrize("how", ["kernel", "poll"])
def test_watch_parent_ends_a_child_whose_parent_is_killed(how: str, tmp_path: Path) -> None:
    """Both ways of watching (Linux's parent-death signal; the pid poll used elsewhere), in plain interpreters."""
    import subprocess
    import sys

    mark = tmp_path / "watching"
    parent = subprocess.Popen([sys.executable, "-c", WATCHER, WATCHED, how, str(mark)],
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    tree = Tree(parent)  # type: ignore[arg-type]  # Popen has what Tree reads: pid, poll, args, kill
    try:
        tree.wait_for(lambda _tree: mark.exists(), timeout=60)
        assert mark.read_text() == how
        parent.kill()
        parent.wait()
        tree.ends_within(GONE_WITHIN_S)
    finally:
        tree.kill_all()
