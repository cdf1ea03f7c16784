"""MONAI-format bundles for the tests: small ones written here, and MONAI's official templates when present.

``write_segresnet`` and ``write_dints`` write bundles in the layout MONAI's ``BundleGen`` gives
(``scripts/``, ``configs/*.yaml`` with ``$`` expressions and ``@`` references, ``algo_object.json``),
with small networks at 32^3 and scripts of their own; ``register_versions`` adds the hashes of those
scripts to the known versions (the tests' own "version"). ``shared_templates`` is MONAI's templates at
``<repo>/../shared/monai/algorithm_templates`` (None when absent: those tests skip). ``run_launcher`` runs
``python -m autotune.launch ARGS`` as a process forked from the probes' fork server (``forked_cli``), torch and
MONAI imported once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
SHARED_TEMPLATES = REPO.parent / "shared" / "monai" / "algorithm_templates"
TEST_VERSION = "test-0"
SKIP_REASON = f"MONAI's official templates are not at {SHARED_TEMPLATES} (../shared/monai of the repository)"


def shared_templates() -> Path | None:
    """MONAI's official algorithm templates beside the repository, or None."""
    return SHARED_TEMPLATES if (SHARED_TEMPLATES / "segresnet" / "scripts" / "algo.py").is_file() else None


def _scripts(root: Path, name: str) -> None:
    scripts = root / "scripts"
    scripts.mkdir(parents=True)
    (scripts / "__init__.py").write_text("")
    (scripts / "algo.py").write_text(f'"""{name}: a test bundle in MONAI\'s layout (not MONAI\'s code)."""\n')
    (scripts / "train.py").write_text('"""not run by the tests"""\n')


def _common(root: Path, work: Path, data_src: dict[str, Any]) -> dict[str, Any]:
    return {"_meta_": {}, "bundle_root": str(root), "data_file_base_dir": str(data_src["dataroot"]),
            "data_list_file_path": str(work / "datalist.json"), "fold": 0}


def _algo_object(root: Path, work: Path, target: str) -> None:
    state = {"data_stats_files": str(work / "datastats.yaml"), "output_path": str(root), "name": root.name}
    (root / "algo_object.json").write_text(json.dumps({"_target_": target, "_state_": state}))


def write_segresnet(work: Path, name: str = "segresnet_0") -> Path:
    """A SegResNetDS bundle (init_filters 8, two levels, roi 32^3) in the layout of MONAI's segresnet template."""
    root = work / name
    _scripts(root, "segresnet")
    data_src = yaml.safe_load((work / "data_src.yaml").read_text())
    config = {
        **_common(root, work, data_src),
        "ckpt_path": "$@bundle_root + '/model'",
        "mlflow_tracking_uri": "$@ckpt_path + '/mlruns/'",
        "input_channels": 1, "output_classes": 3, "class_names": ["a", "b"], "sigmoid": False,
        "roi_size": [32, 32, 32], "auto_scale_allowed": True, "auto_scale_batch": True, "channels_last": True,
        "amp": True, "learning_rate": 0.0002, "batch_size": 1, "num_images_per_batch": 1, "num_epochs": 2,
        "num_crops_per_image": 1, "num_steps_per_image": None, "crop_mode": "ratio", "resample": False,
        "resample_resolution": [1.0, 1.0, 1.0], "image_size_mm_median": [32.0, 32.0, 32.0],
        "loss": {"_target_": "DiceCELoss", "include_background": True, "squared_pred": True, "smooth_nr": 0,
                 "smooth_dr": 1.0e-05, "softmax": "$not @sigmoid", "sigmoid": "$@sigmoid", "to_onehot_y": "$not @sigmoid"},
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": "@learning_rate", "weight_decay": 1.0e-05},
        "network": {"_target_": "SegResNetDS", "init_filters": 8, "blocks_down": [1, 1], "norm": "INSTANCE_NVFUSER",
                    "in_channels": "@input_channels", "out_channels": "@output_classes", "dsdepth": 2},
        "finetune": {"enabled": False, "ckpt_name": "$@bundle_root + '/model/model.pt'"},
    }
    (root / "configs").mkdir()
    (root / "configs" / "hyper_parameters.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    _algo_object(root, work, "segresnet.scripts.algo.SegresnetAlgo")
    return root


def write_dints(work: Path, name: str = "dints_0") -> Path:
    """A DiNTS bundle (2 blocks, 2 depths, channel_mul 0.25, roi 32^3) in the layout of MONAI's dints template."""
    import numpy as np
    import torch

    root = work / name
    _scripts(root, "dints")
    arch = {"node_a": np.ones((3, 2), dtype=np.int64), "code_a": np.ones((2, 4), dtype=np.float64),
            "code_c": np.array([[0, 1, 2, 3], [4, 0, 1, 2]], dtype=np.int64)}
    torch.save(arch, root / "scripts" / "arch_code.pth")
    data_src = yaml.safe_load((work / "data_src.yaml").read_text())
    hyper = {**_common(root, work, data_src), "ckpt_path": "$@bundle_root + '/model_fold' + str(@fold)",
             "training": {
                 "amp": True, "auto_scale_allowed": True, "input_channels": 1, "output_classes": 3,
                 "learning_rate": 0.2, "num_crops_per_image": 1, "num_images_per_batch": 2, "num_patches_per_iter": 1,
                 "num_sw_batch_size": None, "num_epochs": 2, "overlap_ratio_train": 0.125, "random_seed": 0,
                 "roi_size": [32, 32, 32], "roi_size_valid": [32, 32, 32], "softmax": True, "sw_input_on_cpu": False,
                 "resample_resolution": [1.0, 1.0, 1.0],
                 "loss": {"_target_": "DiceFocalLoss", "batch": True, "include_background": True,
                          "sigmoid": "$not @training#softmax", "softmax": "@training#softmax", "squared_pred": True,
                          "to_onehot_y": "@training#softmax", "smooth_nr": 1.0e-05, "smooth_dr": 1.0e-05},
                 "optimizer": {"_target_": "torch.optim.SGD", "lr": "@training#learning_rate", "momentum": 0.9,
                               "weight_decay": 4.0e-05},
             }}
    network = {"_meta_": {}, "training_network": {
        "arch_ckpt_path": "$@bundle_root + '/scripts/arch_code.pth'",
        "arch_ckpt": "$torch.load(@training_network#arch_ckpt_path, map_location=torch.device('cuda'), weights_only=False)",
        "dints_space": {"_target_": "TopologyInstance", "channel_mul": 0.25, "num_blocks": 2, "num_depths": 2,
                        "use_downsample": True, "device": "$torch.device('cuda')",
                        "arch_code": ["$@training_network#arch_ckpt['code_a']", "$@training_network#arch_ckpt['code_c']"]},
        "network": {"_target_": "DiNTS", "dints_space": "$@training_network#dints_space",
                    "in_channels": "@training#input_channels", "num_classes": "@training#output_classes",
                    "use_downsample": True, "node_a": "$@training_network#arch_ckpt['node_a']"},
    }}
    (root / "configs").mkdir()
    (root / "configs" / "hyper_parameters.yaml").write_text(yaml.safe_dump(hyper, sort_keys=False))
    (root / "configs" / "network.yaml").write_text(yaml.safe_dump(network, sort_keys=False))
    _algo_object(root, work, "dints.scripts.algo.DintsAlgo")
    return root


def make_anisotropic_dataset(out: Path, cases: int = 8, size: int = 32, step: int = 4) -> Path:
    """The demo dataset with every ``step``-th slice kept and the slices ``step`` mm apart (1 x 1 x ``step`` mm):
    highly anisotropic by MONAI's rule (``spacing[2] >= 3 (spacing[0] + spacing[1]) / 2``), so MONAI's
    BundleGen generates SegResNet2D for it."""
    import nibabel as nib
    import numpy as np

    from autotune.data.synthetic import make_demo_dataset

    data = make_demo_dataset(out, cases=cases, size=size, classes=2, seed=0)
    for path in sorted((data / "imagesTr").glob("*.nii.gz")) + sorted((data / "labelsTr").glob("*.nii.gz")):
        array = np.asarray(nib.load(path).dataobj)[:, :, ::step].copy()
        nib.save(nib.Nifti1Image(array, np.diag([1.0, 1.0, float(step), 1.0])), path)
    return data


def register_versions(monkeypatch: Any, *bundles: Path) -> None:
    """Add each bundle's script hashes as the known version ``TEST_VERSION`` of its template."""
    from autotune.auto3dseg import recognise, versions

    for root in bundles:
        name = root.name.rsplit("_", 1)[0]
        configs = tuple(sorted(p.name for p in (root / "configs").iterdir()))
        entry = versions.TemplateVersion(name, TEST_VERSION, configs, recognise.script_hashes(root))
        monkeypatch.setitem(versions.KNOWN_VERSIONS, (name, TEST_VERSION), entry)


def start_launcher(argv: Sequence[str], folder: Path) -> Any:
    """Start ``python -m autotune.launch ARGV`` with ``folder`` its working folder, as a process of its own (its
    own pid and session) forked from the probes' fork server (``forked_cli.start_cli``: torch and MONAI already
    imported, the launcher's ``main`` as its entry), stdout and stderr to ``folder``'s ``launch.out`` and
    ``launch.err``; returns its ``forked_cli.CliProcess``. Tests of the launcher's fresh interpreter start
    ``python -m autotune.launch`` itself."""
    from forked_cli import start_cli

    return start_cli(list(argv), folder / "launch.out", folder / "launch.err",
                     target="autotune.auto3dseg.launcher:main", cwd=folder)


def run_launcher(argv: Sequence[str], folder: Path, timeout: float) -> tuple[int, str]:
    """``start_launcher`` to its end: its exit code and its stderr."""
    proc = start_launcher(argv, folder)
    _, err = proc.communicate(timeout)
    return int(proc.returncode), err
