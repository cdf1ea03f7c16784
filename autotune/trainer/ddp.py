"""Several processes: the process group, the spawner and the few collectives the runner needs.

Two ways in, one code path:

- ``autotune train BUNDLE --nproc N`` spawns N processes with ``torch.multiprocessing``
  and sets the same environment ``torchrun`` sets (``RANK``, ``LOCAL_RANK``,
  ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``);
- ``torchrun --nproc-per-node N -m autotune.trainer BUNDLE`` starts them itself.

Either way each process calls ``init_from_env``: gloo on CPU, NCCL on CUDA, one GPU per
local rank. Only rank 0 writes files. Decisions all ranks must share each step (a stop
signal) go through a gloo group on the CPU, so they never wait for the GPU.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import autotune.errors as errors
from autotune.device import check_device
from autotune.errors import AutotuneError, SpecError, TrainingDiverged, TrainingStopped

__all__ = [
    "DistContext",
    "init_from_env",
    "cleanup",
    "all_reduce_sum",
    "all_gather_int",
    "broadcast_flag",
    "all_ranks_max",
    "barrier",
    "spawn",
]


@dataclass
class DistContext:
    """Where this process stands: rank, world size and its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: str = "cpu"
    distributed: bool = False
    cpu_group: Any = None  # a gloo group for CPU collectives beside NCCL (None: the default group is gloo)

    @property
    def enabled(self) -> bool:
        """True when this process is in a process group: more than one process, or torchrun (any size)."""
        return self.distributed or self.world_size > 1

    @property
    def is_main(self) -> bool:
        """True on rank 0, the only rank that writes files and prints."""
        return self.rank == 0


def init_from_env(device: str) -> DistContext:
    """Join the process group the environment describes, or run alone when it describes none.

    Raises:
        SpecError: a CUDA device that is not available, or a bad device name.
    """
    import torch
    import torch.distributed as dist

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    # Under torchrun even one process joins a group (DDP with world size 1 is a real NCCL run).
    distributed = world_size > 1 or "TORCHELASTIC_RUN_ID" in os.environ
    resolved = check_device(device, local_rank, distributed)
    if resolved.startswith("cuda"):
        torch.cuda.set_device(torch.device(resolved))
    cpu_group = None
    if distributed and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if resolved.startswith("cuda") else "gloo", init_method="env://")
    if distributed and dist.get_backend() != "gloo":
        cpu_group = dist.new_group(backend="gloo")
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=resolved,
                       distributed=distributed, cpu_group=cpu_group)


def cleanup(ctx: DistContext) -> None:
    """Leave the process group (if this process joined one)."""
    import torch.distributed as dist

    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(ctx: DistContext, values: list[float]) -> list[float]:
    """Sum ``values`` element-wise over all ranks (returned unchanged when alone)."""
    if not ctx.enabled:
        return list(values)
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(tensor)
    return [float(v) for v in tensor.cpu().tolist()]


def all_gather_int(ctx: DistContext, value: int) -> list[int]:
    """``value`` from every rank, in rank order."""
    if not ctx.enabled:
        return [int(value)]
    import torch
    import torch.distributed as dist

    mine = torch.tensor([int(value)], dtype=torch.int64, device=ctx.device)
    gathered = [torch.zeros_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, mine)
    return [int(t.item()) for t in gathered]


def broadcast_flag(ctx: DistContext, flag: bool) -> bool:
    """Rank 0's ``flag`` on every rank (for decisions all ranks must share, e.g. stopping)."""
    if not ctx.enabled:
        return bool(flag)
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([1 if flag else 0], dtype=torch.int64, device=ctx.device)
    dist.broadcast(tensor, src=0)
    return bool(tensor.item())


def all_ranks_max(ctx: DistContext, values: list[int]) -> list[int]:
    """The largest of each of ``values`` over all ranks, reduced on the CPU (no GPU synchronisation)."""
    if not ctx.enabled:
        return [int(v) for v in values]
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([int(v) for v in values], dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=ctx.cpu_group)
    return [int(v) for v in tensor.tolist()]


def barrier(ctx: DistContext) -> None:
    """Wait for every rank."""
    if ctx.enabled:
        import torch.distributed as dist

        dist.barrier()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _spawn_entry(rank: int, nproc: int, port: int, target: Callable[..., Any], kwargs: dict,
                 error_dir: str, spawner: int | None = None, keep_ignored: bool = False) -> None:
    """What each spawned process runs: torchrun's environment, then ``target(**kwargs)``; a rank whose spawner
    (pid ``spawner``) is gone, or goes (killed outright), ends at once."""
    import torch

    from autotune.stopping import watch_parent

    watch_parent(spawner)

    os.environ.update({
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    })
    # Share the CPU cores instead of every rank starting one thread per core.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // nproc))
    try:
        _take_sigint_back(error_dir, rank, keep_ignored)
        target(**kwargs)
    except KeyboardInterrupt as exc:  # Ctrl-C before the trainer's handlers (or a second signal): one line, by rank 0
        _report(error_dir, rank, TrainingStopped(str(exc), exit_code=130) if str(exc)
                else stopped_before_training(signal.SIGINT))
        raise SystemExit(128 + signal.SIGINT) from None  # a failed rank (not torch's silent exit 0): the others end
    except AutotuneError as exc:
        _report(error_dir, rank, exc)
        if isinstance(exc, (TrainingStopped, TrainingDiverged)):
            return  # every rank stops at the same step: a clean exit, no rank terminated by the spawner
        raise


def _report(error_dir: str, rank: int, exc: AutotuneError) -> None:
    """Leave ``exc`` for the spawner, which raises the lowest rank's (a temp file it reads once: not a product
    file)."""
    Path(error_dir, f"rank{rank}.json").write_text(
        json.dumps({"type": type(exc).__name__, "message": str(exc), "exit_code": exc.exit_code}), encoding="utf-8")


def _take_sigint_back(error_dir: str, rank: int, keep_ignored: bool) -> None:
    """A rank starts with SIGINT ignored and blocked (``spawn``), so that a Ctrl-C while it imports raises no
    ``KeyboardInterrupt`` (a traceback per rank) in the middle of an import. Here it takes SIGINT back (unless the
    command was started with it ignored), then says so (``started<rank>``): from then on the spawner passes a
    SIGINT on, before then it ends the rank outright."""
    if not keep_ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # one that came meanwhile raises here
    Path(error_dir, f"started{rank}").touch()


def spawn(target: Callable[..., Any], nproc: int, kwargs: dict) -> None:
    """Run ``target(**kwargs)`` in ``nproc`` new processes that form one process group.

    ``target`` must be importable (a module-level function). An ``AutotuneError`` in a
    child is raised again here with its type, message and exit code. SIGTERM, SIGINT, SIGHUP and
    SIGUSR1 sent to this process are passed on to the children (which stop together); children
    that such a signal ended before their training began make a ``TrainingStopped`` with its code. A Ctrl-C
    while the children start ends each one still starting outright, the others as any SIGINT: no traceback.

    Raises:
        SpecError: ``nproc`` below 2.
        AutotuneError: what a child raised.
        RuntimeError: a child crashed for another reason.
    """
    import torch.multiprocessing as mp

    if nproc < 2:
        raise SpecError(f"--nproc must be at least 2 to spawn processes, got {nproc}")
    with tempfile.TemporaryDirectory(prefix="autotune-ddp-") as error_dir, _forward_signals() as forwarded:
        try:
            keep_ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
            with _sigint_ignored_while_starting():
                context = mp.start_processes(_spawn_entry, args=(nproc, _free_port(), target, kwargs, error_dir,
                                                                 os.getpid(), keep_ignored),
                                             nprocs=nproc, join=False, start_method="spawn")
            forwarded.to(context.processes, Path(error_dir))
            while not context.join():
                pass
        except Exception as exc:
            _raise_reported(Path(error_dir), exc)
            if forwarded.signum:  # the ranks ended on the signal before their training caught it
                raise stopped_before_training(forwarded.signum) from exc
            raise RuntimeError(f"a training process failed: {str(exc).strip().splitlines()[-1]}") from exc
        _raise_reported(Path(error_dir), None)


def stopped_before_training(signum: int) -> TrainingStopped:
    """The stop of ranks that a signal ended before their training began (no checkpoint was written)."""
    return TrainingStopped(f"{signal.Signals(signum).name} received before training started (while the processes "
                           "started or the cache was built): nothing was trained or written; run the same command "
                           "again", exit_code=128 + int(signum))


def _raise_reported(error_dir: Path, cause: BaseException | None) -> None:
    """Raise the ``AutotuneError`` the lowest rank reported (type, message, exit code), if any."""
    for report in sorted(error_dir.glob("rank*.json")):
        info = json.loads(report.read_text(encoding="utf-8"))
        error = getattr(errors, info["type"], AutotuneError)(info["message"])
        error.exit_code = int(info.get("exit_code", error.exit_code))
        raise error from cause


@contextmanager
def _sigint_ignored_while_starting() -> Iterator[None]:
    """While the ranks are started: SIGINT ignored, which they inherit through exec (``_take_sigint_back``), and
    blocked here, so one that comes meanwhile waits for this process's own handler, restored before it is
    unblocked."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


class _Forwarder:
    """The stop signals this process received (the first in ``signum``), passed on to the processes given; a
    SIGINT ends outright a rank that has not yet taken SIGINT back (``_take_sigint_back``): it would ignore it."""

    def __init__(self) -> None:
        self.signum = 0
        self.processes: list[Any] = []
        self.marks: Path | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        self.signum = self.signum or signum
        self._send(signum)

    def to(self, processes: list[Any], marks: Path | None = None) -> None:
        """Forward to ``processes`` from now on (and the signal that came while they started); ``marks``: the
        folder where rank k marks ``started<k>``."""
        self.processes, self.marks = list(processes), marks
        if self.signum:
            self._send(self.signum)

    def _send(self, signum: int) -> None:
        for rank, process in enumerate(self.processes):
            if process.is_alive():
                started = self.marks is None or (self.marks / f"started{rank}").exists()
                os.kill(process.pid, signum if signum != signal.SIGINT or started else signal.SIGKILL)


@contextmanager
def _forward_signals() -> Iterator[_Forwarder]:
    """While inside, the stop signals this process receives are noted and passed on to the processes
    given to the ``_Forwarder`` (none until then: a signal while they start is passed on once they exist)."""
    import threading

    from autotune.stopping import not_ignored
    from autotune.trainer.stop import STOP_SIGNALS

    forwarder = _Forwarder()
    previous = ({s: signal.signal(s, forwarder) for s in not_ignored(STOP_SIGNALS)}
                if threading.current_thread() is threading.main_thread() else {})
    try:
        yield forwarder
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
