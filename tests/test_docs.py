"""The README and docs/ stay true to the CLI: every subcommand and flag is documented, every link resolves."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from autotune.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [REPO / "README.md", REPO / "BENCHMARKS.md", *DOCS]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return [o for a in parser._actions if not isinstance(a, argparse._HelpAction)
            for o in a.option_strings if o.startswith("--")]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {_slug(m.group(2)) for m in HEADING.finditer(text)}


def broken_links(path: Path) -> list[str]:
    """Relative links in PATH whose file (or heading anchor) does not exist, as 'target: why'."""
    broken = []
    text = FENCE.sub("", path.read_text())
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: {dest} does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading '#{anchor}' in {dest.name}")
    return broken


def _documented_text() -> str:
    return "\n".join(p.read_text() for p in [REPO / "README.md", *DOCS])


def test_docs_folder_holds_the_reference() -> None:
    names = {p.name for p in DOCS}
    for topic in ("cli.md", "data.md", "tuning.md", "training.md", "workers.md", "architecture.md",
                  "memory-contract.md", "probe-and-estimate.md"):
        assert topic in names, f"docs/{topic} missing"


def test_readme_is_a_front_door() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 260, "the README should stay about 250 lines; move reference to docs/"
    for doc in DOCS:
        assert f"docs/{doc.name}" in readme, f"README does not link docs/{doc.name}"
    assert "python -m pytest -q" in readme


@pytest.mark.parametrize("name", sorted(_subcommands()))
def test_every_subcommand_and_flag_is_documented(name: str) -> None:
    cli = (REPO / "docs" / "cli.md").read_text()
    readme = (REPO / "README.md").read_text()
    assert f"## `autotune {name}`" in cli, f"docs/cli.md has no section for autotune {name}"
    assert f"autotune {name}" in readme, f"README's stage table does not show autotune {name}"
    section = cli.split(f"## `autotune {name}`", 1)[1].split("\n## ", 1)[0]
    shared = cli.split("## Tuning options", 1)[1] if "tuning options" in section.lower() else ""
    missing = [f for f in _flags(_subcommands()[name])
               if not re.search(rf"`{re.escape(f)}[` ]", section + shared)]
    assert not missing, f"docs/cli.md, autotune {name}: flags not documented: {missing}"


def test_global_flags_are_documented() -> None:
    text = _documented_text()
    for flag in _flags(build_parser()):
        assert flag in text, f"autotune {flag} is not documented"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_link_check_finds_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# A title\n\ntext\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md) [ok](other.md#a-title) [web](https://example.org/x)\n"
                    "[gone](missing.md) [bad anchor](other.md#no-such)\n```\n[in code](ignored.md)\n```\n")
    broken = broken_links(page)
    assert len(broken) == 2
    assert broken[0].startswith("missing.md") and broken[1].startswith("other.md#no-such")


def test_slug_matches_github() -> None:
    assert _slug("Tuning options (`tune`, `run`, `worker`)") == "tuning-options-tune-run-worker"
    assert _slug("Batch, learning rate and schedule: what training gets") == \
        "batch-learning-rate-and-schedule-what-training-gets"


def test_no_file_keeps_a_merge_conflict() -> None:
    """A merge's conflict markers left in a doc or a module (docs/cli.md once carried three)."""
    import re

    marker = re.compile(r"^(<{7} |>{7} |={7}$)", re.M)
    files = [p for folder in ("autotune", "docs", "tests", "benchmarks", "algorithm_templates", ".ci")
             for p in (REPO / folder).rglob("*") if p.is_file() and p.suffix in (".py", ".md", ".yaml", ".json", "")]
    files += [REPO / "README.md", REPO / "BENCHMARKS.md"]
    found = [str(p.relative_to(REPO)) for p in files if marker.search(p.read_text(encoding="utf-8", errors="replace"))]
    assert found == []
