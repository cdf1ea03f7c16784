"""gpu_customization_specs keyed by any template's name, by MONAI's misspelling of SwinUNETR's (with a
warning naming the right key), and an unknown key refused in one line."""

from __future__ import annotations

import warnings

import pytest

from autotune.errors import SpecError
from autotune.search.driver.bundles import known_templates
from autotune.search.strategies.space import SpecKeyWarning, parse_specs

MONAI_KEYS = {"num_trials": 5, "range_num_images_per_batch": [1, 4], "range_num_sw_batch_size": [2, 8]}


def test_every_template_autotune_knows_is_a_specs_key() -> None:
    """autotune's own templates and MONAI's four; a key for a template not tuned in this run is accepted, unused."""
    known = known_templates()
    assert {"segresnet", "dints", "unet", "swinunetr", "segresnet2d"} <= set(known)
    specs = {name: {"num_trials": 3} for name in known}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the right names warn about nothing
        parsed = parse_specs({**specs, "segresnet2d": {"range_num_images_per_batch": [1, 2]}}, ["segresnet2d"], known)
    assert parsed == {"segresnet2d": {"range_num_patches_per_iter": (1, 2)}}


@pytest.mark.parametrize("template", ["dints", "swinunetr"])
def test_monais_own_spec_keys_are_read_for_its_templates(template: str) -> None:
    """What MONAI's customize_param_for_gpu reads (DiNTS, SwinUNETR): num_trials and the two ranges."""
    parsed = parse_specs({template: MONAI_KEYS}, [template], known_templates())
    assert parsed[template] == {"num_trials": 5, "range_num_patches_per_iter": (1, 4), "range_num_sw_batch_size": (2, 8)}


def test_monais_swunetr_spelling_is_swinunetr_with_a_one_line_warning() -> None:
    with pytest.warns(SpecKeyWarning) as caught:
        parsed = parse_specs({"universal": {"num_trials": 9}, "swunetr": {"num_trials": 4}}, ["segresnet", "swinunetr"],
                             known_templates())
    assert parsed == {"segresnet": {"num_trials": 9}, "swinunetr": {"num_trials": 4}}
    [warning] = [str(w.message) for w in caught]
    assert "\n" not in warning and "'swunetr'" in warning and "write 'swinunetr'" in warning
    with pytest.raises(SpecError, match="not both"), pytest.warns(SpecKeyWarning):
        parse_specs({"swunetr": {}, "swinunetr": {}}, ["swinunetr"], known_templates())


def test_an_unknown_specs_key_is_refused_in_one_line_with_the_valid_ones() -> None:
    with pytest.raises(SpecError) as refused:
        parse_specs({"swinunet": {"num_trials": 3}}, ["segresnet"], known_templates())
    message = str(refused.value)
    assert "\n" not in message and "'swinunet'" in message and "did you mean 'swinunetr'" in message
    assert "segresnet2d" in message and "unet" in message

