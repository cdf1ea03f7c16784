"""Every bundle ``generate`` writes for the demo data stays the same, byte for byte.

The bundles (autotune's templates with no overrides and with the tiny preset, and MONAI's official
templates through ``BundleGen`` where ``../shared/monai`` is present) are hashed file by file after
four normalisations: the work, data and shipped templates' folders become ``<WORK>``, ``<DATA>``
and ``<TEMPLATES_DIR>``, and a bundle's
creation time and the analysis's content hash (which reads file times) are masked. The hashes are
compared with ``tests/golden/generate_demo.json``. A change that means to change a bundle rewrites the
file with ``AUTOTUNE_WRITE_GOLDEN=1 python -m pytest tests/test_generate_bytes.py`` and says why.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden" / "generate_demo.json"
MONAI_TEMPLATES = Path(__file__).resolve().parents[1].parent / "shared" / "monai" / "algorithm_templates"
_MASKS = (
    (re.compile(r'("created": ")[^"]*(")'), r"\1<TIME>\2"),
    (re.compile(r"(created: ')[^']*(')"), r"\1<TIME>\2"),
    (re.compile(r"((?:datastats_hash|content_hash)\"?: \"?)[0-9a-f]{64}"), r"\1<HASH>"),
)


def _digest(path: Path, places: dict[str, str]) -> str:
    text = path.read_bytes()
    try:
        decoded = text.decode()
    except UnicodeDecodeError:
        return hashlib.sha256(text).hexdigest()
    for place, name in places.items():
        decoded = decoded.replace(place, name)
    for pattern, repl in _MASKS:
        decoded = pattern.sub(repl, decoded)
    return hashlib.sha256(decoded.encode()).hexdigest()


def _bundle_files(work: Path, places: dict[str, str]) -> dict[str, str]:
    """{relative path: digest} of every file inside the work folder's bundle folders."""
    out = {}
    for bundle in sorted(p for p in work.iterdir() if p.is_dir() and re.fullmatch(r".+_\d+", p.name)):
        for path in sorted(p for p in bundle.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            out[path.relative_to(work).as_posix()] = _digest(path, places)
    return out


@pytest.fixture(scope="module")
def generated(demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    from autotune import generate

    root = tmp_path_factory.mktemp("golden")
    from autotune.bundles.templates import default_templates_path

    # a bundle names the template it was filled from: the package's folder, wherever the checkout lies
    places = {str(root): "<WORK>", str(demo_data): "<DATA>", str(default_templates_path()): "<TEMPLATES_DIR>"}
    sets: dict[str, dict[str, str]] = {}
    for name, overrides, folds in (("own", None, 2), ("tiny", "tiny", 1)):
        generate(demo_data / "input.yaml", root / name, num_fold=folds, overrides=overrides, progress=False)
        sets[name] = _bundle_files(root / name, places)
    templates = MONAI_TEMPLATES
    if (templates / "segresnet" / "scripts" / "algo.py").is_file():
        from autotune import BundleGen

        own = root / "own"
        BundleGen(algo_path=str(root / "monai"), templates_path_or_url=str(templates),
                  algos=["segresnet", "dints", "swinunetr", "segresnet2d"],
                  data_stats_filename=str(own / "datastats.yaml"), data_src_cfg_name=str(own / "data_src.yaml"),
                  ).generate(str(root / "monai"), num_fold=1)
        places[str(templates)] = "<TEMPLATES>"
        sets["monai"] = _bundle_files(root / "monai", places)
    return sets


def test_generated_bundles_are_unchanged_byte_for_byte(generated: dict[str, dict[str, str]]) -> None:
    if os.environ.get("AUTOTUNE_WRITE_GOLDEN") == "1":
        old = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
        GOLDEN.write_text(json.dumps({**old, **generated}, indent=1, sort_keys=True) + "\n")
    golden = json.loads(GOLDEN.read_text())
    for name, files in generated.items():
        expected = golden[name]
        assert sorted(files) == sorted(expected), f"{name}: the bundles' files changed"
        changed = [path for path in files if files[path] != expected[path]]
        assert not changed, f"{name}: these generated files changed: {changed}"
    if "monai" not in generated:
        pytest.skip("MONAI's bundles not checked: ../shared/monai is absent (autotune's own were)")
