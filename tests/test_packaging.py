"""The wheel carries what a non-editable install needs: the templates, the presets, the calibrations folder;
installed alone in a fresh virtual environment, it generates bundles from its own templates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ("segresnet", "dints", "unet")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(out), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [built] = out.glob("autotune-*.whl")
    return built


def test_wheel_ships_templates_and_finds_them_in_the_package(wheel: Path, tmp_path: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for algo in ALGOS:
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


def _site_dirs() -> list[str]:
    """The running interpreter's site-packages folders: where the README's install put torch, MONAI, nibabel."""
    return [p for p in sys.path if p and Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]


def _see_running_site_packages(python: Path) -> None:
    """Append the running interpreter's site-packages to the new venv's path through a ``.pth`` file. Folders a
    ``.pth`` adds are not scanned for ``.pth`` files themselves, so the checkout's editable install (a ``.pth``
    hook there) stays invisible, and the venv's own site-packages (where the wheel goes) come first."""
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, timeout=120).stdout.strip()
    Path(purelib, "running_env.pth").write_text("\n".join(_site_dirs()) + "\n")


def test_site_dirs_hold_the_stack() -> None:
    """What the fresh venv will see: torch, MONAI and nibabel sit in one of the running interpreter's folders."""
    dirs = _site_dirs()
    for module in ("torch", "monai", "nibabel"):
        assert any(Path(d, module).is_dir() for d in dirs), (module, dirs)


def test_wheel_generates_bundles_in_a_fresh_venv(wheel: Path, tmp_path: Path) -> None:
    """A venv that sees torch and MONAI from the environment running the tests (a venv made as the README
    says, or the system's) but neither the checkout nor its editable install: the wheel's ``autotune``
    command writes every algorithm's bundle from the wheel's templates."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python, autotune = venv / "bin" / "python", venv / "bin" / "autotune"
    _see_running_site_packages(python)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()

    def call(*argv: str | Path) -> str:
        proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)
        assert proc.returncode == 0, f"{argv}: {proc.stderr[-2000:]}"
        return proc.stdout

    # --ignore-installed: the interpreter's own site packages hold the editable install of the same version
    call(python, "-m", "pip", "install", "--no-deps", "--ignore-installed", "-q", wheel)
    [package_file, templates] = call(python, "-c", "import autotune.bundles.templates as t; "
                                     "print(t.__file__); print(t.default_templates_path())").split()
    assert Path(package_file).is_relative_to(venv) and Path(templates).is_relative_to(venv)

    input_yaml = call(autotune, "demo-data", "data", "--cases", "4", "--size", "24").strip()
    out = call(autotune, "generate", "--input", input_yaml, "--work-dir", "work", "--num-fold", "1",
               "--overrides", "tiny")
    assert "3 bundles in" in out
    for algo in ALGOS:
        bundle = cwd / "work" / f"{algo}_0"
        meta = json.loads((bundle / "bundle.json").read_text())
        assert meta["template"] == algo and Path(meta["template_path"]).is_relative_to(venv)
        config = (bundle / "configs" / "hyper_parameters.yaml").read_text()
        assert f"algo: {algo}" in config and "roi_size" in config
