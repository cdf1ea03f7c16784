"""The goodput hand-off rule on synthetic measurements (no probes)."""

from __future__ import annotations

import math

import pytest

from autotune.search.handoff import DEFAULT_NOISE, decide, per_sample_efficiency

REF = 2


def throughput(n: int, exponent: float, at_ref: float = 4.0) -> float:
    """Synthetic samples/s growing as (N / N_ref) ** exponent."""
    return at_ref * (n / REF) ** exponent


@pytest.mark.parametrize("rule", ["linear", "sqrt", "none"])
@pytest.mark.parametrize("n", [3, 5, 8, 16])
def test_equal_throughput_hands_over_the_reference_batch(rule: str, n: int) -> None:
    verdict = decide(REF, 4.0, n, 4.0, rule)
    assert verdict.handed == REF and not verdict.larger
    assert verdict.speedup is not None and verdict.speedup <= 1.0


@pytest.mark.parametrize("n", [3, 5, 8, 16])
def test_linear_rule_and_throughput_scaling_with_n_hands_over_the_larger_batch(n: int) -> None:
    verdict = decide(REF, throughput(REF, 1.0), n, throughput(n, 1.0), "linear")
    assert verdict.handed == n and verdict.larger
    # linear is taken at the measured regime, e = sqrt(N_ref/N), not the e = 1 it assumes
    assert verdict.efficiency == pytest.approx(math.sqrt(REF / n))
    assert verdict.speedup == pytest.approx(math.sqrt(n / REF))


def test_linear_rule_keeps_the_reference_batch_when_samples_per_s_grows_slower_than_sqrt() -> None:
    # the full-size UNet on the CPU: 8.63 samples/s at 2, 9.64 at 3 (+12%); with e = 1 that passed
    # the 10% margin, and the 3-patch bundle reached Dice 0.80 five epochs later than the 2-patch one
    verdict = decide(2, 8.63, 3, 9.64, "linear")
    assert verdict.handed == 2 and verdict.speedup == pytest.approx(9.64 / 8.63 * math.sqrt(2 / 3))


@pytest.mark.parametrize("n", [5, 8, 16])
def test_sqrt_rule_needs_throughput_faster_than_sqrt_of_the_batch_ratio(n: int) -> None:
    # exactly sqrt(N/N_ref): goodput unchanged, so the reference batch
    at_sqrt = decide(REF, throughput(REF, 0.5), n, throughput(n, 0.5), "sqrt")
    assert at_sqrt.handed == REF and at_sqrt.speedup == pytest.approx(1.0)
    # a bit faster than sqrt but within the noise margin: still the reference batch
    slightly = 1.0 + DEFAULT_NOISE / 2
    within = decide(REF, 4.0, n, 4.0 * math.sqrt(n / REF) * slightly, "sqrt")
    assert within.handed == REF
    # linear throughput: speed-up sqrt(N/N_ref) > 1 + margin for these N -> the larger batch
    linear = decide(REF, throughput(REF, 1.0), n, throughput(n, 1.0), "sqrt")
    assert linear.handed == n and linear.speedup == pytest.approx(math.sqrt(n / REF))
    assert linear.efficiency == pytest.approx(math.sqrt(REF / n))


def test_sqrt_rule_boundary_moves_with_the_margin() -> None:
    n = 8
    growth = math.sqrt(n / REF) * 1.2  # 20% faster than sqrt: wins at the default margin ...
    assert decide(REF, 4.0, n, 4.0 * growth, "sqrt").handed == n
    # ... but not when the measured timing noise is larger than that
    assert decide(REF, 4.0, n, 4.0 * growth, "sqrt", noise=0.25).handed == REF


def test_none_rule_counts_extra_samples_as_wasted() -> None:
    assert per_sample_efficiency("none", 2, 8) == pytest.approx(0.25)
    assert decide(REF, 4.0, 8, 16.0, "none").handed == REF  # linear throughput gives speed-up 1 only
    assert decide(REF, 4.0, 8, 24.0, "none").handed == 8


def test_measured_noise_scale_replaces_the_rule() -> None:
    # Pollux's efficiency (phi + N_ref) / (phi + N); sqrt(N_ref/N) is that at phi = sqrt(N_ref * N)
    assert per_sample_efficiency("sqrt", 2, 8, noise_scale=math.sqrt(16)) == pytest.approx(math.sqrt(2 / 8))
    assert per_sample_efficiency("linear", 2, 8, noise_scale=0.0) == pytest.approx(0.25)
    assert per_sample_efficiency("linear", 2, 8, noise_scale=1e9) == pytest.approx(1.0)


def test_no_larger_batch_or_no_measurement_keeps_the_largest_fit() -> None:
    same = decide(REF, None, REF, 4.0, "linear")
    assert same.handed == REF and same.speedup is None
    smaller = decide(4, None, 2, 4.0, "linear")  # the reference batch does not fit
    assert smaller.handed == 2 and "does not fit" in smaller.line()
    unmeasured = decide(REF, None, 6, None, "sqrt")
    assert unmeasured.handed == 6 and "not measured" in unmeasured.line()


def test_verdict_line_states_inputs_and_answer() -> None:
    verdict = decide(2, 3.0, 5, 3.3, "sqrt")
    line = verdict.line()
    assert line.startswith("samples/s at 2: 3, at 5: 3.3, per-sample efficiency 0.632")
    assert f"predicted speed-up {verdict.speedup:.3g}" in line and line.endswith("-> hand over 2")
    assert verdict.as_dict()["line"] == line
