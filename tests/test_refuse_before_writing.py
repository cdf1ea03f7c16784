"""A refused command writes nothing: every subcommand, given a good work folder and made to refuse in each way it
can (bad data, options, specs, folds, storage, a bundle that does not fit its input, an output path), exits 2 with
one line, and every file and folder under the test's root is byte for byte as it was (nothing written, nothing
created: not the storage, not the output folder). The Python entry points (``BundleGen.generate``,
``autotune.run``, ``tune``, ``train``) refuse the same way: one line, raised before their first write; a tuned work
folder is not regenerated for a storage that is not a database. Advice a refusal gives is followed once, and works.

The work folder is made once per module (``small_demo_data``: 6 cases of about 16^3; a tiny UNet bundle per fold).
Every command runs in this process (``autotune.cli.main``): each refusal comes before any compute.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import sqlite3
import struct
from collections.abc import Callable
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import yaml

from autotune.cli import main


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root``: a file's SHA-256, ``dir`` for a folder."""
    found = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        found[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def _edit_config(bundle: Path, **values: object) -> Path:
    path = bundle / "configs" / "hyper_parameters.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg.update(values)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return bundle


@pytest.fixture(scope="module")
def root(small_demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test's world: ``data`` (a copy of the demo data, with a datalist giving two folds), ``work`` (analysed,
    a tiny UNet per fold), ``broken`` (the data with a header declaring far more than its file holds), bundles
    that do not fit their data (``classes/unet_0``: output_classes 2 for labels 0-2; ``channels/unet_0``:
    input_channels 2 for 1-channel images), images that fit no bundle, network weights (this bundle's; one of 5 classes) and bad specs."""
    import torch

    from autotune.build import build_network
    from autotune.bundles.config import load_bundle_config

    base = tmp_path_factory.mktemp("refusals")
    data = Path(shutil.copytree(small_demo_data, base / "data"))
    listed = json.loads((data / "datalist.json").read_text())
    for index, case in enumerate(listed["training"]):
        case["fold"] = index % 2
    (data / "two_folds.json").write_text(json.dumps(listed))
    assert main(["generate", "--input", str(data / "input.yaml"), "--work-dir", str(base / "work"), "--algos", "unet",
                 "--num-fold", "2", "--overrides", "tiny", "-q"]) == 0
    broken = Path(shutil.copytree(data, base / "broken"))
    image = broken / "imagesTr" / "case_002.nii.gz"
    raw = bytearray(gzip.decompress(image.read_bytes()))
    struct.pack_into("<3h", raw, 42, 512, 512, 512)  # dim[1:4]: 512 MiB of float32 from a file of a few KiB
    image.write_bytes(gzip.compress(bytes(raw)))
    for name, values in (("classes", {"output_classes": 2}), ("channels", {"input_channels": 2})):
        _edit_config(Path(shutil.copytree(base / "work" / "unet_0", base / name / "unet_0")), **values)
    nib.save(nib.Nifti1Image(np.random.default_rng(0).random((16, 16, 16, 2), np.float32), np.eye(4)),
             base / "two_channels.nii.gz")
    nib.save(nib.Nifti1Image(np.random.default_rng(0).random((16, 16), np.float32), np.eye(4)), base / "flat.nii.gz")
    cfg = load_bundle_config(base / "work" / "unet_0")
    torch.save({"model": build_network(cfg).state_dict()}, base / "weights.pt")
    torch.save({"model": build_network(cfg.with_values(output_classes=5)).state_dict()}, base / "five_classes.pt")
    (base / "bad_specs.yaml").write_text("universal:\n  range_num_images_per_batch: [8, 2]\n")
    (base / "not_a_database.db").write_text("notes, not a database\n")
    with sqlite3.connect(base / "other_program.db") as other:
        other.execute("CREATE TABLE songs (title TEXT)")
    tuned = Path(shutil.copytree(base / "work", base / "tuned"))
    for fold in (0, 1):  # what tuning changes in a bundle: regenerating it would lose these
        _edit_config(tuned / f"unet_{fold}", num_patches_per_iter=1, learning_rate=0.0123)
    (base / "breaks_a_config.yaml").write_text("batch_scaling: {lr_scaling: cubic}\n")
    (base / "misspelt.yaml").write_text("num_patches_per_iterr: 2\n")
    return base


def _infer_cases(r: Path) -> dict[str, tuple[list[str], str]]:
    """``_cases``' refusals of ``autotune infer``."""
    work, bundle, data = r / "work", str(r / "work" / "unet_0"), r / "data"
    infer = [bundle, "--output", str(r / "predictions"), "--checkpoint", str(r / "weights.pt"), "--device", "cpu"]
    return {
        "infer-two-channels": (["infer", *infer, "--images", str(r / "two_channels.nii.gz")],
                               "the image has 2 channel(s) but the bundle's input_channels is 1"),
        "infer-2d-image": (["infer", *infer, "--images", str(r / "flat.nii.gz")], "the image has 2 axes"),
        "infer-checkpoint-of-other-classes": (["infer", *infer, "--images", str(data / "imagesTr" / "case_000.nii.gz"),
                                               "--checkpoint", str(r / "five_classes.pt")], "output_classes 3"),
        "infer-output-is-a-file": (["infer", bundle, "--images", str(data / "imagesTr" / "case_000.nii.gz"),
                                    "--output", str(work / "datastats.yaml"), "--checkpoint", str(r / "weights.pt")],
                                   "exists and is not a folder"),
    }


def _cases(r: Path) -> dict[str, tuple[list[str], str]]:
    """Each refusal: the command line and a piece of its one line."""
    work, bundle, data = r / "work", str(r / "work" / "unet_0"), r / "data"
    generate = ["--input", str(data / "input.yaml"), "--work-dir", str(work), "--algos", "unet", "--num-fold", "2",
                "--overrides", "tiny", "-q"]
    tuning = ["--device", "cpu", "--storage", f"sqlite:///{r / 'studies' / 'autotune.db'}"]
    return {
        "analyze-broken-header": (["analyze", "--input", str(r / "broken" / "input.yaml"), "--work-dir", str(work), "-q"],
                                  "case_002.nii.gz: the header declares a 512x512x512 grid"),
        "analyze-work-dir-is-a-file": (["analyze", "--input", str(data), "--work-dir", str(work / "datastats.yaml")],
                                       "exists and is not a folder"),
        "generate-fold-without-cases": (["generate", *generate[:-5], "--num-fold", "3", "--input",
                                         str(data / "two_folds.json")], "fold 2 holds no training case"),
        "generate-unknown-algorithm": (["generate", *generate[:4], "--algos", "unet,nosuch"], "nosuch"),
        "generate-override-breaks-a-config": (["generate", *generate[:-3], "--overrides",
                                               str(r / "breaks_a_config.yaml"), "-q"], "cubic"),
        "generate-broken-data": (["generate", "--input", str(r / "broken" / "input.yaml"), *generate[2:]],
                                 "the header declares"),
        "run-bad-specs": (["run", *generate, *tuning, "--specs", str(r / "bad_specs.yaml")], "minimum 8 is above"),
        "run-folds-not-generated": (["run", *generate, *tuning, "--train", "--folds", "3"], "fold 3 is not generated"),
        "run-storage-out-of-reach": (["run", *generate, "--device", "cpu", "--storage",
                                      "postgresql+psycopg://autotune@127.0.0.1:1/none"], "cannot connect"),
        "run-storage-not-a-database": (["run", *generate[:2], "--work-dir", str(r / "tuned"), *generate[4:], "--device",
                                        "cpu", "--storage", f"sqlite:///{r / 'not_a_database.db'}"],
                                       "not_a_database.db is not an SQLite database"),
        "tune-storage-of-another-program": (["tune", bundle, "--device", "cpu", "--storage",
                                             f"sqlite:///{r / 'other_program.db'}"], "not an Optuna storage"),
        "tune-specs-file-named": (["tune", bundle, *tuning, "--specs", str(r / "bad_specs.yaml")],
                                  "bad_specs.yaml: specs.universal.range_num_images_per_batch: minimum 8 is above"),
        "run-limit-above-the-device": (["run", *generate, *tuning, "--memory-limit", "1000TiB"], "memory limit"),
        "tune-bundle-not-fitting-its-data": (["tune", bundle, str(r / "channels" / "unet_0"), *tuning],
                                             "input_channels is 2"),
        "generate-unknown-override-key": (["generate", *generate[:-3], "--overrides", str(r / "misspelt.yaml"), "-q"],
                                          "key 'num_patches_per_iterr' is not a key of the unet template; did you "
                                          "mean 'num_patches_per_iter'?"),
        "tune-storage-under-a-file": (["tune", bundle, "--device", "cpu", "--storage",
                                       f"sqlite:///{work / 'datastats.yaml' / 'x.db'}"], "datastats.yaml is not a folder"),
        "tune-summary-is-a-folder": (["tune", bundle, *tuning, "--summary", str(work)], "give --summary a file"),
        "worker-unknown-algorithm": (["worker", "--work-dir", str(work), "--algos", "nosuch", *tuning], "nosuch"),
        "worker-bad-specs": (["worker", "--work-dir", str(work), *tuning, "--specs", str(r / "bad_specs.yaml")],
                             "minimum 8 is above"),
        "verify-never-tuned": (["verify", bundle, "--device", "cpu"], "unet_0"),
        "probe-labels-beyond-classes": (["probe", str(r / "classes" / "unet_0"), "--device", "cpu"],
                                        "output_classes is 2 (label values 0-1)"),
        "estimate-channels": (["estimate", str(r / "channels" / "unet_0"), "--device", "cpu"], "input_channels is 2"),
        "train-labels-beyond-classes": (["train", str(r / "classes" / "unet_0"), "--device", "cpu"],
                                        "the label holds the value 2 but the bundle's output_classes is 2"),
        "train-channels": (["train", str(r / "channels" / "unet_0"), "--device", "cpu"], "input_channels is 2"),
        **_infer_cases(r),
        "dashboard-no-such-storage": (["dashboard", "--storage", f"sqlite:///{r / 'studies' / 'autotune.db'}"],
                                      "no such database file"),
        "demo-data-under-a-file": (["demo-data", str(work / "datastats.yaml" / "demo")], "is not a folder"),
    }


NAMES = sorted(_cases(Path("/")))


@pytest.mark.parametrize("name", NAMES)
def test_a_refused_command_leaves_every_file_as_it_was(name: str, root: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    argv, culprit = _cases(root)[name]
    before = snapshot(root)
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"autotune {argv[0]}: error: ") and culprit in lines[0], err
    after = snapshot(root)
    assert {k: v for k, v in after.items() if before.get(k) != v} == {}, "written or created by a refused command"
    assert set(before) == set(after), f"removed: {sorted(set(before) - set(after))}"


def test_a_fold_refusal_gives_advice_that_works(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The datalist gives two folds; --num-fold 3 is refused with advice: --num-fold 2, or the 'fold' keys removed.
    Both are followed, each into a new work folder, and each generates."""
    argv = ["generate", "--input", str(root / "data" / "two_folds.json"), "--algos", "unet", "--overrides", "tiny",
            "-q"]
    assert main([*argv, "--work-dir", str(tmp_path / "refused"), "--num-fold", "3"]) == 2
    line = capsys.readouterr().err
    assert "use --num-fold 2 or fewer, or remove the 'fold' keys from two_folds.json" in line, line
    assert not (tmp_path / "refused").exists()
    assert main([*argv, "--work-dir", str(tmp_path / "two"), "--num-fold", "2"]) == 0
    assert sorted(p.name for p in (tmp_path / "two").glob("unet_*")) == ["unet_0", "unet_1"]
    data = Path(shutil.copytree(root / "data", tmp_path / "data"))
    listed = json.loads((data / "two_folds.json").read_text())
    for case in listed["training"]:
        del case["fold"]
    (data / "no_folds.json").write_text(json.dumps(listed))
    assert main([argv[0], "--input", str(data / "no_folds.json"), *argv[3:], "--work-dir", str(tmp_path / "three"),
                 "--num-fold", "3"]) == 0
    assert sorted(p.name for p in (tmp_path / "three").glob("unet_*")) == ["unet_0", "unet_1", "unet_2"]


def test_a_folder_made_for_the_user_is_named(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A storage or output folder that had to be created is said in one line: an SQLite URL with four slashes is
    an absolute path, made where it says, and the line shows where."""
    from autotune.search.storage.study import open_storage

    url = f"sqlite:///{tmp_path / 'new' / 'dir' / 's.db'}"  # sqlite:////tmp/...: four slashes
    assert url.startswith("sqlite:////")
    open_storage(url)
    assert capsys.readouterr().err == (f"created the storage folder {tmp_path / 'new' / 'dir'} (and the folders above "
                                       f"it from {tmp_path / 'new'}) (for {url})\n")
    open_storage(url)  # there now: nothing to say
    assert capsys.readouterr().err == ""
    predictions = tmp_path / "predictions"
    assert main(["infer", str(root / "work" / "unet_0"), "--images", str(root / "data" / "imagesTr" / "case_000.nii.gz"),
                 "--output", str(predictions), "--checkpoint", str(root / "weights.pt"), "--device", "cpu", "-q"]) == 0
    out, err = capsys.readouterr()
    assert err == f"created the predictions folder {predictions}\n"
    assert out.splitlines() == [str(predictions / "case_000_seg.nii.gz")]


def _api_cases(r: Path) -> dict[str, tuple[Callable[[], object], str]]:
    """Each refusal of a Python entry point: the call and a piece of its one line."""
    import autotune

    storage = f"sqlite:///{r / 'studies' / 'autotune.db'}"
    text_db = f"sqlite:///{r / 'not_a_database.db'}"
    work, data = r / "work", r / "data" / "input.yaml"

    def bundlegen(specs: object) -> Callable[[], object]:
        gen = autotune.BundleGen(work, algos="unet", data_stats_filename=work / "datastats.yaml",
                                 data_src_cfg_name=work / "data_src.yaml")
        return lambda: gen.generate(r / "api_out", num_fold=1, overrides="tiny", gpu_customization=True,
                                    gpu_customization_specs=specs, device="cpu", storage=storage, progress=None)

    def run(**options: object) -> Callable[[], object]:
        given = {"algos": "unet", "num_fold": 2, "overrides": "tiny", "device": "cpu", "storage": storage, **options}
        return lambda: autotune.run(data, r / "tuned", progress=None, **given)  # type: ignore[arg-type]

    return {
        "bundlegen-specs-min-above-max": (bundlegen({"universal": {"range_num_images_per_batch": [8, 2]}}),
                                          "minimum 8 is above maximum 2"),
        "bundlegen-specs-negative": (bundlegen({"universal": {"range_num_sw_batch_size": [-1, 4]}}),
                                     "minimum must be at least 1"),
        "bundlegen-specs-no-trials": (bundlegen({"unet": {"num_trials": 0}}), "num_trials must be a positive integer"),
        "bundlegen-specs-file": (bundlegen(str(r / "bad_specs.yaml")), "bad_specs.yaml: specs.universal"),
        "bundlegen-storage-not-a-database": (
            lambda: autotune.BundleGen(work, algos="unet", data_stats_filename=work / "datastats.yaml",
                                       data_src_cfg_name=work / "data_src.yaml").generate(
                r / "api_out", num_fold=1, gpu_customization=True, device="cpu", storage=text_db),
            "is not an SQLite database"),
        "run-storage-not-a-database": (run(storage=text_db), "is not an SQLite database"),
        "run-specs-file": (run(specs=str(r / "bad_specs.yaml")), "bad_specs.yaml: specs.universal"),
        "run-misspelt-override-in-a-scope": (run(overrides={"unet": {"learning_rat": 0.1}}),
                                             "unet: key 'learning_rat' is not a key of the unet template; did you "
                                             "mean 'learning_rate'?"),
        "tune-storage-not-a-database": (lambda: autotune.tune([r / "tuned" / "unet_0"], device="cpu", storage=text_db,
                                                              progress=None), "is not an SQLite database"),
        "tune-storage-of-another-program": (
            lambda: autotune.tune([r / "tuned" / "unet_0"], device="cpu", progress=None,
                                  storage=f"sqlite:///{r / 'other_program.db'}"), "not an Optuna storage"),
        "tune-specs-file": (lambda: autotune.tune([r / "tuned" / "unet_0"], str(r / "bad_specs.yaml"), device="cpu",
                                                  storage=storage, progress=None), "bad_specs.yaml: specs.universal"),
        "train-labels-beyond-classes": (lambda: autotune.train(r / "classes" / "unet_0", device="cpu", progress=False),
                                        "output_classes is 2"),
        "train-bad-max-time": (lambda: autotune.train(r / "tuned" / "unet_0", device="cpu", max_time=-5,
                                                      progress=False), "max-time"),
    }


API_NAMES = sorted(_api_cases(Path("/")))


@pytest.mark.parametrize("name", API_NAMES)
def test_a_refused_python_call_leaves_every_file_as_it_was(name: str, root: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The Python entry points refuse as the commands do: an ``AutotuneError`` of one line, raised before the
    first write (a tuned work folder is not regenerated, no output folder or storage is created)."""
    from autotune.errors import AutotuneError

    call, culprit = _api_cases(root)[name]
    before = snapshot(root)
    with pytest.raises(AutotuneError) as refused:
        call()
    line = str(refused.value)
    assert "\n" not in line and culprit in line, line
    after = snapshot(root)
    assert {k: v for k, v in after.items() if before.get(k) != v} == {}, "written or created by a refused call"
    assert set(before) == set(after), f"removed: {sorted(set(before) - set(after))}"
