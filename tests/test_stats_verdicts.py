"""numdev.stats.intervals (bootstrap intervals over seeds), numdev.stats.verdicts (stated rules) and numdev.runs.provenance."""

import math
import subprocess

import numpy as np
import pytest
from scipy import stats as scipy_stats

from numdev.runs.provenance import machine_line, provenance
from numdev.stats.intervals import mean_interval, ratio_interval, statistic_interval
from numdev.stats.verdicts import (
    FAILS,
    HOLDS,
    NOT_MEASURABLE,
    PARTLY,
    Verdict,
    combine,
    monotone_verdict,
    range_verdict,
    ratio_verdict,
)


def test_mean_interval_covers_the_truth_at_about_the_stated_rate():
    # 300 experiments of 12 seeds from N(5, 2): the percentile bootstrap's 95% interval should
    # cover 5 in roughly 95% of them (it under-covers a little at n=12; a broken interval misses).
    rng = np.random.default_rng(0)
    covered = sum(mean_interval(rng.normal(5.0, 2.0, size=12), seed=i).excludes(5.0) is False for i in range(300))
    assert 0.85 <= covered / 300 <= 0.99


def test_mean_interval_matches_scipy_and_brackets_the_mean():
    from scipy import stats

    x = np.array([1.0, 2.0, 4.0, 3.5, 2.2])
    estimate = mean_interval(x, seed=3)
    reference = stats.bootstrap((x,), np.mean, n_resamples=2000, method="percentile", random_state=np.random.default_rng(3))
    assert estimate.value == pytest.approx(x.mean())
    assert estimate.low == pytest.approx(reference.confidence_interval.low)
    assert estimate.high == pytest.approx(reference.confidence_interval.high)
    assert estimate.low < x.mean() < estimate.high


def test_ratio_interval_is_paired_and_is_the_ratio_of_means():
    rng = np.random.default_rng(1)
    common = rng.lognormal(0, 1.0, size=8)  # seed-to-seed variation shared by both: pairing cancels it
    estimate = ratio_interval(3.0 * common, common, seed=0)
    assert estimate.value == pytest.approx(3.0)
    assert estimate.low == pytest.approx(3.0) and estimate.high == pytest.approx(3.0)
    noisy = ratio_interval(3.0 * common * rng.uniform(0.9, 1.1, 8), common, seed=0)
    assert noisy.low < noisy.value < noisy.high and noisy.excludes(1.0)


def test_one_seed_has_no_interval_and_nonfinite_is_refused():
    one = mean_interval([2.0])
    assert one.n == 1 and not one.has_interval and math.isnan(one.low) and "n/a" in one.text()
    two = mean_interval([2.0, 3.0])  # two seeds: a bootstrap interval would be a formality
    assert not two.has_interval and two.as_dict()["low"] is None and two.value == 2.5
    with pytest.raises(ValueError, match="non-finite"):
        mean_interval([1.0, float("nan")])
    with pytest.raises(ValueError, match="as many"):
        ratio_interval([1.0, 2.0], [1.0])
    assert statistic_interval([1.0, 5.0, 2.0], np.median).value == 2.0


def test_ratio_verdict_holds_fails_and_not_measurable():
    above = ratio_interval([10.0, 11.0, 9.5, 10.2, 10.6], [1.0, 1.1, 0.9, 1.0, 1.05])
    assert ratio_verdict(above, "above").status == HOLDS
    assert ratio_verdict(above, "below").status == FAILS
    straddling = ratio_interval([0.8, 1.3, 0.9, 1.2, 1.0], [1.0, 1.0, 1.0, 1.0, 1.0])
    assert ratio_verdict(straddling, "above").status == NOT_MEASURABLE
    single = ratio_interval([10.0], [1.0])
    assert ratio_verdict(single, "above").status == NOT_MEASURABLE


def test_range_verdict_for_a_paper_range():
    inside = ratio_interval([3.0, 3.2, 2.9, 3.1, 3.05], [1.0] * 5)
    assert range_verdict(inside, 2, 5).status == HOLDS
    below = ratio_interval([1.0, 1.2, 0.9, 1.1, 1.05], [1.0] * 5)
    assert range_verdict(below, 2, 5).status == FAILS
    straddle = ratio_interval([1.5, 2.5, 1.8, 2.6, 2.1], [1.0] * 5)
    assert range_verdict(straddle, 2, 5).status == NOT_MEASURABLE


def _seeds(values_by_x) -> dict:
    """{seed: curve} from the values at each x (one column per seed)."""
    columns = np.asarray(values_by_x, dtype=np.float64).T
    return {seed: list(column) for seed, column in enumerate(columns)}


def test_monotone_verdict_on_synthetic_trends():
    rng = np.random.default_rng(2)
    x = [256, 512, 1024, 2048, 4096]
    rising = _seeds([np.exp(0.5 * i) + rng.normal(0, 0.05, 5) for i in range(5)])
    assert monotone_verdict(x, rising, "increasing").status == HOLDS
    assert monotone_verdict(x, rising, "decreasing").status == FAILS
    flat = _seeds([rng.normal(1.0, 0.5, 5) for _ in range(5)])
    assert monotone_verdict(x, flat, "increasing").status == NOT_MEASURABLE
    assert monotone_verdict(x[:2], {seed: curve[:2] for seed, curve in rising.items()}, "increasing").status == NOT_MEASURABLE
    assert "1 distinct x value(s)" in monotone_verdict([7] * 5, rising, "increasing").detail
    assert "2 seed(s)" in monotone_verdict(x, {0: rising[0], 1: rising[1]}, "increasing").detail
    ragged = {**rising, 0: rising[0][:-1]}
    assert "4 values for 5 x values" in monotone_verdict(x, ragged, "increasing").detail
    # a 'holds' with reversals says how many
    bumpy = _seeds([np.full(5, v) + rng.normal(0, 1e-3, 5) for v in (1, 2, 1.5, 3, 4, 5)])
    verdict = monotone_verdict(list(range(6)), bumpy, "increasing")
    assert verdict.status == HOLDS and "5 of 25 steps" in verdict.detail and "range of 5" in verdict.detail


def test_monotone_verdict_tests_over_seeds_not_over_the_points_of_one_cumulative_curve():
    """Driftless random walks: a Kendall test over the points of the seeds' curves (serially dependent)
    calls 'only grows' far more often than its 5%; one tau per seed tested over seeds holds its size."""
    rng = np.random.default_rng(0)
    x = np.arange(1, 41)
    pooled, per_seed, trials = 0, 0, 400
    for _ in range(trials):
        walks = np.cumsum(rng.normal(size=(5, len(x))), axis=1)
        pooled += scipy_stats.kendalltau(np.tile(x, 5), walks.ravel(), alternative="greater").pvalue < 0.05
        per_seed += monotone_verdict(x, dict(enumerate(walks)), "increasing").status == HOLDS
    assert pooled / trials > 0.2  # the pooled test's false-positive rate on walks with no drift
    assert per_seed / trials < 0.09  # 5% nominal; 400 trials put a binomial 99.9% bound near 8.4%
    drifting = {seed: np.cumsum(rng.normal(0.5, 1.0, len(x))) for seed in range(5)}
    assert monotone_verdict(x, drifting, "increasing").status == HOLDS


def test_combine_is_never_green_on_half_a_claim():
    h, f, n = Verdict(HOLDS, "r"), Verdict(FAILS, "r"), Verdict(NOT_MEASURABLE, "r")
    assert combine({"a": h, "b": h}).status == HOLDS
    assert combine({"a": h, "b": f}).status == PARTLY
    assert combine({"a": h, "b": n}).status == PARTLY
    assert combine({"a": f, "b": n}).status == FAILS
    assert combine({"a": n, "b": n}).status == NOT_MEASURABLE
    with pytest.raises(ValueError):
        Verdict("green", "r")


def test_provenance_names_machine_versions_and_commit():
    block = provenance(seeds=[0, 1, 2], threads=2)
    assert block["machine"]["cpu"] and block["machine"]["torch_threads"] == 2
    assert block["seeds"] == [0, 1, 2] and block["versions"]["torch"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        head = None
    if head is not None:
        assert block["git"]["commit"] == head and isinstance(block["git"]["dirty"], bool)
    assert "2 thread(s)" in machine_line(block)


def test_docblocks_replace_only_the_marked_block(tmp_path):
    from numdev.report.docblocks import read_block, replace_block

    doc = tmp_path / "README.md"
    doc.write_text("intro\n<!-- numdev:begin t -->\nold 1.0\n<!-- numdev:end t -->\noutro\n")
    replace_block(doc, "t", "| a | 2.0 |")
    assert doc.read_text() == "intro\n<!-- numdev:begin t -->\n| a | 2.0 |\n<!-- numdev:end t -->\noutro\n"
    assert read_block(doc, "t") == "| a | 2.0 |"
    with pytest.raises(ValueError, match="README.md: block 'missing' needs exactly one"):
        replace_block(doc, "missing", "x")


# --- the phase-1 house rules: ranges below 5 seeds, about-10x band, trends, by construction -------


def test_fewer_than_five_seeds_give_a_labelled_range_not_an_interval():
    from numdev.stats.intervals import MIN_BOOTSTRAP, ratio_spread, replicate_spread

    three = replicate_spread([1.0, 2.0, 4.0])
    assert (three.method, three.low, three.high, three.n) == ("range", 1.0, 4.0, 3)
    assert "range of 3: 1, 4" in three.text() and three.spread_name == "range over 3 seeds"
    # A ratio of means lies within the range of the per-seed ratios, which is what is shown.
    a, b = [2.0, 3.0, 9.0], [1.0, 2.0, 3.0]
    ratio = ratio_spread(a, b)
    assert ratio.value == pytest.approx(14 / 6) and (ratio.low, ratio.high) == (1.5, 3.0)
    five = replicate_spread(np.arange(MIN_BOOTSTRAP, dtype=float))
    assert five.method == "bootstrap" and five.text().count("range") == 0
    assert five.as_dict() == mean_interval(np.arange(MIN_BOOTSTRAP, dtype=float)).as_dict()
    assert not replicate_spread([1.0, 2.0]).has_interval  # two seeds: shown, never judged


@pytest.mark.parametrize("values, status", [
    ([9.0, 9.5, 10.0, 10.5, 11.0], HOLDS),
    ([6.2, 6.4, 6.6, 6.8, 6.9], PARTLY),  # more than 1x but below the band: the number is given
    ([15.0, 16.0, 16.9, 17.5, 18.0], PARTLY),  # above the band
    ([0.4, 0.45, 0.5, 0.55, 0.6], FAILS),  # Flash not worse: contradicts the claim
    ([0.8, 0.9, 1.0, 1.1, 1.3], NOT_MEASURABLE),  # contains 1
])
def test_about_10x_holds_only_within_its_band(values, status):
    from numdev.stats.intervals import ratio_spread
    from numdev.stats.verdicts import ABOUT_10X, about_verdict

    verdict = about_verdict(ratio_spread(values, [1.0] * len(values)), ABOUT_10X, what="r")
    assert verdict.status == status, verdict.text()
    assert ABOUT_10X == (7.0, 14.0) and "[7, 14]" in verdict.rule


def _curves(exponent, seeds=(0, 1, 2, 3, 4), noise=0.0, x=(256, 512, 1024, 2048)):
    rng = np.random.default_rng(1)
    return {s: {n: (n / 256) ** exponent * math.exp(noise * rng.standard_normal()) for n in x} for s in seeds}


@pytest.mark.parametrize("exponent, noise, status", [
    (0.5, 0.05, HOLDS),
    (-0.5, 0.05, FAILS),  # significant the other way
    (0.0, 0.0, FAILS),  # flat at every seed (one bf16 ulp at every N): counts against growth
    (0.0, 0.3, NOT_MEASURABLE),  # noise, no trend either way
])
def test_trend_verdict_can_hold_fail_and_abstain(exponent, noise, status):
    from numdev.stats.verdicts import trend_verdict

    verdict = trend_verdict([256, 512, 1024, 2048], _curves(exponent, noise=noise), "increasing", what="d")
    assert verdict.status == status, verdict.text()


def test_trend_verdict_is_a_t_test_on_per_seed_slopes():
    """The p-value is scipy's one-sample t-test on the seeds' OLS log-log slopes: one number per
    seed, so the serially dependent points of one curve never count as independent evidence."""
    from scipy import stats as scipy_stats

    from numdev.stats.verdicts import seed_slopes, trend_verdict

    curves = _curves(0.3, noise=0.2)
    slopes = seed_slopes([256, 512, 1024, 2048], curves)
    x = np.log([256, 512, 1024, 2048])
    for s, by_x in curves.items():
        y = np.log([by_x[n] for n in (256, 512, 1024, 2048)])
        assert slopes[s] == pytest.approx(np.cov(x, y)[0, 1] / np.var(x, ddof=1))
    p = scipy_stats.ttest_1samp(list(slopes.values()), 0.0, alternative="greater").pvalue
    assert f"p = {p:.2g} (df 4)" in trend_verdict([256, 512, 1024, 2048], curves, "increasing").detail
    # More points per seed do not make the evidence stronger by themselves: 5 seeds, df 4, always.
    dense = _curves(0.3, noise=0.2, x=tuple(256 * 2**i for i in range(12)))
    assert "(df 4)" in trend_verdict(sorted(dense[0]), dense, "increasing").detail
    # Two seeds: no test.
    assert trend_verdict([1, 2, 4], {0: {1: 1, 2: 2, 4: 4}, 1: {1: 1, 2: 2, 4: 4}}, "increasing").status == NOT_MEASURABLE


def test_a_claim_true_by_construction_is_never_green():
    from numdev.stats.verdicts import BY_CONSTRUCTION, SYMBOLS, by_construction

    built = by_construction("B_r has no numeric effect", "bit-identical")
    held = Verdict(HOLDS, "r")
    assert built.symbol == SYMBOLS[BY_CONSTRUCTION] and built.symbol not in (SYMBOLS[HOLDS], SYMBOLS[FAILS])
    assert combine({"a": held, "b": built}).status == PARTLY
    assert combine({"b": built}).status == BY_CONSTRUCTION
    assert combine({"a": Verdict(FAILS, "r"), "b": built}).status == FAILS


def test_study_figures_name_their_bands_by_the_house_rule():
    """A band over fewer than 5 replicates is their range (numdev.stats.intervals.mean_interval), and the title says so."""
    from numdev.stats.intervals import mean_spread_words as spread_words

    assert spread_words(3) == "range of the 3 replicates"
    assert spread_words(5) == "95% bootstrap interval of the mean"
    assert spread_words(1).startswith("no interval")
    assert mean_interval([1.0, 2.0, 4.0]).method == "range"


# --- the house rule: a range from fewer than 5 replicates carries no verdict ----------------------


@pytest.mark.parametrize("n", [3, 4])
def test_a_ratio_range_or_about_claim_from_3_or_4_replicates_is_not_measurable_with_its_range_shown(n):
    """The same per-seed numbers hold (or fail) from 5 seeds; from 3 or 4 their spread is a range,
    shown as such, and no verdict rests on it."""
    from numdev.stats.intervals import ratio_spread
    from numdev.stats.verdicts import ABOUT_10X, RANGE_NO_VERDICT, about_verdict

    cases = [  # (per-seed ratios, the verdict, its status from 5 seeds)
        ([10.0, 11.0, 9.5, 10.2, 10.6], lambda e: ratio_verdict(e, "above"), HOLDS),
        ([10.0, 11.0, 9.5, 10.2, 10.6], lambda e: ratio_verdict(e, "below"), FAILS),
        ([3.0, 3.2, 2.9, 3.1, 3.05], lambda e: range_verdict(e, 2, 5), HOLDS),
        ([1.0, 1.2, 0.9, 1.1, 1.05], lambda e: range_verdict(e, 2, 5), FAILS),
        ([9.0, 9.5, 10.0, 10.5, 11.0], lambda e: about_verdict(e, ABOUT_10X), HOLDS),
        ([6.2, 6.4, 6.6, 6.8, 6.9], lambda e: about_verdict(e, ABOUT_10X), PARTLY),
        ([0.4, 0.45, 0.5, 0.55, 0.6], lambda e: about_verdict(e, ABOUT_10X), FAILS),
    ]
    for values, judge, five in cases:
        assert judge(ratio_spread(values, [1.0] * 5)).status == five
        few = ratio_spread(values[:n], [1.0] * n)
        verdict = judge(few)
        assert verdict.status == NOT_MEASURABLE and verdict.symbol == "–", verdict.text()
        assert f"[range of {n}: {few.low:.3g}, {few.high:.3g}]" in verdict.detail and RANGE_NO_VERDICT in verdict.detail


@pytest.mark.parametrize("n", [3, 4])
def test_a_trend_from_3_or_4_seeds_is_not_measurable_with_the_slopes_range_shown(n):
    """Every path of trend_verdict that gives a symbol from 5 seeds (a t-test, every seed the same slope,
    every slope flat or the other way) gives none from 3 or 4."""
    from numdev.stats.verdicts import RANGE_NO_VERDICT, trend_verdict

    x = [256, 512, 1024, 2048]
    for exponent, noise, five in ((0.5, 0.05, HOLDS), (0.5, 0.0, HOLDS), (0.0, 0.0, FAILS), (-0.5, 0.05, FAILS)):
        assert trend_verdict(x, _curves(exponent, noise=noise), "increasing").status == five
        verdict = trend_verdict(x, _curves(exponent, seeds=range(n), noise=noise), "increasing")
        assert verdict.status == NOT_MEASURABLE, verdict.text()
        assert f"[range of {n}: " in verdict.detail and RANGE_NO_VERDICT in verdict.detail


@pytest.mark.parametrize("n", [3, 4])
def test_only_grows_from_3_or_4_seeds_is_not_measurable_even_when_no_curve_reverses(n):
    """monotone_verdict's per-seed rule 'every seed's curve never reverses' gave 'holds' from 3 seeds."""
    from numdev.stats.verdicts import RANGE_NO_VERDICT

    x = [1, 2, 3, 4, 5]
    rising = {seed: [v * (1 + 0.01 * seed) for v in (1.0, 2.0, 3.0, 5.0, 8.0)] for seed in range(5)}
    assert monotone_verdict(x, rising, "increasing").status == HOLDS
    assert monotone_verdict(x, rising, "decreasing").status == FAILS
    few = {seed: rising[seed] for seed in range(n)}
    for direction, against in (("increasing", 0), ("decreasing", 4 * n)):
        verdict = monotone_verdict(x, few, direction)
        assert verdict.status == NOT_MEASURABLE, verdict.text()
        assert f"tau +1.00 [range of {n}: +1.00, +1.00]; {against} of {4 * n} steps" in verdict.detail
        assert RANGE_NO_VERDICT in verdict.detail


def test_a_stored_verdict_is_rejudged_by_the_range_it_quotes():
    """Verdicts stored before the house rule (docs/results): a holds/fails/partly that quotes a range
    of fewer than 5 replicates becomes not measurable, its numbers kept; anything else stays."""
    from numdev.stats.verdicts import (
        BY_CONSTRUCTION,
        RANGE_NO_VERDICT,
        by_construction,
        from_text,
        parts_of,
        rejudge,
    )

    old = Verdict(HOLDS, "r", "the ratio 11 [range of 3: 9.89, 12.2]")
    assert rejudge(old) == Verdict(NOT_MEASURABLE, "r", f"the ratio 11 [range of 3: 9.89, 12.2]: {RANGE_NO_VERDICT}")
    trend = Verdict(FAILS, "t", "log-log slope +0 [range of 4: +0, +0]; 0 of 4 seeds' slopes increasing; flat: every seed's slope is 0")
    assert rejudge(trend).status == NOT_MEASURABLE and rejudge(trend).detail.startswith(trend.detail)
    for kept in (Verdict(HOLDS, "r", "the ratio 11 [10.4, 11.7]"),  # a 95% interval
                 Verdict(HOLDS, "t", "log-log slope +0.634 [range of 5: +0.609, +0.664]; t-test p = 4e-07 (df 4)"),
                 Verdict(HOLDS, "b", "bit-identical share min 1 over 3 record(s)"),  # an exact check: no spread
                 Verdict(NOT_MEASURABLE, "r", "the ratio 1.5 [range of 3: 0.9, 2] contains 1"),
                 by_construction("b", "0 at every seed")):
        assert rejudge(kept) == kept
    parts = {"a": old, "b": Verdict(HOLDS, "b", "bit-identical share min 1 over 3 record(s)"),
             "(b) fp16": by_construction("c", "as built"), "c: d": Verdict(FAILS, "r", "x 0.5 [range of 3: 0.4, 0.6]")}
    combined = combine(parts)
    assert combined.status == PARTLY and parts_of(combined.detail) == {k: Verdict(v.status, "", v.detail) for k, v in parts.items()}
    again = rejudge(combined)
    # The exact check still holds and the others carry no verdict: partly, never green; the rule and order kept.
    assert again.status == PARTLY and again.rule == combined.rule
    assert again.detail == combine({k: rejudge(v) for k, v in parts.items()}).detail
    assert rejudge(combine({"a": old, "c": parts["c: d"]})).status == NOT_MEASURABLE
    assert rejudge(combine({"a": old, "c": parts["(b) fp16"]})).status == NOT_MEASURABLE
    assert rejudge(again) == again and combine({"x": by_construction("c", "y")}).status == BY_CONSTRUCTION
    assert from_text(combined.status, combined.text(), "rule") == Verdict(combined.status, "rule", combined.detail)
    with pytest.raises(ValueError, match="not the text of a verdict"):
        from_text(HOLDS, combined.text())
