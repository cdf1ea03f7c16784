"""The Python examples of the README and docs/ run as written, one after another in one process.

Every fenced ``python`` block runs, in file order, in a fresh namespace but the same process and the
same working folder (a temporary one), so a later block may use what an earlier one wrote, as a
reader following the page would. A block preceded by a line ``<!-- not run by tests/test_examples.py:
why -->`` is skipped (it needs a GPU, the full-size templates or MONAI's templates).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP = "<!-- not run by tests/test_examples.py"
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """(line number, code) of each ``python`` block of ``path`` that is not marked as skipped."""
    text = path.read_text()
    blocks = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip().splitlines()
        if before and before[-1].startswith(SKIP):
            continue
        blocks.append((text.count("\n", 0, match.start()) + 1, match.group(1)))
    return blocks


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_block_reader_skips_marked_blocks(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n\n```python\nx = 1\n```\n\n<!-- not run by tests/test_examples.py: gpu -->\n"
                    "```python\nraise SystemExit\n```\n```bash\nls\n```\n")
    assert python_blocks(page) == [(3, "x = 1\n")]


def test_python_examples_run_in_one_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AUTOTUNE_STORAGE", f"sqlite:///{tmp_path / 'studies.db'}")
    ran = []
    for path in documents():
        for line, code in python_blocks(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            exec(compile(code, where, "exec"), {"__name__": "__main__"})  # noqa: S102 - the docs' own examples
            ran.append(where)
    assert any(w.startswith("README.md") for w in ran) and any("python-api.md" in w for w in ran), ran
