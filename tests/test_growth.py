import math

import numpy as np
import pytest

from numdev.stats.growth import fit_growth, slope_ratio


def test_fit_recovers_known_slopes_and_ratios():
    steps = np.arange(0, 1001, 100)
    rng = np.random.default_rng(0)
    flash = fit_growth(steps, 2e-6 * steps + rng.normal(0, 1e-6, steps.size))
    low_precision = fit_growth(steps, 7e-6 * steps + rng.normal(0, 1e-6, steps.size))
    init = fit_growth(steps, 0.01 + 3e-6 * steps)  # starts apart: judged by its slope only
    assert flash["slope"] == pytest.approx(2e-6, rel=0.05)
    assert slope_ratio(low_precision, flash) == pytest.approx(3.5, rel=0.1)
    assert slope_ratio(init, flash) == pytest.approx(1.5, rel=0.1)
    assert init["intercept"] == pytest.approx(0.01) and init["r2"] == pytest.approx(1.0)
    assert init["increase"] == pytest.approx(3e-3)


def test_flat_denominator_and_bad_curves():
    steps = [0, 10, 20]
    assert slope_ratio(fit_growth(steps, [0, 1, 2]), fit_growth(steps, [0, 0, 0])) == math.inf
    with pytest.raises(ValueError, match="two or more distinct steps"):
        fit_growth([5], [1.0])
    with pytest.raises(ValueError, match="NaN"):
        fit_growth(steps, [0, float("nan"), 1])
