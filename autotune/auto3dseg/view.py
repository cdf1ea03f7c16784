"""Read a MONAI bundle the way its ``scripts/train.py`` does, and derive the plain config autotune tunes.

``read_parser`` gives MONAI's ``ConfigParser`` over every file in ``configs/`` (as AutoRunner
passes them to ``train.py``), with the device in place of the templates' hard-coded ``cuda``
expressions and DiNTS's pickled architecture code loaded only after its hash is checked
(``weights_only=True``). ``load_view`` resolves the values the search, the probe and the
estimator read (``roi_size``, channels, classes, batch, sliding window, learning rate, ...)
into plain data marked ``format: monai``; the bundle's own files stay MONAI's.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from autotune.auto3dseg.recognise import identify, monai_bundle_root
from autotune.auto3dseg.reference import reference_block
from autotune.auto3dseg.templates import ConfigReader, find_template
from autotune.auto3dseg.templates.dints import load_arch_code
from autotune.checks.bounded_yaml import check_size, refuse_limits
from autotune.errors import ConfigError
from autotune.utils import read_json, read_yaml

if TYPE_CHECKING:  # pragma: no cover
    from monai.bundle import ConfigParser

    from autotune.bundles.model import BundleConfig

__all__ = ["FORMAT", "TUNING_RELPATH", "read_parser", "load_view", "load_arch_code", "template_of", "config_files",
           "check_config_file", "is_monai_view"]

FORMAT = "monai"
#: provenance of a MONAI bundle: outside ``configs/``, which ``train.py`` reads whole
TUNING_RELPATH = Path("autotune") / "tuning.yaml"
#: MONAI's own search ranges (DiNTS ``customize_param_for_gpu``): images per batch 1-20, sw batch 1-40
DEFAULT_RANGES = {"num_patches_per_iter": [1, 20], "num_sw_batch_size": [1, 40]}


def config_files(root: Path) -> list[str]:
    """The bundle's ``configs/`` files in the order AutoRunner passes them to ``train.py`` (sorted), each
    checked within autotune's limits first (``check_config_file``)."""
    files = [p for p in sorted((root / "configs").iterdir()) if p.suffix in (".yaml", ".json")]
    for path in files:
        check_config_file(path)
    return [str(p) for p in files]


def check_config_file(path: Path) -> None:
    """Refuse a bundle config file MONAI's ``ConfigParser`` should not see: larger than the limit, or (YAML)
    standing for too many values once its aliases are expanded, nested too deep, or holding itself
    (``autotune.checks.bounded_yaml``).

    Raises:
        ConfigError: one line naming the file and the limit.
    """
    check_size(path, str(path), ConfigError)
    if path.suffix == ".yaml":
        try:
            refuse_limits(path.read_text(encoding="utf-8"), str(path), ConfigError)
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path}: cannot be read as YAML ({type(exc).__name__}); regenerate the bundle") from exc


def is_monai_view(config: BundleConfig) -> bool:
    """True for a config read from a view ``load_view`` made (``format: monai``)."""
    return config.format == FORMAT


def template_of(config: BundleConfig) -> str:
    """The MONAI template a config was read from (``segresnet``, ``dints``, ...)."""
    return str(config.monai_template or config.algo)


def read_parser(root: Path, template: str, device: str = "cpu", arch_sha256: str | None = None) -> ConfigParser:
    """MONAI's ``ConfigParser`` over the bundle's configs, as ``train.py`` reads them, on ``device``, prepared by
    the template (``MonaiTemplate.prepare_parser``: DiNTS's architecture code checked against ``arch_sha256``)."""
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config(config_files(root))
    spec = find_template(template)
    if spec is not None:
        spec.prepare_parser(parser, root, device, arch_sha256)
    return parser


def _datastats_path(root: Path) -> str | None:
    """The ``datastats.yaml`` BundleGen read: its ``algo_object.json`` says, else the work folder's."""
    record = root / "algo_object.json"
    if record.is_file():
        state = (read_json(record, ConfigError) or {}).get("_state_") or {}
        if state.get("data_stats_files"):
            return str(state["data_stats_files"])
    beside = root.parent / "datastats.yaml"
    return str(beside) if beside.is_file() else None


def _infer_volume_shape(datastats: str | None, resolution: list[float], roi: list[int]) -> list[int]:
    """The 99.5th-percentile image size at the training spacing (as autotune's own bundles), at least the roi."""
    stats = read_yaml(datastats, ConfigError) if datastats and os.path.isfile(datastats) else None
    sizemm = (((stats or {}).get("stats_summary") or {}).get("image_stats") or {}).get("sizemm") or {}
    p995 = sizemm.get("percentile_99_5")
    if isinstance(p995, list) and p995 and isinstance(p995[0], list):
        p995 = p995[0]
    if not (isinstance(p995, list) and len(p995) >= 3):
        return list(roi)
    return [max(int(math.ceil(float(p995[i]) / resolution[i])), roi[i]) for i in range(3)]


def _num_folds(datalist: str) -> int:
    cases = (read_json(datalist, ConfigError) or {}).get("training") or []
    return len({int(c.get("fold", 0)) for c in cases if isinstance(c, Mapping)}) or 1


def _unsupported_values(reader: ConfigReader) -> dict[str, Any]:
    """Enough of a template autotune does not tune to list and skip it."""
    def get(key: str, default: Any) -> Any:
        for name in (key, f"training#{key}"):
            if reader.has(name):
                value = reader.get(name, default)
                return default if value is None else value
        return default

    roi = [int(v) for v in (list(get("roi_size", [96, 96, 96])) + [1, 1, 1])[:3]]
    return {"roi_size": roi, "roi_size_valid": roi, "input_channels": int(get("input_channels", 1)),
            "output_classes": int(get("output_classes", 2)), "num_patches_per_iter": 1, "num_images_per_batch": 1,
            "num_crops_per_image": 1, "num_sw_batch_size": 1, "sw_input_on_cpu": False, "amp": bool(get("amp", True)),
            "learning_rate": float(get("learning_rate", 1e-4)), "resample_resolution": [1.0, 1.0, 1.0],
            "num_epochs": int(get("num_epochs", 1) or 1), "sigmoid": False, "seed": 0,
            "network": {"name": "unsupported"}, "loss": {"name": "unsupported"}, "optimizer": {"name": "unsupported"}}


def load_view(bundle: str | os.PathLike[str]) -> dict[str, Any]:
    """The plain config of a MONAI bundle, for the search, the probe and the estimator.

    Raises:
        ConfigError: not a known template version, a missing config file, or a key MONAI cannot resolve.
    """
    root = monai_bundle_root(bundle)
    version = identify(bundle)
    assert root is not None  # identify refused anything else
    reader = ConfigReader(read_parser(root, version.name), root / "configs")
    template = find_template(version.name)
    values = template.view_values(reader) if template is not None else _unsupported_values(reader)
    supported = template is not None
    tag = f"monai {version.label}"
    for section in ("network", "loss", "optimizer"):  # the template's version is part of the tuning key
        values[section] = {**values[section], "template": tag}
    datastats = _datastats_path(root)
    cfg: dict[str, Any] = {
        "format": FORMAT, "monai_template": version.name, "monai_template_version": version.version,
        "algo": version.name, "bundle_root": str(root), **values,
        # the template's: fp16 autocast on CUDA; MONAI's scripts autocast with autocast("cuda"), so the loop
        # autotune runs computes fp32 on any CPU (autotune.auto3dseg.workload)
        "amp": bool(values["amp"]),
        # checked again before the child loads the pickle: the request carries the known version's hash
        "arch_code_sha256": version.files.get("scripts/arch_code.pth"),
        "datastats": datastats, "tuning_supported": supported, "tuning_ranges": dict(DEFAULT_RANGES),
        "tuning_validation_devices": ["device", "cpu"],
    }
    cfg["infer_volume_shape"] = _infer_volume_shape(datastats, cfg["resample_resolution"], cfg["roi_size_valid"])
    if supported and os.path.isfile(cfg.get("datalist") or ""):
        cfg["num_fold"] = _num_folds(cfg["datalist"])
    tuning = root / TUNING_RELPATH
    if tuning.is_file():
        cfg["tuning"] = read_yaml(tuning, ConfigError)
    if supported:  # the goodput hand-off's reference: the template's stated batch and its optimizer's lr rule
        block = reference_block(version.name, values, cfg.get("tuning"))
        if block is not None:
            cfg["batch_scaling"] = block
    return cfg
