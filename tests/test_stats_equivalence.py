"""numdev.stats.equivalence: TOST equivalence, the one-sided harm test and the minimum detectable
effect, checked against scipy.stats, by hand, and by simulations with fixed seeds (each rule must be
able to fail, and must fire at the rate its power says)."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from numdev.stats.equivalence import (
    ALPHA,
    EQUIVALENCE_RULE,
    HARM_RULE,
    INTERVAL_RULE,
    MDE_RULE,
    PAIRED,
    UNPAIRED,
    mde,
    mde_equivalence,
    mde_factor,
    paired_effect,
    power_exceeds,
    power_tost,
    power_two_sided,
    sign_effect,
    sign_needed,
    unpaired_effect,
)
from numdev.stats.intervals import MIN_CI
from numdev.stats.verdicts import FAILS, HOLDS, NOT_MEASURABLE

SIMULATIONS = 2000


def _tolerance(p: float, runs: int = SIMULATIONS) -> float:
    """4 binomial standard errors of a simulated rate (the seeds are fixed: this is the margin a
    correct rule stays within on other seeds too), and at least 0.01."""
    return max(0.01, 4 * math.sqrt(p * (1 - p) / runs))


def test_the_paired_intervals_are_scipys_t_intervals():
    rng = np.random.default_rng(1)
    for n in (5, 7, 12, 40):
        d = rng.normal(0.3, 1.7, size=n)
        effect = paired_effect(d, margin=0.5)
        ci95 = scipy_stats.ttest_1samp(d, 0.0).confidence_interval(0.95)
        ci90 = scipy_stats.ttest_1samp(d, 0.0).confidence_interval(0.90)
        assert (effect.interval.low, effect.interval.high) == pytest.approx((ci95.low, ci95.high), rel=1e-12)
        assert (effect.tost_interval.low, effect.tost_interval.high) == pytest.approx((ci90.low, ci90.high), rel=1e-12)
        assert effect.mean == pytest.approx(d.mean()) and effect.sd == pytest.approx(d.std(ddof=1))
        assert effect.n == n and effect.df == n - 1 and effect.design == PAIRED
        assert effect.interval.method == "t" and effect.as_dict()["interval"]["confidence"] == 0.95
        assert effect.as_dict()["tost_interval"]["confidence"] == 0.9


def test_by_hand_one_to_five():
    # d = 1..5: mean 3, sd sqrt(2.5), se sqrt(0.5); t(0.95, 4) = 2.131846786 -> 90% [1.492557, 4.507443]
    d = [1.0, 2.0, 3.0, 4.0, 5.0]
    half = 2.131846786326649 * math.sqrt(0.5)
    effect = paired_effect(d, margin=5.0)
    assert effect.se == pytest.approx(math.sqrt(0.5), rel=1e-15)
    assert (effect.tost_interval.low, effect.tost_interval.high) == pytest.approx((3 - half, 3 + half), rel=1e-12)
    assert effect.equivalent is True and effect.equivalence.status == HOLDS
    assert effect.exceeds is False and effect.harm.status == FAILS  # upper bound 4.507 < 5: shown smaller
    assert paired_effect(d, margin=4.5).equivalent is False  # 4.507 reaches past 4.5
    assert paired_effect(d, margin=4.5).equivalence.status == NOT_MEASURABLE  # not inside, not wholly outside
    assert paired_effect(d, margin=1.49).exceeds is True and paired_effect(d, margin=1.49).harm.status == HOLDS
    assert paired_effect(d, margin=1.49).equivalence.status == FAILS  # wholly above +1.49
    assert paired_effect(d, margin=1.5).exceeds is False and paired_effect(d, margin=1.5).harm.status == NOT_MEASURABLE


def test_the_tests_are_scipys_one_sided_t_tests():
    """equivalent <=> both one-sided tests reject at alpha; exceeds <=> the test against the margin
    (alternative 'greater') rejects: 600 random cases, margins on both sides of the effect."""
    rng = np.random.default_rng(2)
    agreements = {"equivalent": [0, 0], "exceeds": [0, 0]}
    for _ in range(600):
        n = int(rng.integers(5, 15))
        d = rng.normal(rng.normal(0, 1), rng.uniform(0.2, 2), size=n)
        margin = float(rng.uniform(0.05, 3))
        effect = paired_effect(d, margin)
        lower = scipy_stats.ttest_1samp(d, -margin, alternative="greater").pvalue
        upper = scipy_stats.ttest_1samp(d, margin, alternative="less").pvalue
        harm = scipy_stats.ttest_1samp(d, margin, alternative="greater").pvalue
        assert effect.equivalent == (lower < ALPHA and upper < ALPHA)
        assert effect.exceeds == (harm < ALPHA)
        agreements["equivalent"][effect.equivalent] += 1
        agreements["exceeds"][effect.exceeds] += 1
    assert min(min(v) for v in agreements.values()) > 30  # both outcomes of both tests were exercised


def test_the_unpaired_interval_is_welchs():
    rng = np.random.default_rng(3)
    x, y = rng.normal(1.0, 0.5, size=6), rng.normal(0.2, 2.0, size=9)
    effect = unpaired_effect(x, y, margin=1.0)
    result = scipy_stats.ttest_ind(x, y, equal_var=False)
    ci95, ci90 = result.confidence_interval(0.95), result.confidence_interval(0.90)
    assert effect.design == UNPAIRED and effect.n == 6 and effect.mean == pytest.approx(x.mean() - y.mean())
    assert effect.df == pytest.approx(result.df, rel=1e-12)
    assert (effect.interval.low, effect.interval.high) == pytest.approx((ci95.low, ci95.high), rel=1e-12)
    assert (effect.tost_interval.low, effect.tost_interval.high) == pytest.approx((ci90.low, ci90.high), rel=1e-12)
    assert effect.groups["role"]["n"] == 6 and effect.groups["seeds"]["sd"] == pytest.approx(y.std(ddof=1))
    harm = scipy_stats.ttest_ind(x - 1.0, y, equal_var=False, alternative="greater").pvalue
    assert effect.exceeds == (harm < ALPHA)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_fewer_than_five_replicates_give_a_range_and_no_verdict(n):
    d = [0.4, -0.1, 0.25, 0.05][:n]
    effect = paired_effect(d, margin=1.0)
    assert effect.tost_interval is None and effect.equivalent is None and effect.exceeds is None
    assert effect.interval.method == "range" and effect.as_dict()["interval"]["confidence"] is None
    for verdict in (effect.equivalence, effect.harm):
        assert verdict.status == NOT_MEASURABLE and verdict.detail.startswith(f"n < {MIN_CI}")
        assert verdict.text().startswith(f"– not measurable: n < {MIN_CI}")
    text = effect.text()
    assert "✓" not in text and "✗" not in text and "95%" not in text and "90%" not in text
    if n >= 2:
        assert (effect.interval.low, effect.interval.high) == (min(d), max(d))
        assert f"range of {n}: " in text
    else:
        assert "n/a: 1 replicate" in text and effect.mde is None
    few = unpaired_effect([1.0, 2.0, 3.0, 4.0], [0.0, 1.0, 2.0, 1.0, 0.5, 1.5], margin=1.0)
    assert few.tost_interval is None and few.equivalence.status == NOT_MEASURABLE and "range of 4" in few.text()


def test_five_replicates_are_measurable():
    effect = paired_effect([0.01, -0.02, 0.015, 0.0, -0.005], margin=0.1)
    assert effect.measurable and effect.equivalent is True and effect.exceeds is False
    assert "✓ holds" in effect.text() and "✗ fails" in effect.text()


def test_the_margin_is_a_positive_number_stated_in_advance():
    for margin in (0, -0.1, float("nan"), float("inf"), True, "0.1"):
        with pytest.raises(ValueError, match="margin="):
            paired_effect([0.0] * 5, margin)
    with pytest.raises(ValueError, match="non-finite"):
        paired_effect([0.0, 1.0, float("nan"), 2.0, 3.0], 1.0)


def test_identical_outcomes_are_equivalent_with_a_zero_width_interval():
    effect = paired_effect([0.0] * 6, margin=1e-9)
    assert effect.equivalent is True and effect.exceeds is False and effect.mde == 0 and effect.mde_equivalence == 0
    assert (effect.tost_interval.low, effect.tost_interval.high) == (0.0, 0.0)


def test_the_rules_are_stated_and_copied():
    effect = paired_effect([0.1, 0.2, 0.0, 0.3, 0.1], margin=0.05)
    record = effect.as_dict()
    assert record["equivalence"]["rule"] == EQUIVALENCE_RULE and record["harm"]["rule"] == HARM_RULE
    assert record["rules"]["mde"] == MDE_RULE and record["rules"]["interval"] == INTERVAL_RULE
    assert "90% t interval" in EQUIVALENCE_RULE and "one-sided" in HARM_RULE and "power 0.8" in MDE_RULE
    assert "range of n" in INTERVAL_RULE and "95% Student t" in INTERVAL_RULE


# -- the minimum detectable effect ---------------------------------------------------------------------
def test_the_mde_matches_the_normal_approximation_where_it_should():
    z = scipy_stats.norm.ppf(1 - ALPHA / 2) + scipy_stats.norm.ppf(0.8)  # 2.8016
    assert mde_factor(100_000) == pytest.approx(z, rel=1e-3)
    assert mde(0.25, 100_000) == pytest.approx(0.25 * z, rel=1e-3)
    # with few replicates the t's heavier tails and the estimated sd need a larger effect
    assert mde_factor(4) > mde_factor(9) > mde_factor(29) > z
    assert mde_factor(4) == pytest.approx(3.7611, abs=1e-3)  # the noncentral t, solved: power 0.8 at lambda 3.7611
    assert power_two_sided(mde_factor(4), 1.0, 4) == pytest.approx(0.8, abs=1e-9)
    # equivalence at true difference 0: 2 Phi(m/se - z_0.95) - 1 = 0.8 for a known sd
    z_eq = scipy_stats.norm.ppf(1 - ALPHA) + scipy_stats.norm.ppf(0.9)  # 2.9264
    assert mde_equivalence(1.0, 100_000) == pytest.approx(z_eq, rel=1e-3)
    assert power_tost(z_eq, 1.0, 1e7) == pytest.approx(0.8, abs=1e-3)


def test_the_mde_is_detected_at_the_stated_power_in_simulation():
    """Draw data whose true mean is the MDE computed from the true sd: the two-sided t-test rejects
    ~80% of the time."""
    rng = np.random.default_rng(4)
    for n in (5, 8):
        sigma = 0.7
        effect = mde(sigma / math.sqrt(n), n - 1)
        data = rng.normal(effect, sigma, size=(SIMULATIONS, n))
        rate = float((scipy_stats.ttest_1samp(data, 0.0, axis=1).pvalue < ALPHA).mean())
        assert abs(rate - 0.8) < _tolerance(0.8), (n, rate)


def test_a_positive_control_is_found_at_its_power():
    """True effect 3x the margin, n = 5..10: `exceeds` fires at the one-sided test's power (noncentral t)."""
    rng = np.random.default_rng(5)
    margin, sigma = 1.0, 3.0
    rates = {}
    for n in range(5, 11):
        data = rng.normal(3 * margin, sigma, size=(SIMULATIONS, n))
        rate = float(np.mean([paired_effect(d, margin).exceeds for d in data]))
        expected = power_exceeds(3 * margin, margin, sigma / math.sqrt(n), n - 1)
        rates[n] = (round(rate, 3), round(expected, 3))
        assert abs(rate - expected) < _tolerance(expected), (n, rate, expected)
    assert rates[10][1] > rates[5][1] > 0.3  # more replicates, more power; and the control is found


def test_a_null_effect_neither_harms_nor_escapes_equivalence():
    """True effect 0: `exceeds` false in >= 95% of runs; `equivalent` true at the TOST's power, which is
    0.8 at the margin the equivalence MDE gives for the true sd."""
    rng = np.random.default_rng(6)
    sigma = 1.0
    for n in (5, 7, 10):
        se = sigma / math.sqrt(n)
        margin = mde_equivalence(se, n - 1)
        data = rng.normal(0.0, sigma, size=(SIMULATIONS, n))
        effects = [paired_effect(d, margin) for d in data]
        exceeds = np.mean([e.exceeds for e in effects])
        equivalent = np.mean([e.equivalent for e in effects])
        assert exceeds <= 0.05
        assert abs(equivalent - 0.8) < _tolerance(0.8), (n, equivalent)
        half = margin / 2  # a margin the design cannot reach: equivalence is rarely declared, at the stated rate
        rare = np.mean([paired_effect(d, half).equivalent for d in data])
        assert abs(rare - power_tost(half, se, n - 1)) < _tolerance(power_tost(half, se, n - 1)), (n, rare)


def test_the_harm_test_holds_its_size_at_the_margin():
    """True effect exactly at the margin: `exceeds` fires at alpha (paired and Welch)."""
    rng = np.random.default_rng(7)
    data = rng.normal(0.5, 1.0, size=(SIMULATIONS, 6))
    rate = np.mean([paired_effect(d, 0.5).exceeds for d in data])
    assert abs(rate - ALPHA) < _tolerance(ALPHA), rate
    role, seeds = rng.normal(0.5, 1.0, size=(SIMULATIONS, 6)), rng.normal(0.0, 0.5, size=(SIMULATIONS, 8))
    rate = np.mean([unpaired_effect(r, s, 0.5).exceeds for r, s in zip(role, seeds)])
    assert abs(rate - ALPHA) < _tolerance(ALPHA) + 0.01, rate  # Welch's df is an approximation
    null = np.mean([unpaired_effect(r - 0.5, s, 0.5).exceeds for r, s in zip(role, seeds)])
    assert null <= 0.05


# -- the sign test ------------------------------------------------------------------------------------
def test_the_sign_tests_p_values_are_scipys_binomial_tails():
    d = [0.5, 0.04, 0.2, -0.01, 1e6, 0.031]
    s = sign_effect(d, 0.03)
    assert s.counts == {"above": 5, "inside": 1, "below": 0, "positive": 5, "negative": 1}
    assert s.p["above_upper"] == pytest.approx(scipy_stats.binomtest(5, 6, 0.5, alternative="greater").pvalue)
    assert s.p["above_upper"] == pytest.approx(7 / 64)  # by hand: P(X >= 5), X ~ B(6, 1/2) = (6 + 1) / 64
    assert s.p["below_upper"] == pytest.approx(63 / 64)  # one of six below +margin: P(X >= 1)
    assert sign_needed(5) == 5 and sign_needed(6) == 6 and sign_needed(10) == 9  # 1/32 < 0.05; 7/64 > 0.05; 11/1024
    assert sign_needed(4) is None  # four coin flips can never reject at 0.05


@pytest.mark.parametrize("d, harm, equivalence", [
    ([0.1, 0.2, 5.0, 1e5, 0.04], HOLDS, FAILS),  # every replicate above: one diverged run does not hide it
    ([0.01, -0.02, 0.005, 0.02, -0.01], FAILS, HOLDS),  # every replicate inside +-margin
    ([0.01, -0.02, 0.05, 0.02, -0.01], NOT_MEASURABLE, NOT_MEASURABLE),  # one outside: four of five cannot reject
    ([-0.1, -0.2, -0.5, -0.1, -0.04], FAILS, FAILS),  # all below -margin: not equivalent, and not harm
    ([0.1, 0.2, 0.3], NOT_MEASURABLE, NOT_MEASURABLE),  # three replicates: never a verdict
])
def test_the_sign_test_reads_the_replicates_not_their_sizes(d, harm, equivalence):
    s = sign_effect(d, 0.03)
    assert (s.harm.status, s.equivalence.status) == (harm, equivalence)
    scaled = sign_effect([x * 1e3 if x > 0.03 else x for x in d], 0.03)  # sizes beyond the bound do not matter
    assert (scaled.harm.status, scaled.equivalence.status) == (harm, equivalence)


def test_where_the_t_test_is_blind_to_a_diverged_control_the_sign_test_is_not():
    """lr x10 in the committed 1500-step study: every replicate above the margin, effects over six decades."""
    d = [1.64, 8701654.5, 5066070.0, 651807.8, 661472.3]
    assert paired_effect(d, 0.03).harm.status == NOT_MEASURABLE
    assert sign_effect(d, 0.03).harm.status == HOLDS


def test_the_sign_test_holds_its_size_at_the_margin():
    """True median exactly at the margin (a skewed, heavy-tailed distribution): harm fires at most at alpha."""
    rng = np.random.default_rng(8)
    data = 0.5 + rng.standard_t(1.5, size=(SIMULATIONS, 5))  # median 0.5, infinite variance
    rate = np.mean([sign_effect(d, 0.5).harm.status == HOLDS for d in data])
    assert rate <= 1 / 32 + _tolerance(1 / 32), rate  # exact: P(5 of 5 above) = 1/32 at the margin
    assert abs(rate - 1 / 32) < _tolerance(1 / 32), rate
