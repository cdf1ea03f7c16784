"""The wheel carries what a non-editable install needs: the templates, the presets, the calibrations folder."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_ships_templates_and_finds_them_in_the_package(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [wheel] = tmp_path.glob("autotune-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for algo in ("segresnet", "dints", "unet"):
        assert f"autotune/algorithm_templates/{algo}/template.yaml" in names
    assert "autotune/algorithm_templates/presets/tiny.yaml" in names
    # installed from the wheel alone (no checkout beside it), the registry lists every template
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=600)
    code = ("import autotune.bundles.templates as t; print(t.default_templates_path()); "
            "print(','.join(t.list_templates())); print(','.join(t.list_presets()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(tmp_path),
                         env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    path, templates, presets = out.stdout.split()
    assert path.startswith(str(target))
    assert templates == "dints,segresnet,unet" and presets == "tiny"
