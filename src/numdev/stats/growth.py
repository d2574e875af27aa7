"""How fast a distance curve grows over training, and ratios between curves.

The paper compares growth rates of the weight-distance curves without giving a formula. Ours,
stated once here (GROWTH_MEASURE) and copied into every summary.json:
"""

from __future__ import annotations

import math

import numpy as np

GROWTH_MEASURE = (
    "growth rate = ordinary least-squares slope of the distance against the training step, with an intercept, "
    "over every snapshot step including 0, fitted per replicate; a ratio of growth rates = mean slope of one "
    "role / mean slope of the other over the same replicates (paired bootstrap). Beside it, the distance at the "
    "final step. The slope, not the final distance, carries the verdicts because one proxy (another "
    "initialisation) starts apart and is judged by how fast it moves, while the controls and Flash start at "
    "(or one ulp from) zero, where the slope and the final distance tell the same story."
)
__doc__ += "\n" + GROWTH_MEASURE + "\n"


def fit_growth(steps, values) -> dict:
    """Least-squares line through (step, value): slope, intercept, R², increase, points."""
    x = np.asarray(steps, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    if x.size != y.size:
        raise ValueError(f"{x.size} steps but {y.size} values")
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError(f"a growth rate needs values at two or more distinct steps, got steps {list(x)}")
    if not np.isfinite(y).all():
        raise ValueError("the distance curve has NaN/Inf values")
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (slope * x + intercept)
    total = ((y - y.mean()) ** 2).sum()
    r2 = 1.0 - (residual**2).sum() / total if total > 0 else 1.0
    return {
        "slope": float(slope),
        "intercept": float(intercept),
        "r2": float(r2),
        "increase": float(y[-1] - y[0]),
        "points": int(x.size),
    }


def slope_ratio(numerator: dict, denominator: dict) -> float:
    """numerator slope / denominator slope of one replicate (inf when the denominator does not grow)."""
    if denominator["slope"] <= 0:
        return math.inf if numerator["slope"] > 0 else math.nan
    return numerator["slope"] / denominator["slope"]
