"""torchrun with the exit codes a scheduler expects: ``python -m autotune.torchrun [torchrun options]
-m autotune.trainer BUNDLE ...``.

torchrun passes SIGTERM and SIGINT on to its workers, and autotune's trainer stops each one
cleanly (a checkpoint, then 128 + the signal's number); but torchrun itself then ends with an
uncaught ``SignalException``, exit code 1, and that is the code a scheduler's requeue rule sees.
This runs torchrun's own ``main`` in this process and ends it with 128 + the signal's number
instead (143 SIGTERM, 130 SIGINT, 138 SIGUSR1), and, when a worker failed, with that worker's own
code (3 out of memory, 4 a refused write, 5 diverged; 128 + N for a worker a signal N killed)
instead of 1. SIGUSR1 (SLURM's ``--signal`` warning) is added to the signals torchrun passes
on (``TORCHELASTIC_SIGNALS_TO_HANDLE``; torchrun's own default leaves it out, and then a
SIGUSR1 ends torchrun at once, its workers left running). torchrun waits up to 30 s for its
workers to stop before it kills them: the trainer stops at the next batch boundary and writes
one checkpoint, well within that on the templates' batches.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

__all__ = ["main", "SIGNALS_ENV", "LAUNCHER_ENV"]

SIGNALS_ENV = "TORCHELASTIC_SIGNALS_TO_HANDLE"
_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"  # torchrun's default list, and SIGUSR1
LAUNCHER_ENV = "AUTOTUNE_LAUNCHER"  # the workers name this launcher in the command that continues a run


def _code_of(exitcode: int) -> int:
    """A worker's exit code as a shell gives it: a negative one (killed by signal N) is 128 + N."""
    return 128 - exitcode if exitcode < 0 else exitcode


def main(argv: Sequence[str] | None = None) -> int:
    """Run torchrun with ``argv`` (default: this process's arguments); returns the exit code."""
    os.environ.setdefault(SIGNALS_ENV, _SIGNALS)
    os.environ[LAUNCHER_ENV] = "python -m autotune.torchrun"
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(list(sys.argv[1:] if argv is None else argv))
    except SignalException as exc:
        code = 128 + int(exc.sigval)
        print(f"autotune torchrun: {signal.Signals(exc.sigval).name} received and passed on to the workers; "
              f"exit code {code}", file=sys.stderr)
        return code
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        code = _code_of(int(failure.exitcode))
        print(f"autotune torchrun: worker rank {rank} ended first, with exit code {code}", file=sys.stderr)
        return code if code else 1
    return 0
