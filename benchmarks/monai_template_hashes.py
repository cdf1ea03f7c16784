"""Print the SHA-256 entries of MONAI's official algorithm templates for each template's ``versions``.

    python -m benchmarks.monai_template_hashes ../shared/monai/algorithm_templates 21ed8e5

The table holds hashes only (the templates are not copied): each template's ``scripts/*.py``,
its pickled architecture code where it has one (DiNTS ``scripts/arch_code.pth``), and the names
of its ``configs/`` files. Paste a template's printed entry into the ``versions`` of its class
(``autotune/auto3dseg/templates/<name>.py``) to support a new version.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

TEMPLATES = ("segresnet", "dints", "swinunetr", "segresnet2d")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root, version = Path(argv[0]), argv[1]
    for name in TEMPLATES:
        folder = root / name
        if not folder.is_dir():
            continue
        files = sorted(p for p in (folder / "scripts").iterdir() if p.suffix in (".py", ".pth"))
        configs = sorted(p.name for p in (folder / "configs").iterdir() if p.suffix in (".yaml", ".json"))
        print(f"# {name}: autotune/auto3dseg/templates/{name}.py")
        print(f"        {version!r}: known_version(")
        print(f"            configs={tuple(configs)!r},")
        print("            files={")
        for path in files:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            print(f"                \"scripts/{path.name}\": \"{digest}\",")
        print("            },")
        print("        ),")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
