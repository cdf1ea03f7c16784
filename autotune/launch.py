"""``python -m autotune.launch --memory-limit 8GiB -- SCRIPT ARGS``: a MONAI bundle's training under a limit.

The thin entry of ``autotune.auto3dseg.launcher`` (see there), usable as AutoRunner's command prefix.
"""

from __future__ import annotations

import sys

from autotune.auto3dseg.launcher import main

if __name__ == "__main__":
    sys.exit(main())
