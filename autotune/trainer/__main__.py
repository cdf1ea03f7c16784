"""``python -m autotune.trainer BUNDLE ...`` and ``torchrun --nproc-per-node N -m autotune.trainer BUNDLE ...``.

The same options as ``autotune train``. Under torchrun every process is one rank
(``--nproc`` is ignored); errors print one line and exit with their code (as ``autotune train``:
2 bad input, 3 out of memory, 4 the host refused a write, 5 diverged (non-finite loss),
143/130/129/138 stopped by a signal, before training starts too: one line, as ``autotune train`` says it).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from autotune.errors import AutotuneError, TrainingDiverged, TrainingStopped
from autotune.stopping import Stopped, stop_on_signals
from autotune.trainer.stop import BEFORE_TRAINING


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments and train; returns the exit code."""
    from autotune.trainer.options import add_train_arguments, train_from_args

    parser = argparse.ArgumentParser(prog="python -m autotune.trainer", description="Train an autotune bundle.")
    add_train_arguments(parser)
    args = parser.parse_args(argv)
    first_rank = int(os.environ.get("RANK", "0")) == 0
    try:
        with stop_on_signals():  # as the CLI: a stop before training ends the command at once, in one line
            return train_from_args(args)
    except Stopped as exc:
        if first_rank:
            print(f"autotune train: {exc}; {BEFORE_TRAINING}", file=sys.stderr)
        return exc.exit_code
    except AutotuneError as exc:
        if first_rank or not isinstance(exc, (TrainingStopped, TrainingDiverged)):
            print(f"autotune train: {exc.label}: {exc}", file=sys.stderr)  # one stop line, not one per rank
        return int(exc.exit_code)
    except KeyboardInterrupt as exc:
        if first_rank:
            print(f"autotune train: interrupted by SIGINT; {str(exc) or BEFORE_TRAINING}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
