"""Inference writes each prediction in its input's own geometry (orientation, spacing, shape)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from bundle_fixtures import copy_bundle, oblique_copy


@pytest.fixture(scope="module")
def trained_bundle(small_demo_bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from autotune.trainer.runner import train

    bundle = copy_bundle(small_demo_bundles["segresnet_0"], tmp_path_factory.mktemp("infer") / "segresnet_0")
    train(bundle, epochs=1, progress=False)
    return bundle


def test_predictions_match_input_geometry(trained_bundle: Path, small_demo_data: Path, tmp_path: Path) -> None:
    import nibabel as nib

    from autotune.trainer.infer import infer

    inputs = [small_demo_data / "imagesTr" / "case_000.nii.gz",
              oblique_copy(small_demo_data / "imagesTr" / "case_001.nii.gz", tmp_path / "oblique.nii.gz")]
    outputs = infer(trained_bundle, inputs, tmp_path / "pred", checkpoint="last", progress=False)
    assert [p.name for p in outputs] == ["case_000_seg.nii.gz", "oblique_seg.nii.gz"]
    for source, pred in zip(inputs, outputs, strict=True):
        image, seg = nib.load(source), nib.load(pred)
        assert seg.shape == image.shape
        np.testing.assert_allclose(seg.affine, image.affine, atol=1e-5)
        values = np.unique(np.asarray(seg.dataobj))
        assert set(values.tolist()) <= {0, 1, 2}


def test_infer_reads_a_datalist_and_the_cli(trained_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                            ) -> None:
    from autotune.bundles.config import load_bundle_config
    from autotune.cli import main

    datalist = load_bundle_config(trained_bundle).datalist
    assert main(["infer", str(trained_bundle), "--images", datalist, "--output", str(tmp_path / "out"),
                 "--device", "cpu", "--checkpoint", "best", "-q"]) == 0
    written = capsys.readouterr().out.split()
    assert len(written) == 6 and all(Path(p).is_file() for p in written)


def test_missing_checkpoint_says_what_to_run(trained_bundle: Path, small_demo_data: Path, tmp_path: Path) -> None:
    from autotune.errors import ConfigError
    from autotune.trainer.infer import infer

    image = small_demo_data / "imagesTr" / "case_000.nii.gz"
    with pytest.raises(ConfigError, match="autotune train"):
        infer(trained_bundle, [image], tmp_path, checkpoint=str(tmp_path / "nope.pt"))
