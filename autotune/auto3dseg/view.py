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

from autotune.auto3dseg import segresnet2d
from autotune.auto3dseg.recognise import file_sha256, identify, monai_bundle_root
from autotune.auto3dseg.reference import reference_block
from autotune.auto3dseg.versions import SUPPORTED
from autotune.checks.bounded_yaml import check_size, refuse_limits
from autotune.errors import ConfigError
from autotune.utils import plain_data, read_json, read_yaml

if TYPE_CHECKING:  # pragma: no cover
    from monai.bundle import ConfigParser

__all__ = ["FORMAT", "TUNING_RELPATH", "read_parser", "load_view", "load_arch_code", "template_of", "config_files",
           "check_config_file", "is_monai_view"]

FORMAT = "monai"
#: provenance of a MONAI bundle: outside ``configs/``, which ``train.py`` reads whole
TUNING_RELPATH = Path("autotune") / "tuning.yaml"
#: MONAI's own search ranges (DiNTS ``customize_param_for_gpu``): images per batch 1-20, sw batch 1-40
DEFAULT_RANGES = {"num_patches_per_iter": [1, 20], "num_sw_batch_size": [1, 40]}
SEGRESNET_SW_OVERLAP = 0.625  # Segmenter's default SlidingWindowInfererAdapt


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


def is_monai_view(cfg: Any) -> bool:
    """True for a config ``load_view`` made (``format: monai``)."""
    return isinstance(cfg, Mapping) and cfg.get("format") == FORMAT


def template_of(cfg: Mapping[str, Any]) -> str:
    """The MONAI template a view was read from (``segresnet``, ``dints``, ...)."""
    return str(cfg.get("monai_template") or cfg.get("algo"))


def load_arch_code(root: Path, expected_sha256: str | None, label: str = "dints") -> dict[str, Any]:
    """DiNTS's ``scripts/arch_code.pth``, hash-checked, then loaded with ``weights_only=True`` on the CPU.

    Raises:
        ConfigError: its hash differs from the known version's (checked again here: it is a pickle).
    """
    import numpy as np
    import torch

    path = root / "scripts" / "arch_code.pth"
    if expected_sha256 is None or not path.is_file() or file_sha256(path) != expected_sha256:
        raise ConfigError(f"{path}: differs from MONAI's {label} architecture code; regenerate the bundle")
    # the file holds numpy arrays (node_a, code_a, code_c): allow exactly what rebuilds them
    rebuild = getattr(np, "_core", np.core).multiarray._reconstruct
    allowed = [(rebuild, "numpy.core.multiarray._reconstruct"), (rebuild, "numpy._core.multiarray._reconstruct"),
               np.ndarray, np.dtype, *(type(np.dtype(kind)) for kind in ("int64", "int32", "float64", "float32"))]
    with torch.serialization.safe_globals(allowed):
        return dict(torch.load(path, map_location="cpu", weights_only=True))


def read_parser(root: Path, template: str, device: str = "cpu", arch_sha256: str | None = None) -> ConfigParser:
    """MONAI's ``ConfigParser`` over the bundle's configs, as ``train.py`` reads them, on ``device``.

    DiNTS's ``training_network#arch_ckpt`` (``torch.load(..., weights_only=False)`` on ``cuda`` in the
    template) becomes the architecture code checked against ``arch_sha256`` (None: not loaded, nothing
    can load it), and ``dints_space#device`` becomes ``device``.
    """
    import torch
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config(config_files(root))
    if template == "dints":
        arch = load_arch_code(root, arch_sha256, f"{template} (sha256 {str(arch_sha256)[:12]})") if arch_sha256 else None
        parser["training_network#arch_ckpt"] = arch
        parser["training_network#dints_space#device"] = torch.device(device)
    return parser


def _parsed(parser: ConfigParser, key: str, where: Path, default: Any = None) -> Any:
    if key not in parser:
        return default
    try:
        return parser.get_parsed_content(key)
    except Exception as exc:  # noqa: BLE001 - MONAI raises several kinds for a bad expression
        raise ConfigError(f"{where}: MONAI cannot resolve key {key!r} ({type(exc).__name__}: {exc})") from exc


def _section(parser: ConfigParser, key: str, where: Path) -> dict[str, Any]:
    """A ``_target_`` section resolved to plain data: ``{"name": target, "args": {...}}``."""
    try:
        resolved = parser.get_parsed_content(key, instantiate=False).get_config()
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"{where}: MONAI cannot resolve section {key!r} ({type(exc).__name__}: {exc})") from exc
    args = {k: v for k, v in dict(resolved).items() if k != "_target_"}
    return {"name": str(resolved.get("_target_")).rsplit(".", 1)[-1], "args": plain_data(args, str_other=True)}


def _xyz(value: Any, key: str, where: Path, kind: type = int) -> list[Any]:
    if not (isinstance(value, (list, tuple)) and len(value) == 3):
        raise ConfigError(f"{where}: key {key!r} must be three numbers, got {value!r}")
    return [kind(v) for v in value]


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


def _segresnet_values(parser: ConfigParser, where: Path) -> dict[str, Any]:
    """SegResNet's Segmenter: one optimizer step per loader batch of batch_size x crops patches."""
    batch = int(_parsed(parser, "batch_size", where, 1))
    crops = int(_parsed(parser, "num_crops_per_image", where, 1))
    steps = int(_parsed(parser, "num_steps_per_image", where, None) or 1)
    inferrer = parser.get("sliding_inferrer") if "sliding_inferrer" in parser else None
    sw_batch, overlap, sw_cpu = 1, SEGRESNET_SW_OVERLAP, False
    if isinstance(inferrer, Mapping):
        sw_batch = int(_parsed(parser, "sliding_inferrer#sw_batch_size", where, 1))
        overlap = float(_parsed(parser, "sliding_inferrer#overlap", where, SEGRESNET_SW_OVERLAP))
        sw_cpu = str(_parsed(parser, "sliding_inferrer#device", where, "") or "") == "cpu"
    roi = _xyz(_parsed(parser, "roi_size", where), "roi_size", where)
    source = f"batch_size {batch} x num_crops_per_image {crops}" + (f" / num_steps_per_image {steps}" if steps > 1 else "")
    return {
        "roi_size": roi, "roi_size_valid": roi, "batch_source": f"{source} patches per optimizer step",
        "input_channels": int(_parsed(parser, "input_channels", where)),
        "output_classes": int(_parsed(parser, "output_classes", where)),
        "num_patches_per_iter": max(1, batch * crops // steps),
        "num_images_per_batch": max(1, batch * crops // steps), "num_crops_per_image": 1,
        "num_sw_batch_size": sw_batch, "sw_input_on_cpu": sw_cpu, "sw_overlap": overlap,
        "amp": bool(_parsed(parser, "amp", where, True)),
        "learning_rate": float(_parsed(parser, "learning_rate", where)),
        "resample_resolution": _xyz(_parsed(parser, "resample_resolution", where, [1.0, 1.0, 1.0]),
                                    "resample_resolution", where, float),
        "num_epochs": int(_parsed(parser, "num_epochs", where, 300)),
        "sigmoid": bool(_parsed(parser, "sigmoid", where, False)), "seed": 0,
        "channels_last": bool(_parsed(parser, "channels_last", where, True)),
        "auto_scale_allowed": bool(_parsed(parser, "auto_scale_allowed", where, False)),
        "fold": int(_parsed(parser, "fold", where, 0)),
        "datalist": str(_parsed(parser, "data_list_file_path", where)),
        "dataroot": str(_parsed(parser, "data_file_base_dir", where)),
        "network": _section(parser, "network", where), "loss": _section(parser, "loss", where),
        "optimizer": _section(parser, "optimizer", where),
    }


def _dints_values(parser: ConfigParser, where: Path) -> dict[str, Any]:
    """DiNTS's train.py: loader batches of images x crops, stepped through in passes of num_patches_per_iter."""
    def get(key: str, default: Any = None) -> Any:
        return _parsed(parser, f"training#{key}", where, default)

    sw_batch = get("num_sw_batch_size")
    space = {k: _parsed(parser, f"training_network#dints_space#{k}", where)
             for k in ("num_blocks", "num_depths", "channel_mul", "use_downsample")}
    roi = _xyz(get("roi_size"), "training#roi_size", where)
    source = (f"training#num_patches_per_iter {get('num_patches_per_iter')} patches per optimizer step (train.py steps "
              f"through its loader batch of num_images_per_batch {get('num_images_per_batch')} x num_crops_per_image "
              f"{get('num_crops_per_image')} in passes of it)")
    return {
        "batch_source": source,
        "roi_size": roi, "roi_size_valid": _xyz(get("roi_size_valid", roi), "training#roi_size_valid", where),
        "input_channels": int(get("input_channels")), "output_classes": int(get("output_classes")),
        "num_patches_per_iter": int(get("num_patches_per_iter")), "num_images_per_batch": int(get("num_images_per_batch")),
        "num_crops_per_image": int(get("num_crops_per_image")),
        "num_sw_batch_size": int(sw_batch) if sw_batch is not None else 1,  # train.py's default on the device
        "sw_input_on_cpu": bool(get("sw_input_on_cpu", False)), "sw_overlap": float(get("overlap_ratio_train", 0.125)),
        "amp": bool(get("amp", True)), "learning_rate": float(get("learning_rate")),
        "resample_resolution": _xyz(get("resample_resolution", [1.0, 1.0, 1.0]), "training#resample_resolution",
                                    where, float),
        "num_epochs": int(get("num_epochs", 200)), "sigmoid": not bool(get("softmax", True)),
        "seed": int(get("random_seed", 0) or 0), "auto_scale_allowed": bool(get("auto_scale_allowed", False)),
        "fold": int(_parsed(parser, "fold", where, 0)),
        "datalist": str(_parsed(parser, "data_list_file_path", where)),
        "dataroot": str(_parsed(parser, "data_file_base_dir", where)),
        "network": {"name": "DiNTS", "args": plain_data(space)},
        "loss": _section(parser, "training#loss", where), "optimizer": _section(parser, "training#optimizer", where),
    }


def _segresnet2d_values(parser: ConfigParser, where: Path) -> dict[str, Any]:
    """SegResNet2D's Segmenter2D (``autotune.auto3dseg.segresnet2d``)."""
    return segresnet2d.view_values(lambda key, default: _parsed(parser, key, where, default),
                                   lambda key: _section(parser, key, where), where)


def _swinunetr_values(parser: ConfigParser, where: Path) -> dict[str, Any]:
    """SwinUNETR's ``train.py`` (``autotune.auto3dseg.swinunetr``)."""
    from autotune.auto3dseg.swinunetr import view_values

    return view_values(parser, where, _parsed, _section, _xyz)


def _unsupported_values(parser: ConfigParser, where: Path) -> dict[str, Any]:
    """Enough of a template autotune does not tune to list and skip it."""
    def get(key: str, default: Any) -> Any:
        for name in (key, f"training#{key}"):
            if name in parser:
                value = _parsed(parser, name, where, default)
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
    parser = read_parser(root, version.name)
    where = root / "configs"
    readers = {"segresnet": _segresnet_values, "dints": _dints_values, segresnet2d.NAME: _segresnet2d_values,
               "swinunetr": _swinunetr_values}
    values = readers.get(version.name, _unsupported_values)(parser, where)
    supported = version.name in SUPPORTED
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
