"""Targets of the processes ``tests/search/test_workers.py`` forks (``forked_cli.start_cli(..., target=...)``).

- ``worker``: ``autotune ARGV`` whose waiters look for another worker's result every second at most (the
  command's pause grows to ``MAX_POLL_SECONDS``, 15 s, which on these searches of seconds leaves the
  waiters idle long after the result is stored);
- ``worker_every_pass``: ``worker`` whose estimate strategy makes an estimator pass for every point (none
  answered from a pass it already made: ``EstimateProber(reuse_answers=False)``), so that its trials last
  long enough to be caught running;
- ``open_together``: a worker's first steps on a storage (open it, register as live, claim a tuning key),
  started with others at the same moment; the processes meet at two barriers (files in a shared folder),
  so they open the empty database at once and all claim while the first holder is still live, whatever
  the machine's load.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

TIMEOUT_S = 120.0


def _arrive(folder: Path, stage: str, index: str, count: int) -> None:
    """Mark this process at ``stage``, then wait until all ``count`` processes are there."""
    (folder / f"{stage}{index}").touch()
    deadline = time.monotonic() + TIMEOUT_S
    while len(list(folder.glob(f"{stage}*"))) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not all {count} processes reached {stage!r}")
        time.sleep(0.01)


def worker(argv: Sequence[str]) -> int:
    """``autotune ARGV``, a waiter polling every second (see the module's docstring)."""
    import autotune.search.driver.key as key
    from autotune.cli import main

    key.MAX_POLL_SECONDS = 1.0
    return main(list(argv))


def worker_every_pass(argv: Sequence[str]) -> int:
    """``worker`` with every estimated point its own estimator pass (this process's prober only)."""
    import functools

    from autotune.search.curves.probers import EstimateProber

    EstimateProber.__init__ = functools.partialmethod(EstimateProber.__init__, reuse_answers=False)  # type: ignore[method-assign]
    return worker(argv)


def open_together(argv: Sequence[str]) -> int:
    """``URL FOLDER INDEX COUNT``: prints ``held`` or ``waits`` (the claim), then ``opened``."""
    from autotune.search.storage.claims import ClaimStore
    from autotune.search.storage.liveness import Liveness
    from autotune.search.storage.study import open_storage

    url, folder, index, count = argv[0], Path(argv[1]), argv[2], int(argv[3])
    _arrive(folder, "start", index, count)  # all at once on the empty database
    storage = open_storage(url)
    liveness = Liveness(storage, "w")
    claims = ClaimStore(liveness)
    print("held" if claims.claim("s", "key:k") else "waits", flush=True)
    _arrive(folder, "claimed", index, count)  # all claim while the first holder is live
    liveness.close()
    print("opened", flush=True)
    return 0
