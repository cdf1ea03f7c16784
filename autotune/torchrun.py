"""``python -m autotune.torchrun [torchrun options] -m autotune.trainer BUNDLE ...``: torchrun, ending with
the codes a scheduler expects (143 after SIGTERM, not torchrun's 1).

The thin entry of ``autotune.trainer.torchrun`` (see there).
"""

from __future__ import annotations

import sys

from autotune.trainer.torchrun import main

if __name__ == "__main__":
    sys.exit(main())
