"""``python -m autotune.train BUNDLE ...`` and ``torchrun --nproc-per-node N -m autotune.train BUNDLE ...``.

The same options as ``autotune train``. Under torchrun every process is one rank
(``--nproc`` is ignored); errors print one line and exit with code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from autotune.errors import AutotuneError


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments and train; returns the exit code."""
    from autotune.train.options import add_train_arguments, train_from_args

    parser = argparse.ArgumentParser(prog="python -m autotune.train", description="Train an autotune bundle.")
    add_train_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return train_from_args(args)
    except AutotuneError as exc:
        print(f"autotune train: error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print("autotune train: interrupted; run again with --resume to continue", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
