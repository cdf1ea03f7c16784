"""A hook for the lock test: ``main(argv)`` runs ``autotune ARGV`` (the target of a forked command,
``forked_cli.start_cli(..., target="lock_hook:main")``) whose run, once it holds the model folder's lock and has
checked everything, creates ``HOLD_MARK`` and waits (up to 120 s) for ``HOLD_GATE`` to exist before it trains, so a
second run meets the lock held however quickly the first one would have finished."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any


def main(argv: Sequence[str]) -> int:
    import autotune.trainer.runner as runner
    from autotune.cli import main as cli

    run_worker = runner.run_worker

    def held(**kwargs: Any) -> Any:
        open(os.environ["HOLD_MARK"], "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(os.environ["HOLD_GATE"]) and time.monotonic() < deadline:
            time.sleep(0.01)
        return run_worker(**kwargs)

    runner.run_worker = held
    return cli(list(argv))
