"""The MONAI Auto3DSeg template versions autotune knows: SHA-256 of each template's scripts.

A bundle that MONAI's ``BundleGen`` generated carries the template's ``scripts/`` unchanged,
so the hashes name the template and its version, and tell a tampered script from a known one.
``configs`` names the files the version writes into ``configs/`` (each must be there).
The table is data computed from the templates (``benchmarks/monai_template_hashes.py``), not
a copy of them. The templates registered in ``autotune.auto3dseg.templates`` are the ones whose
training step autotune builds; the others are recognised and left as generated ("does not support
tuning").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["TemplateVersion", "KNOWN_VERSIONS", "MONAI_DEFAULT_VERSION", "supported_line"]

#: ``MONAI_ALGO_HASH`` of MONAI 1.6.1 (``monai/utils/misc.py``): the templates it downloads by default
MONAI_DEFAULT_VERSION = "21ed8e5"


@dataclass(frozen=True)
class TemplateVersion:
    """One version of one template: its name, version, config file names and file hashes."""

    name: str
    version: str
    configs: tuple[str, ...]
    files: Mapping[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"


def _version(configs: tuple[str, ...], files: Mapping[str, str]) -> dict[str, object]:
    return {"configs": configs, "files": dict(files)}


_TABLE: dict[tuple[str, str], dict[str, object]] = {
    ('segresnet', '21ed8e5'): _version(
        configs=('hyper_parameters.yaml',),
        files={
            "scripts/__init__.py": "b3d76349dea4bd588f9c5bcc475d4381ddf42efe2863a15a3c9af86592592ead",
            "scripts/algo.py": "37e2d6ff0d7244fe734949aa5ace5ac64306b3002bdc3dacefad745d4fec7a8b",
            "scripts/infer.py": "55d90df3430f0b11740c04c232d85038077d5395863963ef350f7f11c14ae93c",
            "scripts/segmenter.py": "0477831782c5855966f2a4dd3c5079f1bc93b7d2e6331e6a0badde6e40b41d43",
            "scripts/train.py": "35929803646ddc9c94251600f47b0b67881cf2e07668295f2412cbb10f141024",
            "scripts/utils.py": "a66d447c1f77d7f20f63b19ce92c4cd9a7684134865c92c544e75c14b4e805d5",
            "scripts/validate.py": "958a94e384fa01244d1b863848816306f018c8fd7de2d49b5cbdef54a0a3c4d0",
        },
    ),
    ('dints', '21ed8e5'): _version(
        configs=('hyper_parameters.yaml', 'hyper_parameters_search.yaml', 'network.yaml', 'network_search.yaml', 'transforms_infer.yaml', 'transforms_train.yaml', 'transforms_validate.yaml'),
        files={
            "scripts/__init__.py": "b3d76349dea4bd588f9c5bcc475d4381ddf42efe2863a15a3c9af86592592ead",
            "scripts/algo.py": "216830943f2056729294225b16786e9b88ef793ee42c2f360fc568c593116347",
            "scripts/arch_code.pth": "cbd8418d29563d32c1fac23a2ad05ec847b926176595aaff27a1b4b1167b3d97",
            "scripts/dummy_runner.py": "fa134f44090da1cf123b427bb097d09fed36caba4288e210661f4d8715dff337",
            "scripts/infer.py": "be1f2bc28fb526d384deddd5c0a0774068246e6cb71c4e7983e021473bf5fb4c",
            "scripts/search.py": "70b1affaa36eed6d844bfd75717c49f6fad366dc94bae864a9e6e566d70c4ce4",
            "scripts/train.py": "eabbea9ca246dba5eccce75562b4cd515ec5466f8b4a83e442ab8836890889b4",
            "scripts/utils.py": "cccc6f6639e5577baf4f9af71c4a9c141139f80be1e6e993edc828bd674518d7",
            "scripts/validate.py": "f68cfa0cf819d89ef8eacc72f0f308de8c36a8feeea0e6b8464aed063d2c74d9",
        },
    ),
    ('swinunetr', '21ed8e5'): _version(
        configs=('hyper_parameters.yaml', 'network.yaml', 'transforms_infer.yaml', 'transforms_train.yaml', 'transforms_validate.yaml'),
        files={
            "scripts/__init__.py": "b3d76349dea4bd588f9c5bcc475d4381ddf42efe2863a15a3c9af86592592ead",
            "scripts/algo.py": "8b418221bb87efecd221bc5d4b9176088358b4045629ac86d93926a60eb8a2d1",
            "scripts/dummy_runner.py": "90f25b86a5b7d424a6bb7831b275906c2cc8f741dc833c140428ddb488070286",
            "scripts/infer.py": "9bbe4488c2784d1f6705f7751721ec141062d721f568653651222fb73b9f89c9",
            "scripts/train.py": "76a60432dbb6f0ded0148cfa3aac8940b201d6b4fcfd6c2e6b2804e0e5d9a1a9",
            "scripts/validate.py": "dda87535e4dfad8b27f50055abe99c2aec6d4121553264fe07ea67135683ba7f",
        },
    ),
    ('segresnet2d', '21ed8e5'): _version(
        configs=('hyper_parameters.yaml',),
        files={
            "scripts/__init__.py": "b3d76349dea4bd588f9c5bcc475d4381ddf42efe2863a15a3c9af86592592ead",
            "scripts/algo.py": "1cceb5dcbd8467d0f1da9632030895f9efa5f9be54071bd41075e023c168a1bd",
            "scripts/infer.py": "a2b09d0ca302aa31b031b8e28d872679852ba7ab11bdcb426215cecab34694d4",
            "scripts/segmenter.py": "ef7ef494fcf51605fa04bc6ae38333dee4e4f6488c2a35866df7224b685c7f66",
            "scripts/segmenter_2d.py": "561076218d4ea1d978548e3426f47ae767637489b2db78ea49da40a1e538401c",
            "scripts/train.py": "895b00236546a4515e6c3bacc27406196ee461f08310a3c8c7ea41517b3d77bc",
            "scripts/utils.py": "183ea6bee1f7dbea2ec8b9f57cb78366fe5600245fbb06852869ea9f641928ff",
            "scripts/validate.py": "7d669f97a85f22c8d024dcf90a59335f86c412f8205dac756ca62d6214e32aaa",
        },
    ),
}

#: (template, version) -> its hashes; tests add versions of their own small bundles here
KNOWN_VERSIONS: dict[tuple[str, str], TemplateVersion] = {
    key: TemplateVersion(key[0], key[1], tuple(entry["configs"]), dict(entry["files"]))  # type: ignore[arg-type]
    for key, entry in _TABLE.items()
}


def supported_line() -> str:
    """``segresnet 21ed8e5, dints 21ed8e5``: the versions whose training autotune builds (registered templates)."""
    from autotune.auto3dseg.templates import find_template

    return ", ".join(v.label for v in KNOWN_VERSIONS.values() if find_template(v.name) is not None)
