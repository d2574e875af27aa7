"""Equivalence, harm and power: what a downstream difference between sibling runs may be said to be.

A role's effect on an outcome (held-out loss, caption agreement, ...) is judged on per-replicate
differences to a yardstick, against a margin stated before the data are seen:

- "no more than a seed" is an **equivalence** claim: two one-sided t-tests (TOST) at alpha = 0.05
  that the mean difference is above -margin and below +margin; equivalent when both reject, that is
  when the 90% (1 - 2 alpha) t interval lies inside (-margin, +margin). Failing to find a
  difference is not equivalence: a wide interval is "not measurable", whatever its centre;
- "harms" is a one-sided t-test at alpha = 0.05 that the mean difference **exceeds** the margin
  (differences oriented so that positive is harm: a loss increase, an agreement decrease negated);
  it holds when the lower bound of the same 90% interval (the one-sided 95% bound) is above the margin;
- beside each verdict, the **minimum detectable effect** (MDE): the smallest true mean difference
  the design (its n and the observed sd) detects with power 0.8 by a two-sided t-test at alpha =
  0.05 (noncentral t), and the smallest margin the TOST would declare equivalent with power 0.8
  when the true difference is 0 (the equivalence MDE). A "not measurable" beside an MDE larger than
  the margin says the study was too small to tell, not that there is nothing;
- the interval reported with the mean is the 95% t interval (`interval`); the 90% one
  (`tost_interval`) is the one the tests read. Each says which it is.

Two designs: `paired_effect` on per-replicate differences d_r = outcome(role, r) -
outcome(reference, r) (the shared reference run of the same replicate), and `unpaired_effect`, the
role's outcomes against those of independent seeds (Welch's t interval; the seeds' own spread is
the yardstick). House rule (numdev.stats.intervals.MIN_CI): with fewer than 5 replicates there is
no interval and no verdict: the range of the n values, labelled "range of n", and "not measurable:
n < 5".

The rules' texts (EQUIVALENCE_RULE, HARM_RULE, MDE_RULE, INTERVAL_RULE, PAIRED_RULE, UNPAIRED_RULE) are copied
into every summary that uses them.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
from scipy import integrate, optimize, special
from scipy import stats as scipy_stats

from numdev.stats.intervals import CONFIDENCE, MIN_CI, RANGE, Estimate, T, _finite
from numdev.stats.verdicts import FAILS, HOLDS, NOT_MEASURABLE, SYMBOLS, Verdict

ALPHA = round(1 - CONFIDENCE, 10)  # each one-sided test's level, and the two-sided test's
POWER = 0.8  # the power an MDE is stated at
PAIRED, UNPAIRED = "paired", "unpaired (Welch)"

_pct = f"{int(round((1 - 2 * ALPHA) * 100))}%"
_ci = f"{int(round(CONFIDENCE * 100))}%"
EQUIVALENCE_RULE = (
    f"no more than a seed (equivalence, TOST): two one-sided t-tests at alpha = {ALPHA:g} of the mean difference "
    f"against -margin and +margin, the margin stated in advance; holds when both reject, i.e. the {_pct} t interval "
    f"(1 - 2 alpha) lies inside (-margin, +margin); fails when that interval lies wholly outside [-margin, +margin]; "
    f"otherwise not measurable (the design could not tell: see the equivalence MDE); from fewer than {MIN_CI} "
    f"replicates not measurable (n < {MIN_CI}), the range of the n values shown instead"
)
HARM_RULE = (
    f"harms (exceeds the margin): one-sided t-test at alpha = {ALPHA:g} that the mean difference, oriented so that "
    f"positive is harm, exceeds the margin stated in advance; holds when the lower bound of the {_pct} t interval "
    f"(the one-sided {_ci} bound) lies above the margin; fails when its upper bound lies below the margin (the "
    f"effect is shown smaller than the margin); otherwise not measurable; from fewer than {MIN_CI} replicates not "
    f"measurable (n < {MIN_CI})"
)
MDE_RULE = (
    f"minimum detectable effect: the smallest true mean difference a two-sided t-test at alpha = {ALPHA:g} detects "
    f"with power {POWER:g}, from the observed sd and n (noncentral t, scipy.stats.nct: MDE = lambda * se, lambda "
    f"solving the power equation with the test's degrees of freedom); equivalence MDE: the smallest margin the TOST "
    f"declares equivalent with power {POWER:g} when the true difference is 0 (exact: the t interval's half-width "
    f"integrated over the chi-square distribution of the sd)"
)
INTERVAL_RULE = (
    f"{_ci} Student t interval of the mean difference (reported); the {_pct} t interval (1 - 2 alpha) is the one "
    f"the TOST and the one-sided harm test read; from fewer than {MIN_CI} replicates no interval: the range of "
    f"the n values, labelled 'range of n'"
)
PAIRED_RULE = "paired: d_r = outcome(role, r) - outcome(reference, r) over replicates r; one-sample t on the d_r (df n - 1)"
UNPAIRED_RULE = (
    "unpaired: the role's outcomes against the outcomes of independent seeds; Welch's t interval of the difference "
    "of means (Welch-Satterthwaite degrees of freedom); the range below the house rule's n is each role value minus "
    "the seeds' mean"
)


# -- power and minimum detectable effects --------------------------------------------------------------
def power_two_sided(effect: float, se: float, df: float, alpha: float = ALPHA) -> float:
    """Power of the two-sided t-test at level alpha when the true mean difference is `effect`
    (the estimate's standard error `se`, `df` degrees of freedom): noncentral t."""
    if se <= 0:
        return 1.0 if effect != 0 else alpha
    critical = scipy_stats.t.ppf(1 - alpha / 2, df)
    nc = effect / se
    # P(T > c) + P(T < -c), the second as sf(c; df, -nc): scipy's nct.cdf far in the tail can return nan
    return float(min(1.0, _tail(critical, df, nc) + _tail(critical, df, -nc)))


def _tail(critical: float, df: float, nc: float) -> float:
    """P(T > critical) for T ~ noncentral t(df, nc); a vanishing tail scipy cannot evaluate is 0."""
    value = float(scipy_stats.nct.sf(critical, df, nc))
    return value if math.isfinite(value) else 0.0


def power_exceeds(true_mean: float, margin: float, se: float, df: float, alpha: float = ALPHA) -> float:
    """Power of the one-sided test 'the mean difference exceeds margin' when the true mean is `true_mean`."""
    if se <= 0:
        return 1.0 if true_mean > margin else 0.0
    return _tail(float(scipy_stats.t.ppf(1 - alpha, df)), df, (true_mean - margin) / se)


def power_tost(margin: float, se: float, df: float, true_difference: float = 0.0, alpha: float = ALPHA) -> float:
    """Probability that the TOST declares equivalence within +-margin when the true mean difference
    is `true_difference`: exact for normal data, P(|mean - 0| + t se_hat < margin) integrated over
    se_hat = se * sqrt(V / df), V ~ chi-square(df)."""
    if se <= 0:
        return 1.0 if abs(true_difference) < margin else 0.0
    critical = scipy_stats.t.ppf(1 - alpha, df)
    upper = (margin - true_difference) / se
    lower = (-margin - true_difference) / se
    reach = df * (margin / (se * critical)) ** 2  # beyond this V the interval is wider than the margins

    def integrand(u: float) -> float:  # over the quantiles u of V: smooth for any df
        half = critical * math.sqrt(special.gammaincinv(df / 2, u) * 2 / df)  # chi2(df).ppf(u) / df, fast
        return max(0.0, special.ndtr(upper - half) - special.ndtr(lower + half))

    value, _ = integrate.quad(integrand, 0.0, float(special.gammainc(df / 2, reach / 2)), limit=200, epsabs=1e-10, epsrel=1e-9)
    return float(min(1.0, max(0.0, value)))


def _solve(power_of, target: float) -> float:
    """The smallest x > 0 with power_of(x) = target (power_of increasing), by bracketing and brentq."""
    high = 1.0
    while power_of(high) < target:
        high *= 2.0
        if high > 1e6:
            return math.inf
    return float(optimize.brentq(lambda x: power_of(x) - target, 0.0, high, xtol=1e-12, rtol=1e-12))


@functools.lru_cache(maxsize=512)
def mde_factor(df: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """The noncentrality lambda at which the two-sided t-test has `power`: MDE = lambda * se."""
    return _solve(lambda nc: power_two_sided(nc, 1.0, df, alpha), power)


@functools.lru_cache(maxsize=512)
def equivalence_factor(df: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """The margin, in units of se, at which the TOST has `power` when the true difference is 0."""
    return _solve(lambda m: power_tost(m, 1.0, df, 0.0, alpha), power)


def mde(se: float, df: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true mean difference the two-sided t-test detects with `power` (MDE_RULE)."""
    return float(se * mde_factor(float(df), alpha, power)) if se > 0 else 0.0


def mde_equivalence(se: float, df: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest margin the TOST declares equivalence within with `power` when the true difference is 0."""
    return float(se * equivalence_factor(float(df), alpha, power)) if se > 0 else 0.0


# -- the effect ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Effect:
    """A role's mean difference to its yardstick, with its intervals, tests and design.

    interval: the 95% t interval (method "t") reported with the mean, or from fewer than MIN_CI
    replicates the range of the n values (method "range", shown "range of n"); tost_interval: the
    90% t interval the tests read (None below MIN_CI). equivalent / exceeds: the tests' outcomes
    (None below MIN_CI); equivalence / harm: the verdicts with their rules. mde / mde_equivalence:
    the design's minimum detectable effects (None when the sd is not defined: one replicate).
    """

    design: str  # PAIRED or UNPAIRED
    n: int  # replicates (paired: differences; unpaired: the smaller group)
    mean: float  # mean difference, role minus yardstick
    sd: float | None  # sd of the paired differences (unpaired: see `groups`)
    se: float | None  # standard error of the mean difference
    df: float | None  # the t distribution's degrees of freedom
    margin: float
    interval: Estimate
    tost_interval: Estimate | None
    equivalent: bool | None
    exceeds: bool | None
    equivalence: Verdict
    harm: Verdict
    alpha: float = ALPHA
    groups: dict = field(default_factory=dict)  # unpaired: {"role": {"n", "mean", "sd"}, "seeds": {...}}

    @property
    def measurable(self) -> bool:
        return self.tost_interval is not None

    @functools.cached_property
    def mde(self) -> float | None:
        """The smallest true mean difference the two-sided t-test detects with power POWER (MDE_RULE);
        None when the sd is not defined (one replicate). Computed when first asked for."""
        return mde(self.se, self.df, self.alpha) if self._design_known else None

    @functools.cached_property
    def mde_equivalence(self) -> float | None:
        """The smallest margin the TOST declares equivalent with power POWER at a true difference of 0."""
        return mde_equivalence(self.se, self.df, self.alpha) if self._design_known else None

    @property
    def _design_known(self) -> bool:
        return self.se is not None and self.df is not None and math.isfinite(self.se) and self.df > 0

    def as_dict(self) -> dict:
        """JSON-ready (nan -> null), the rules beside the numbers."""

        def clean(value):
            return None if isinstance(value, float) and not math.isfinite(value) else value

        return {
            "design": self.design, "n": self.n, "mean": clean(self.mean), "sd": clean(self.sd), "se": clean(self.se),
            "df": clean(self.df), "margin": self.margin, "alpha": self.alpha,
            "interval": {**self.interval.as_dict(), "confidence": None if self.interval.method == RANGE else CONFIDENCE},
            "tost_interval": None if self.tost_interval is None else {**self.tost_interval.as_dict(), "confidence": round(1 - 2 * self.alpha, 12)},
            "equivalent": self.equivalent, "exceeds": self.exceeds,
            "mde": clean(self.mde), "mde_equivalence": clean(self.mde_equivalence), "power": POWER,
            "equivalence": self.equivalence.as_dict(), "harm": self.harm.as_dict(),
            "groups": self.groups,
            "rules": {"interval": INTERVAL_RULE, "design": PAIRED_RULE if self.design == PAIRED else UNPAIRED_RULE,
                      "mde": MDE_RULE},
        }

    def text(self, fmt: str = ".3g") -> str:
        """'Δ +0.0012 [95% t: -0.0011, +0.0035]; 90% t [...]; no more than a seed (±0.005): ✓ holds; harms
        (> 0.005): ✗ fails; MDE 0.004, equivalence MDE 0.005 (n = 10)', or below MIN_CI
        'Δ +0.0012 [range of 3: ...]; – not measurable: n < 5; MDE ... (n = 3)'."""
        signed = fmt if fmt.startswith("+") else "+" + fmt
        design = "" if self.mde is None else f"; MDE {self.mde:{fmt}}, equivalence MDE {self.mde_equivalence:{fmt}}"
        if self.tost_interval is None:
            return (f"Δ {self.mean:{signed}} {_range_text(self.interval, signed)}; {SYMBOLS[NOT_MEASURABLE]} "
                    f"{NOT_MEASURABLE}: n < {MIN_CI}{design} (n = {self.n})")
        tost = self.tost_interval
        return (f"Δ {self.mean:{signed}} [{_ci} t: {self.interval.low:{signed}}, {self.interval.high:{signed}}]; "
                f"{int(round((1 - 2 * self.alpha) * 100))}% t [{tost.low:{signed}}, {tost.high:{signed}}]; "
                f"no more than a seed (±{self.margin:{fmt}}): {self.equivalence.symbol} {self.equivalence.status}; "
                f"harms (> {self.margin:{fmt}}): {self.harm.symbol} {self.harm.status}{design} (n = {self.n})")


def _check_margin(margin) -> float:
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin <= 0:
        raise ValueError(f"margin={margin!r} must be a positive finite number, stated before the data are seen")
    return float(margin)


def _check_confidence(confidence) -> float:
    if not 0.5 < confidence < 1:
        raise ValueError(f"confidence={confidence!r} must lie in (0.5, 1)")
    return float(confidence)


def _t_interval(mean: float, se: float, df: float, level: float) -> tuple[float, float]:
    half = float(scipy_stats.t.ppf(0.5 + level / 2, df) * se) if se > 0 else 0.0
    return mean - half, mean + half


def _effect(design: str, n: int, mean: float, sd, se, df, margin: float, alpha: float, spread: Estimate,
            measurable: bool, groups: dict | None = None) -> Effect:
    if not measurable:
        why = f"n < {MIN_CI}: Δ {mean:+.3g} {_range_text(spread, '+.3g')}"
        return Effect(design, n, mean, sd, se, df, margin, spread, None, None, None,
                      Verdict(NOT_MEASURABLE, EQUIVALENCE_RULE, why), Verdict(NOT_MEASURABLE, HARM_RULE, why),
                      alpha, groups or {})
    low95, high95 = _t_interval(mean, se, df, 1 - alpha)
    low90, high90 = _t_interval(mean, se, df, 1 - 2 * alpha)
    interval = Estimate(mean, low95, high95, n, T)
    tost = Estimate(mean, low90, high90, n, T)
    equivalent = bool(-margin < low90 and high90 < margin)
    exceeds = bool(low90 > margin)
    shown = f"Δ {mean:+.3g}, {int(round((1 - 2 * alpha) * 100))}% t [{low90:+.3g}, {high90:+.3g}] (n = {n})"
    if equivalent:
        equivalence = Verdict(HOLDS, EQUIVALENCE_RULE, f"{shown} inside ±{margin:.3g}")
    elif low90 > margin or high90 < -margin:
        equivalence = Verdict(FAILS, EQUIVALENCE_RULE, f"{shown} wholly outside ±{margin:.3g}")
    else:
        equivalence = Verdict(NOT_MEASURABLE, EQUIVALENCE_RULE, f"{shown} not inside ±{margin:.3g}")
    if exceeds:
        harm = Verdict(HOLDS, HARM_RULE, f"{shown}: lower bound above {margin:.3g}")
    elif high90 < margin:
        harm = Verdict(FAILS, HARM_RULE, f"{shown}: upper bound below {margin:.3g}")
    else:
        harm = Verdict(NOT_MEASURABLE, HARM_RULE, f"{shown} contains {margin:.3g}")
    return Effect(design, n, mean, sd, se, df, margin, interval, tost, equivalent, exceeds, equivalence, harm,
                  alpha, groups or {})


def _range_text(spread: Estimate, fmt: str) -> str:
    """'[range of 3: -0.002, +0.0008]' (never called an interval), or '[n/a: 1 replicate]'."""
    if not math.isfinite(spread.low):
        return f"[n/a: {spread.n} replicate(s)]"
    return f"[range of {spread.n}: {spread.low:{fmt}}, {spread.high:{fmt}}]"


def _range(mean: float, values: np.ndarray) -> Estimate:
    """The house rule's spread below MIN_CI: min..max of the values (none below 2 of them)."""
    if values.size < 2:
        return Estimate(mean, math.nan, math.nan, int(values.size), RANGE)
    return Estimate(mean, float(values.min()), float(values.max()), int(values.size), RANGE)


def paired_effect(differences, margin: float, confidence: float = CONFIDENCE) -> Effect:
    """Per-replicate paired differences d_r = outcome(role, r) - outcome(reference, r) against a margin.

    mean, sd, n; the 95% t interval (`interval`, reported) and the 90% one the TOST and the
    one-sided harm test read (`tost_interval`); `equivalent` (EQUIVALENCE_RULE), `exceeds`
    (HARM_RULE; differences oriented so that positive is harm), `mde` and `mde_equivalence`
    (MDE_RULE). alpha = 1 - confidence. Below MIN_CI replicates: the range, no interval, no verdict.
    """
    margin, confidence = _check_margin(margin), _check_confidence(confidence)
    d = _finite(differences)
    n = int(d.size)
    mean = float(d.mean())
    sd = float(d.std(ddof=1)) if n >= 2 else None
    se = sd / math.sqrt(n) if sd is not None else None
    df = n - 1 if n >= 2 else None
    return _effect(PAIRED, n, mean, sd, se, df, margin, round(1 - confidence, 12), _range(mean, d), n >= MIN_CI)


def unpaired_effect(role_values, seed_values, margin: float, confidence: float = CONFIDENCE) -> Effect:
    """The role's outcomes against those of independent seeds (UNPAIRED_RULE): mean(role) - mean(seeds)
    with Welch's t interval, the same tests and design numbers as paired_effect. Measurable when both
    groups have MIN_CI values; n is the smaller group's size."""
    margin, confidence = _check_margin(margin), _check_confidence(confidence)
    x, y = _finite(role_values), _finite(seed_values)
    n = int(min(x.size, y.size))
    mean = float(x.mean() - y.mean())
    groups = {name: {"n": int(v.size), "mean": float(v.mean()), "sd": float(v.std(ddof=1)) if v.size >= 2 else None}
              for name, v in (("role", x), ("seeds", y))}
    se = df = None
    if x.size >= 2 and y.size >= 2:
        vx, vy = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
        se = float(math.sqrt(vx + vy))
        denominator = vx**2 / (x.size - 1) + vy**2 / (y.size - 1)
        df = float((vx + vy) ** 2 / denominator) if denominator > 0 else float(x.size + y.size - 2)
    spread = _range(mean, x - y.mean())
    return _effect(UNPAIRED, n, mean, None, se, df, margin, round(1 - confidence, 12), spread, n >= MIN_CI, groups)


# -- the sign test: the same three questions, distribution-free ------------------------------------------
SIGN, T_TEST = "sign", "t"
TESTS = (SIGN, T_TEST)  # study.harm.test: which test a pre-registered claim is judged by
SIGN_RULE = (
    f"exact sign test (binomial, p = 1/2) on the paired differences, each one-sided at alpha = {ALPHA:g}: harms holds "
    f"when so many replicates exceed +margin that 'median <= +margin' is rejected, fails when so many lie below it that "
    f"'median >= +margin' is; no more than a seed holds when both 'median >= +margin' and 'median <= -margin' are "
    f"rejected (two one-sided sign tests), fails when the median is shown outside; a difference equal to the bound "
    f"counts on neither side. Distribution-free: one diverged run or a two-valued outcome cannot hide an effect that "
    f"the replicates show, nor make one. It needs k of n replicates on one side (at n = 5: all five; "
    f"sign_needed); from fewer than {MIN_CI} replicates not measurable"
)
SIGN_DESIGN = "sign test on the paired differences: counts of replicates above, inside and below the bounds; p-values exact (scipy.stats.binomtest)"


def _sign_p(successes: int, n: int) -> float:
    """P(at least `successes` of n fair coin flips): the exact one-sided sign test's p-value."""
    return float(scipy_stats.binomtest(successes, n, 0.5, alternative="greater").pvalue) if n else 1.0


def sign_needed(n: int, alpha: float = ALPHA) -> int | None:
    """The fewest of n replicates that must lie on one side of a bound for the one-sided sign test to reject."""
    return next((k for k in range(n + 1) if _sign_p(k, n) < alpha), None)


@dataclass(frozen=True)
class SignTest:
    """The sign test's verdicts on paired differences against a margin (SIGN_RULE): `harm` (exceeds +margin),
    `equivalence` (inside +-margin) and `positive` (exceeds 0: a role's effect above another's)."""

    n: int
    margin: float
    counts: dict  # {"above": d > +margin, "inside": -margin < d < +margin, "below": d < -margin, "positive": d > 0, "negative": d < 0}
    p: dict  # one-sided p-values that the median lies on that side: {"above_upper", "below_upper", "above_lower", "below_lower", "positive", "negative"}
    needed: int | None
    harm: Verdict
    equivalence: Verdict
    positive: Verdict
    alpha: float = ALPHA

    def as_dict(self) -> dict:
        return {"test": SIGN, "n": self.n, "margin": self.margin, "alpha": self.alpha, "counts": self.counts, "p": self.p,
                "needed": self.needed, "harm": self.harm.as_dict(), "equivalence": self.equivalence.as_dict(),
                "positive": self.positive.as_dict(), "rules": {"test": SIGN_RULE, "design": SIGN_DESIGN}}

    def text(self) -> str:
        """'sign test: 5 of 5 above +0.03 (p 0.031), 0 below -0.03; harms ✓ holds; no more than a seed ✗ fails (n = 5)'."""
        c = self.counts
        return (f"sign test: {c['above']} of {self.n} above +{self.margin:.3g} (p {self.p['above_upper']:.2g}), {c['inside']} inside, "
                f"{c['below']} below -{self.margin:.3g}; harms: {self.harm.symbol} {self.harm.status}; no more than a seed: "
                f"{self.equivalence.symbol} {self.equivalence.status} (n = {self.n}, needs {self.needed} on one side)")


def sign_effect(differences, margin: float, confidence: float = CONFIDENCE) -> SignTest:
    """SIGN_RULE on per-replicate paired differences (positive is harm) against a margin stated in advance."""
    margin, confidence = _check_margin(margin), _check_confidence(confidence)
    alpha = round(1 - confidence, 12)
    d = _finite(differences)
    n = int(d.size)
    counts = {"above": int((d > margin).sum()), "inside": int(((d > -margin) & (d < margin)).sum()),
              "below": int((d < -margin).sum()), "positive": int((d > 0).sum()), "negative": int((d < 0).sum())}
    p = {"above_upper": _sign_p(counts["above"], n), "below_upper": _sign_p(int((d < margin).sum()), n),
         "above_lower": _sign_p(int((d > -margin).sum()), n), "below_lower": _sign_p(counts["below"], n),
         "positive": _sign_p(counts["positive"], n), "negative": _sign_p(counts["negative"], n)}
    shown = f"{counts['above']} above +{margin:.3g}, {counts['inside']} inside, {counts['below']} below -{margin:.3g} (n = {n})"
    if n < MIN_CI:
        why = f"n < {MIN_CI}: {shown}"
        off = Verdict(NOT_MEASURABLE, SIGN_RULE, why)
        return SignTest(n, margin, counts, p, sign_needed(n, alpha), off, off, off, alpha)

    def verdict(holds_p: float, fails_p: float, what: str) -> Verdict:
        if holds_p < alpha:
            return Verdict(HOLDS, SIGN_RULE, f"{shown}: {what} (p {holds_p:.2g})")
        if fails_p < alpha:
            return Verdict(FAILS, SIGN_RULE, f"{shown}: shown not to (p {fails_p:.2g})")
        return Verdict(NOT_MEASURABLE, SIGN_RULE, f"{shown}: neither side reaches alpha {alpha:g}")

    harm = verdict(p["above_upper"], p["below_upper"], f"median above +{margin:.3g}")
    outside = min(p["above_upper"], p["below_lower"])  # the median shown above +margin or below -margin
    equivalence = verdict(max(p["below_upper"], p["above_lower"]), outside, f"median inside ±{margin:.3g}")
    positive = verdict(p["positive"], p["negative"], "median above 0")
    return SignTest(n, margin, counts, p, sign_needed(n, alpha), harm, equivalence, positive, alpha)
