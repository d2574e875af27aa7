"""numdev.stats (bootstrap intervals over seeds), numdev.verdicts (stated rules) and numdev.provenance."""

import math
import subprocess

import numpy as np
import pytest

from numdev.provenance import machine_line, provenance
from numdev.stats import mean_interval, ratio_interval, statistic_interval
from numdev.verdicts import (
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
    above = ratio_interval([10.0, 11.0, 9.5, 10.2], [1.0, 1.1, 0.9, 1.0])
    assert ratio_verdict(above, "above").status == HOLDS
    assert ratio_verdict(above, "below").status == FAILS
    straddling = ratio_interval([0.8, 1.3, 0.9, 1.2], [1.0, 1.0, 1.0, 1.0])
    assert ratio_verdict(straddling, "above").status == NOT_MEASURABLE
    single = ratio_interval([10.0], [1.0])
    assert ratio_verdict(single, "above").status == NOT_MEASURABLE


def test_range_verdict_for_a_paper_range():
    inside = ratio_interval([3.0, 3.2, 2.9, 3.1], [1.0] * 4)
    assert range_verdict(inside, 2, 5).status == HOLDS
    below = ratio_interval([1.0, 1.2, 0.9, 1.1], [1.0] * 4)
    assert range_verdict(below, 2, 5).status == FAILS
    straddle = ratio_interval([1.5, 2.5, 1.8, 2.6], [1.0] * 4)
    assert range_verdict(straddle, 2, 5).status == NOT_MEASURABLE


def test_monotone_verdict_on_synthetic_trends():
    rng = np.random.default_rng(2)
    x = [256, 512, 1024, 2048, 4096]
    rising = [np.exp(0.5 * i) + rng.normal(0, 0.05, 3) for i in range(5)]
    assert monotone_verdict(x, rising, "increasing").status == HOLDS
    assert monotone_verdict(x, rising, "decreasing").status == FAILS
    flat = [rng.normal(1.0, 0.5, 3) for _ in range(5)]
    assert monotone_verdict(x, flat, "increasing").status == NOT_MEASURABLE
    assert monotone_verdict(x[:2], rising[:2], "increasing").status == NOT_MEASURABLE
    # a 'holds' with a reversal in the seed-means says so
    bumpy = [np.full(3, v) + rng.normal(0, 1e-3, 3) for v in (1, 2, 1.5, 3, 4, 5)]
    verdict = monotone_verdict(list(range(6)), bumpy, "increasing")
    assert verdict.status == HOLDS and "1 of 5 steps" in verdict.detail


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
    from numdev.docblocks import read_block, replace_block

    doc = tmp_path / "README.md"
    doc.write_text("intro\n<!-- numdev:begin t -->\nold 1.0\n<!-- numdev:end t -->\noutro\n")
    replace_block(doc, "t", "| a | 2.0 |")
    assert doc.read_text() == "intro\n<!-- numdev:begin t -->\n| a | 2.0 |\n<!-- numdev:end t -->\noutro\n"
    assert read_block(doc, "t") == "| a | 2.0 |"
    with pytest.raises(ValueError, match="README.md: needs exactly one"):
        replace_block(doc, "missing", "x")
