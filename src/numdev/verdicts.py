"""Verdicts: whether a paper's claim holds on our numbers, decided by a stated rule.

A verdict is never a judgement call in a caption. Each rule below takes the figure's data (per-seed
values) and returns a Verdict whose `rule` says in one sentence how it was decided. A claim with
several parts is judged part by part and combined by `combine`: it holds only if every part holds;
green never stands on half a claim.

Statuses:
    holds            the data support the claim by the rule
    fails            the data contradict it by the rule
    partly           some parts hold and some fail (combine only)
    not measurable   the rule cannot decide: one seed, no interval, non-finite values, a flat curve
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as scipy_stats

from numdev.stats import Estimate

HOLDS, FAILS, PARTLY, NOT_MEASURABLE = "holds", "fails", "partly", "not measurable"
STATUSES = (HOLDS, FAILS, PARTLY, NOT_MEASURABLE)
SYMBOLS = {HOLDS: "✓", FAILS: "✗", PARTLY: "◐", NOT_MEASURABLE: "–"}

# A monotone trend is judged by Kendall's tau between x and the per-seed values (every seed's point
# counts, so seed-to-seed spread weakens the evidence), one-sided in the claimed direction.
MONOTONE_ALPHA = 0.05


@dataclass(frozen=True)
class Verdict:
    status: str
    rule: str
    detail: str = ""

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"verdict status {self.status!r} is not one of {STATUSES}")

    @property
    def symbol(self) -> str:
        return SYMBOLS[self.status]

    def as_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        return f"{self.symbol} {self.status}" + (f": {self.detail}" if self.detail else "")


def ratio_verdict(estimate: Estimate, claim: str, threshold: float = 1.0, what: str = "the ratio") -> Verdict:
    """Claim 'above' or 'below' `threshold`, judged on the interval, never on the point value alone.

    holds: the whole interval is on the claimed side; fails: the whole interval is on the other
    side; not measurable: no interval (one seed), or the interval contains the threshold.
    """
    if claim not in ("above", "below"):
        raise ValueError(f"claim must be 'above' or 'below', got {claim!r}")
    rule = f"{what}'s 95% interval over seeds lies wholly {claim} {threshold:g}"
    if not np.isfinite(estimate.value) or not estimate.has_interval:
        return Verdict(NOT_MEASURABLE, rule, f"{what} = {estimate.value:.3g} from {estimate.n} seed(s): no interval")
    interval = f"{what} {estimate.text()}"
    above, below = estimate.low > threshold, estimate.high < threshold
    if (claim == "above" and above) or (claim == "below" and below):
        return Verdict(HOLDS, rule, interval)
    if (claim == "above" and below) or (claim == "below" and above):
        return Verdict(FAILS, rule, interval)
    return Verdict(NOT_MEASURABLE, rule, f"{interval} contains {threshold:g}")


def range_verdict(estimate: Estimate, low: float, high: float, what: str = "the ratio") -> Verdict:
    """Claim 'between low and high' (e.g. the paper's 2-5x): holds if the interval overlaps [low, high]
    and lies within it, fails if it lies wholly outside, else not measurable."""
    rule = f"{what}'s 95% interval over seeds lies within [{low:g}, {high:g}]"
    if not np.isfinite(estimate.value) or not estimate.has_interval:
        return Verdict(NOT_MEASURABLE, rule, f"{what} = {estimate.value:.3g} from {estimate.n} seed(s): no interval")
    interval = f"{what} {estimate.text()}"
    if estimate.low >= low and estimate.high <= high:
        return Verdict(HOLDS, rule, interval)
    if estimate.high < low or estimate.low > high:
        return Verdict(FAILS, rule, interval)
    return Verdict(NOT_MEASURABLE, rule, f"{interval} straddles [{low:g}, {high:g}]")


def monotone_verdict(x, values_by_x, direction: str, what: str = "the deviation") -> Verdict:
    """Claim: values rise ('increasing') or fall ('decreasing') with x.

    `values_by_x[i]` holds the per-seed values at x[i]. Rule: Kendall's tau between x and every
    per-seed value, one-sided test in the claimed direction at alpha 0.05 (holds), or significant
    the other way (fails); otherwise not measurable (no trend the test can see). The detail also
    counts the steps between consecutive seed-means that go against the claim, so a
    'holds' with reversals says so.
    """
    if direction not in ("increasing", "decreasing"):
        raise ValueError(f"direction must be 'increasing' or 'decreasing', got {direction!r}")
    rule = f"Kendall's tau of {what} against x over every seed's point, one-sided p < {MONOTONE_ALPHA} ({direction})"
    xs, ys = [], []
    for xi, values in zip(x, values_by_x):
        for v in np.atleast_1d(np.asarray(values, dtype=np.float64)):
            xs.append(float(xi))
            ys.append(float(v))
    if len(set(xs)) < 3 or not np.isfinite(ys).all():
        return Verdict(NOT_MEASURABLE, rule, "fewer than 3 x values, or non-finite values")
    if len(set(ys)) == 1:  # Kendall's tau is undefined on a flat curve
        return Verdict(NOT_MEASURABLE, rule, f"every value equals {ys[0]:.3g}: a flat curve has no trend")
    sign = 1 if direction == "increasing" else -1
    tau, _ = scipy_stats.kendalltau(xs, ys)
    alternative = "greater" if sign > 0 else "less"
    p_claim = scipy_stats.kendalltau(xs, ys, alternative=alternative).pvalue
    p_other = scipy_stats.kendalltau(xs, ys, alternative="less" if sign > 0 else "greater").pvalue
    means = [float(np.mean(v)) for v in values_by_x]
    reversals = sum(1 for a, b in zip(means, means[1:]) if sign * (b - a) < 0)
    detail = f"tau = {tau:+.2f} (p = {p_claim:.2g}); {reversals} of {len(means) - 1} steps of the seed-mean go against it"
    if p_claim < MONOTONE_ALPHA:
        return Verdict(HOLDS, rule, detail)
    if p_other < MONOTONE_ALPHA:
        return Verdict(FAILS, rule, detail)
    return Verdict(NOT_MEASURABLE, rule, detail)


def combine(parts: dict[str, Verdict]) -> Verdict:
    """A claim of several parts: holds only if every part holds; fails if none holds and one fails."""
    if not parts:
        raise ValueError("combine needs at least one part")
    statuses = [v.status for v in parts.values()]
    detail = "; ".join(f"{name}: {v.text()}" for name, v in parts.items())
    rule = "every part must hold: " + "; ".join(f"{name}: {v.rule}" for name, v in parts.items())
    if all(s == HOLDS for s in statuses):
        status = HOLDS
    elif HOLDS in statuses:
        status = PARTLY  # some parts hold, others fail or cannot be judged: never green
    elif FAILS in statuses:
        status = FAILS  # no part holds and at least one is contradicted
    else:
        status = NOT_MEASURABLE
    return Verdict(status, rule, detail)
