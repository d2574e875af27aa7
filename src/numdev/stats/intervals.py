"""Intervals over seeds: every number numdev reports as a finding comes with one.

A finding is a statistic of per-seed values (a mean over seeds, or a ratio of two means over the
same seeds). Its 95% interval is a percentile bootstrap over seeds (`scipy.stats.bootstrap`,
seeded, so a report is reproducible). Paired values (Flash and Baseline measured on the same
seed's inputs) are resampled together, so the interval of a ratio keeps their correlation.

With fewer than MIN_SEEDS seeds there is no interval: a bootstrap over two values has three
distinct resamples and its "95%" interval is little more than their range. The interval is then
(nan, nan) — null in JSON — shown as "n/a", and no verdict may rest on it (see numdev.stats.verdicts).

The phase-1 figures follow a stricter house rule (`replicate_spread`, `ratio_spread`): from fewer
than MIN_BOOTSTRAP replicates the spread is the *range* over replicates (the smallest and largest
per-seed value; for a ratio of means, the per-seed ratios, between which it always lies), labelled
"range of n", never a "95%" interval; from MIN_BOOTSTRAP or more, the 95% percentile bootstrap.
An Estimate says which (`method`: "bootstrap" or "range").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as scipy_stats

CONFIDENCE = 0.95
RESAMPLES = 2000
METHOD = "percentile"
MIN_SEEDS = 3
MIN_BOOTSTRAP = 5  # house rule: fewer replicates give a range over them, labelled "range of n"
# Intervals on log ratios (the early-phase measures): Student t over replicates of the per-replicate
# log values, back-transformed (a geometric mean with its interval). With fewer than MIN_CI
# replicates no interval is claimed: [low, high] is then the range (min..max) of the n values and
# says so ("range of n"): a t or bootstrap "95%" from 3-4 values does not cover what it says.
MIN_CI = MIN_BOOTSTRAP  # the same house rule as the bootstrap's
T, RANGE = "t", "range"
LOG_RULE = (
    f"{int(CONFIDENCE * 100)}% Student t interval over replicates of the per-replicate log values, back-transformed "
    f"(scipy.stats.t); from fewer than {MIN_CI} replicates the range of the n values, labelled 'range of n'"
)
RULE = f"{int(CONFIDENCE * 100)}% percentile bootstrap over seeds ({RESAMPLES} resamples, scipy.stats.bootstrap)"


@dataclass(frozen=True)
class Estimate:
    """A statistic over seeds with its bootstrap interval; n is the number of seeds."""

    value: float
    low: float
    high: float
    n: int
    method: str = "bootstrap"  # "bootstrap" (percentile), "t" (Student t on logs), "range" (min..max of n < 5)

    def __post_init__(self):  # null (JSON) and nan both mean "no interval"
        for name in ("value", "low", "high"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, math.nan)

    @property
    def has_interval(self) -> bool:
        return self.n >= MIN_SEEDS and math.isfinite(self.low) and math.isfinite(self.high)

    def excludes(self, x: float) -> bool:
        """The interval lies wholly above or wholly below x."""
        return self.has_interval and (self.low > x or self.high < x)

    def as_dict(self) -> dict:
        """JSON-ready: nan (no interval, or an undefined value) becomes null."""
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}

    def text(self, fmt: str = ".3g", unit: str = "") -> str:
        """'2.7x [2.4, 3.1]' (a 95% interval), '2.7x [range of 3: 2.4, 3.1]', or 'n/a' in its place."""
        if not self.has_interval:
            return f"{self.value:{fmt}}{unit} [n/a: {self.n} seed(s)]"
        label = f"range of {self.n}: " if self.method == "range" else ""
        return f"{self.value:{fmt}}{unit} [{label}{self.low:{fmt}}, {self.high:{fmt}}]"

    @property
    def spread_name(self) -> str:
        return f"range over {self.n} seeds" if self.method == "range" else "95% interval over seeds"


def mean_spread_words(replicates: int) -> str:
    """What `mean_interval` gives over `replicates` replicates, in words for a figure's title."""
    if replicates >= MIN_BOOTSTRAP:
        return f"{int(CONFIDENCE * 100)}% bootstrap interval of the mean"
    return f"range of the {replicates} replicates" if replicates > 1 else "no interval (one replicate)"


def _finite(values) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).ravel()
    if array.size == 0:
        raise ValueError("no values to estimate from")
    if not np.isfinite(array).all():
        raise ValueError(f"non-finite values among {array.size} per-seed values: an interval needs finite numbers")
    return array


def _interval(data: tuple, statistic, seed: int, vectorized: bool) -> tuple[float, float]:
    n = len(data[0])
    if n < MIN_SEEDS:
        return math.nan, math.nan
    if all(np.ptp(d) == 0 for d in data):  # every seed equal: the bootstrap distribution is a point
        value = float(statistic(*data, axis=-1) if vectorized else statistic(*data))
        return value, value
    result = scipy_stats.bootstrap(
        data, statistic, paired=len(data) > 1, vectorized=vectorized, n_resamples=RESAMPLES,
        confidence_level=CONFIDENCE, method=METHOD, random_state=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def _range(value: float, per_seed: np.ndarray) -> Estimate:
    """Below MIN_BOOTSTRAP seeds: the range over the per-seed values, labelled "range of n" (none below MIN_SEEDS)."""
    ok = per_seed.size >= MIN_SEEDS and np.isfinite(per_seed).all()
    low, high = (float(per_seed.min()), float(per_seed.max())) if ok else (math.nan, math.nan)
    return Estimate(value, low, high, int(per_seed.size), method="range")


def mean_interval(values, seed: int = 0) -> Estimate:
    """Mean over seeds with its spread by the house rule: the 95% percentile bootstrap from
    MIN_BOOTSTRAP seeds, else the range over seeds (method "range": a bootstrap of 3 values is
    their range, and calling it 95% would overstate it)."""
    x = _finite(values)
    if x.size < MIN_BOOTSTRAP:
        return _range(float(x.mean()), x)
    low, high = _interval((x,), np.mean, seed, vectorized=True)
    return Estimate(float(x.mean()), low, high, int(x.size))


def ratio_interval(numerators, denominators, seed: int = 0) -> Estimate:
    """mean(numerators) / mean(denominators), paired by seed, with its spread by the house rule: the
    paired 95% bootstrap from MIN_BOOTSTRAP seeds, else the range of the per-seed ratios (the ratio
    of means, a weighted mean of them, lies within it).

    The ratio of means (not the mean of per-seed ratios) is what a figure of two means shows,
    and it is defined when single seeds' denominators come near zero.
    """
    a, b = _finite(numerators), _finite(denominators)
    if a.size != b.size:
        raise ValueError(f"a paired ratio needs as many numerators as denominators, got {a.size} and {b.size}")

    def ratio(x, y, axis=-1):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.mean(x, axis=axis) / np.mean(y, axis=axis)

    value = float(ratio(a, b))
    if a.size < MIN_BOOTSTRAP:
        with np.errstate(divide="ignore", invalid="ignore"):
            return _range(value, a / b)
    low, high = _interval((a, b), ratio, seed, vectorized=True)
    return Estimate(value, low, high, int(a.size))


def statistic_interval(values, statistic, seed: int = 0) -> Estimate:
    """Any statistic of per-seed values (e.g. a median) with its bootstrap interval (from
    MIN_BOOTSTRAP seeds; else the range of the values)."""
    x = _finite(values)
    if x.size < MIN_BOOTSTRAP:
        return _range(float(statistic(x)), x)
    low, high = _interval((x,), statistic, seed, vectorized=False)
    return Estimate(float(statistic(x)), low, high, int(x.size))


# The house rule's names where a caller wants to say it (one implementation: the functions above).
replicate_spread = mean_interval
ratio_spread = ratio_interval


def log_mean_interval(values, confidence: float = CONFIDENCE) -> Estimate:
    """exp(mean(log values)) over replicates with its t interval (a range below MIN_CI replicates).

    For positive per-replicate quantities whose spread is multiplicative (distances, ratios of
    distances, equivalent sizes): the interval is on the log scale, where replicates scatter
    symmetrically, then exponentiated. Rule: LOG_RULE.
    """
    x = _finite(values)
    if (x <= 0).any():
        raise ValueError(f"log_mean_interval needs positive values, got {x.min():.3g}")
    logs = np.log(x)
    centre = float(np.exp(logs.mean()))
    if x.size < MIN_SEEDS:
        return Estimate(centre, math.nan, math.nan, int(x.size), T)
    if x.size < MIN_CI:
        return Estimate(centre, float(x.min()), float(x.max()), int(x.size), RANGE)
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2, x.size - 1) * logs.std(ddof=1) / math.sqrt(x.size))
    return Estimate(centre, float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half)), int(x.size), T)


def log_ratio_interval(numerators, denominators, confidence: float = CONFIDENCE) -> Estimate:
    """Paired ratio numerator/denominator per replicate, summarised by log_mean_interval."""
    a, b = _finite(numerators), _finite(denominators)
    if a.size != b.size:
        raise ValueError(f"a paired ratio needs as many numerators as denominators, got {a.size} and {b.size}")
    if (a <= 0).any() or (b <= 0).any():
        raise ValueError("a log ratio needs positive values on both sides")
    return log_mean_interval(a / b, confidence)
