"""Verdicts: whether a paper's claim holds on our numbers, decided by a stated rule.

A verdict is never a judgement call in a caption. Each rule below takes the figure's data (per-seed
values) and returns a Verdict whose `rule` says in one sentence how it was decided. A claim with
several parts is judged part by part and combined by `combine`: it holds only if every part holds;
green never stands on half a claim.

Statuses:
    holds            the data support the claim by the rule
    fails            the data contradict it by the rule
    partly           some parts hold and some fail (combine only); or a claim of a size ("about
                     10x") whose direction holds but whose size lies outside the stated band
    not measurable   the rule cannot decide: one seed, no interval, non-finite values; or fewer
                     than MIN_CI (5) replicates: their spread is a range, labelled "range of n",
                     and a range carries no verdict (RANGE_NO_VERDICT: the house rule, here only)
    by construction  true by how the instrument is built, not by a measurement (e.g. Fig. 6b: B_r
                     has no numeric effect in the emulator); shown with its own neutral symbol and
                     never counted as support: a claim with such a part is at most "partly"
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as scipy_stats

from numdev.stats.intervals import MIN_CI, RANGE, Estimate

HOLDS, FAILS, PARTLY, NOT_MEASURABLE = "holds", "fails", "partly", "not measurable"
BY_CONSTRUCTION = "by construction"
STATUSES = (HOLDS, FAILS, PARTLY, NOT_MEASURABLE, BY_CONSTRUCTION)
RANGE_NO_VERDICT = f"a range from fewer than {MIN_CI} replicates carries no verdict"
SYMBOLS = {HOLDS: "✓", FAILS: "✗", PARTLY: "◐", NOT_MEASURABLE: "–", BY_CONSTRUCTION: "□"}
MEANINGS = {  # what each symbol says, for a reader (the report's legend)
    HOLDS: "the claim holds here: the measured interval lies where the claim (the paper's, or a role's stated before the runs) says",
    FAILS: "the claim does not hold here: the interval lies on the other side",
    PARTLY: "some parts of the claim hold and others do not, or it holds in direction but not in size",
    NOT_MEASURABLE: "the data cannot decide: the interval crosses the line, or too few replicates",
    BY_CONSTRUCTION: "true by how the emulator is built (a check of the code, not a finding)",
}
JUDGED = (HOLDS, FAILS, PARTLY)  # the statuses a range from fewer than MIN_CI replicates may not give
# How a verdict's detail quotes the spread it rests on when that is a range: "[range of n: low, high]"
# (Estimate.text for a ratio, a mean, ...; the per-seed slopes of trend_verdict, the taus of monotone_verdict).
RANGE_LABEL = re.compile(r"\[range of (\d+): ")

# A monotone trend is judged by Kendall's tau between x and the per-seed values (every seed's point
# counts, so seed-to-seed spread weakens the evidence), one-sided in the claimed direction. Used by
# the study (Fig. 7); the phase-1 figures use trend_verdict, whose test's assumptions hold.
MONOTONE_ALPHA = 0.05
# trend_verdict: one-sided one-sample t-test on the per-seed slopes.
TREND_ALPHA = 0.05
SLOPE_ZERO = 1e-9  # a fitted log-slope this small is a flat curve's rounding noise (a doubling of x moves y by 1e-9 relative)
# "About 10x": the ratio's interval (or range over seeds) lies within this band.
ABOUT_10X = (7.0, 14.0)


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


def judgeable(estimate: Estimate) -> bool:
    """Whether a verdict (or a sentence that reads like one: "below 1", "told apart") may rest on the
    estimate: a finite value with a 95% interval, not a range from fewer than MIN_CI replicates."""
    return bool(np.isfinite(estimate.value)) and estimate.has_interval and estimate.method != RANGE


def ratio_verdict(estimate: Estimate, claim: str, threshold: float = 1.0, what: str = "the ratio") -> Verdict:
    """Claim 'above' or 'below' `threshold`, judged on the interval, never on the point value alone.

    holds: the whole interval is on the claimed side; fails: the whole interval is on the other
    side; not measurable: no interval (one seed), or the interval contains the threshold.
    """
    if claim not in ("above", "below"):
        raise ValueError(f"claim must be 'above' or 'below', got {claim!r}")
    rule = f"{what}'s {estimate.spread_name} lies wholly {claim} {threshold:g}"
    if not np.isfinite(estimate.value) or not estimate.has_interval:
        return Verdict(NOT_MEASURABLE, rule, f"{what} = {estimate.value:.3g} from {estimate.n} seed(s): no interval")
    if estimate.method == RANGE:
        return Verdict(NOT_MEASURABLE, rule, f"{what} {estimate.text()}: {RANGE_NO_VERDICT}")
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
    rule = f"{what}'s {estimate.spread_name} lies within [{low:g}, {high:g}]"
    if not np.isfinite(estimate.value) or not estimate.has_interval:
        return Verdict(NOT_MEASURABLE, rule, f"{what} = {estimate.value:.3g} from {estimate.n} seed(s): no interval")
    if estimate.method == RANGE:
        return Verdict(NOT_MEASURABLE, rule, f"{what} {estimate.text()}: {RANGE_NO_VERDICT}")
    interval = f"{what} {estimate.text()}"
    if estimate.low >= low and estimate.high <= high:
        return Verdict(HOLDS, rule, interval)
    if estimate.high < low or estimate.low > high:
        return Verdict(FAILS, rule, interval)
    return Verdict(NOT_MEASURABLE, rule, f"{interval} straddles [{low:g}, {high:g}]")


def monotone_verdict(x, values_by_seed: dict, direction: str, what: str = "the deviation") -> Verdict:
    """Claim: values only rise ('increasing') or only fall ('decreasing') as x grows.

    `values_by_seed[seed]` holds one seed's values, aligned with x. Rule: one Kendall's tau per seed
    between x and that seed's curve (how consistently it moves one way: +1 when it never reverses),
    then a one-sample t-test of the taus over seeds, one-sided in the claimed direction. The points
    of one seed's curve are serially dependent (a cumulative drift), so a test over them would not
    hold its size; the seeds are independent replicates, so their taus are (as in `trend_verdict`).
    holds: p < 0.05, or every seed's curve never reverses; fails: every tau at or below 0, or the
    t-test significant the other way; not measurable otherwise, with fewer than 3 distinct x values,
    when every curve is flat (tau undefined), and from fewer than MIN_CI (5) seeds: their taus are
    then shown as a range (RANGE_NO_VERDICT), even when every curve never reverses. The detail counts
    the steps of the seeds' curves that go against the claim, so a 'holds' with reversals says so. On
    driftless random walks (tests/test_stats_verdicts.py) it said 'holds' 5.7% of the time with 5
    seeds (the taus are not normal), where a test over the pooled points said so 30%.
    """
    if direction not in ("increasing", "decreasing"):
        raise ValueError(f"direction must be 'increasing' or 'decreasing', got {direction!r}")
    rule = (f"per-seed Kendall's tau of {what} against x; one-sample t-test of the taus over seeds, one-sided "
            f"p < {MONOTONE_ALPHA} ({direction}): holds; every tau at or below 0, or significant the other way: fails")
    sign = 1 if direction == "increasing" else -1
    x = np.asarray(x, dtype=np.float64)
    enough_x = len(np.unique(x)) >= 3
    order = np.argsort(x, kind="stable")
    taus, reversals, steps = [], 0, 0
    for values in values_by_seed.values():
        ys = np.asarray(values, dtype=np.float64)
        if len(ys) != len(x):
            return Verdict(NOT_MEASURABLE, rule, f"a seed's curve has {len(ys)} values for {len(x)} x values")
        if not enough_x:
            continue
        if not np.isfinite(ys).all():
            return Verdict(NOT_MEASURABLE, rule, "a non-finite value")
        reversals += int((sign * np.diff(ys[order]) < 0).sum())
        steps += len(ys) - 1
        if np.ptp(ys) > 0:  # Kendall's tau is undefined on a flat curve
            taus.append(float(scipy_stats.kendalltau(x, ys).statistic))
    if not enough_x:
        return Verdict(NOT_MEASURABLE, rule, f"{len(np.unique(x))} distinct x value(s): a trend needs 3")
    if len(values_by_seed) < 3:
        return Verdict(NOT_MEASURABLE, rule, f"{len(values_by_seed)} seed(s): a verdict over seeds needs {MIN_CI}")
    if not taus:
        return Verdict(NOT_MEASURABLE, rule, "every seed's curve is flat: a flat curve has no trend")
    values = np.asarray(taus)
    summary = (f"tau {values.mean():+.2f} [range of {len(values)}: {values.min():+.2f}, {values.max():+.2f}]; "
               f"{reversals} of {steps} steps of the seeds' curves go against it")
    if len(values_by_seed) < MIN_CI:
        return Verdict(NOT_MEASURABLE, rule, f"{summary}: {RANGE_NO_VERDICT}")
    if len(values) < 3:
        return Verdict(NOT_MEASURABLE, rule, f"{summary}; {len(values)} seed(s) not flat: a t-test needs 3")
    if (sign * values <= 0).all():
        return Verdict(FAILS, rule, f"{summary}; no seed's curve goes the claimed way")
    if reversals == 0 or np.ptp(values) == 0:  # every seed the same tau: t is infinite
        return Verdict(HOLDS if (sign * values > 0).all() else FAILS, rule,
                       f"{summary}; every seed's curve {'never reverses' if reversals == 0 else 'the same tau'}")
    return _t_test_over_seeds(values, sign, rule, summary, MONOTONE_ALPHA)


def about_verdict(estimate: Estimate, band: tuple[float, float] = ABOUT_10X, floor: float = 1.0,
                  what: str = "the ratio") -> Verdict:
    """Claim 'about 10x' (a factor within `band`, and above `floor`: Flash deviates more).

    holds: the interval (or range over seeds) lies within the band; partly: it lies wholly above
    `floor` but not within the band (the direction holds, the size does not: the number says by how
    much); fails: it lies wholly at or below `floor`; not measurable: no interval, or it contains
    `floor`.
    """
    low, high = band
    rule = (f"{what}'s {estimate.spread_name} within [{low:g}, {high:g}]: holds; wholly above {floor:g} but not "
            f"within the band: partly; wholly at or below {floor:g}: fails")
    if not np.isfinite(estimate.value) or not estimate.has_interval:
        return Verdict(NOT_MEASURABLE, rule, f"{what} = {estimate.value:.3g} from {estimate.n} seed(s): no interval")
    if estimate.method == RANGE:
        return Verdict(NOT_MEASURABLE, rule, f"{what} {estimate.text()}: {RANGE_NO_VERDICT}")
    interval = f"{what} {estimate.text()}"
    if estimate.low >= low and estimate.high <= high:
        return Verdict(HOLDS, rule, interval)
    if estimate.low > floor:
        side = "below" if estimate.high < low else "above" if estimate.low > high else "across"
        return Verdict(PARTLY, rule, f"{interval}: more than {floor:g}x, but {side} the band [{low:g}, {high:g}]")
    if estimate.high <= floor:
        return Verdict(FAILS, rule, interval)
    return Verdict(NOT_MEASURABLE, rule, f"{interval} contains {floor:g}")


def seed_slopes(x, values_by_seed: dict, log_x: bool = True) -> dict:
    """{seed: OLS slope of log(value) on log(x) (or on x)} for every seed with >= 3 distinct x values.

    x: the x values, or {key: x value} when curves are keyed by something else (formats with the
    same mantissa bits share an x)."""
    position = dict(x) if isinstance(x, dict) else {xi: xi for xi in x}
    slopes = {}
    for seed, by_x in values_by_seed.items():
        keys = [key for key in position if key in by_x]
        xs = np.asarray([position[key] for key in keys], dtype=np.float64)
        ys = np.asarray([by_x[key] for key in keys], dtype=np.float64)
        if len(set(xs)) < 3:
            continue
        if (ys <= 0).any() or not np.isfinite(ys).all():
            slopes[seed] = float("nan")
            continue
        slopes[seed] = float(np.polyfit(np.log(xs) if log_x else xs, np.log(ys), 1)[0])
    return slopes


def trend_verdict(x, values_by_seed: dict, direction: str, what: str = "the deviation", log_x: bool = True,
                  unit: str = "unit of x") -> Verdict:
    """Claim: values rise ('increasing') or fall ('decreasing') with x.

    `values_by_seed[seed][x]` holds one seed's curve. Rule: one slope per seed, the OLS slope of
    log(value) on log(x) (on x itself with log_x=False); then a one-sample t-test of the slopes
    against 0, one-sided in the claimed direction. Its assumptions hold: the seeds draw independent
    inputs, so their slopes are independent replicates (the points within one seed's curve share
    its inputs and are not, which is why they are reduced to one slope first), and a slope, a
    weighted sum of many log-deviations, is close to normal. holds: p < 0.05; fails: every seed's
    slope is zero or goes the other way (a flat curve counts against a trend), or the t-test is
    significant the other way; otherwise not measurable. From fewer than MIN_CI (5) seeds the slopes
    are shown as their range and no verdict is given (RANGE_NO_VERDICT), whatever they say.
    """
    if direction not in ("increasing", "decreasing"):
        raise ValueError(f"direction must be 'increasing' or 'decreasing', got {direction!r}")
    axis = "log x" if log_x else "x"
    rule = (f"per-seed OLS slope of log({what}) on {axis}; one-sample t-test of the slopes over seeds, one-sided "
            f"p < {TREND_ALPHA} ({direction}): holds; every slope zero or the other way (flat counts against), "
            "or significant the other way: fails")
    slopes = seed_slopes(x if isinstance(x, dict) else list(x), values_by_seed, log_x)
    values = np.asarray(list(slopes.values()), dtype=np.float64)
    if len(values) < 3:
        return Verdict(NOT_MEASURABLE, rule, f"{len(values)} seed(s) with 3 or more x values: a verdict over seeds needs {MIN_CI}")
    if not np.isfinite(values).all():
        return Verdict(NOT_MEASURABLE, rule, "a value at or below 0 (or non-finite): no log-slope")
    values = np.where(np.abs(values) < SLOPE_ZERO, 0.0, values)  # a flat curve's fit leaves float noise
    sign = 1 if direction == "increasing" else -1
    spread = f"range of {len(values)}"  # the slopes themselves, smallest to largest: never an interval
    with_claim = int((sign * values > 0).sum())
    summary = (f"{'log-log slope' if log_x else 'slope of log per ' + unit} {values.mean():+.3g} [{spread}: {values.min():+.3g}, "
               f"{values.max():+.3g}]; {with_claim} of {len(values)} seeds' slopes {direction}")
    if len(values) < MIN_CI:
        return Verdict(NOT_MEASURABLE, rule, f"{summary}: {RANGE_NO_VERDICT}")
    if with_claim == 0:
        flat = "flat: every seed's slope is 0" if (values == 0).all() else "no seed's slope goes the claimed way"
        return Verdict(FAILS, rule, f"{summary}; {flat}")
    if np.ptp(values) <= SLOPE_ZERO * np.abs(values).max():  # every seed the same slope: t is infinite
        return Verdict(HOLDS, rule, f"{summary}; every seed the same slope")
    return _t_test_over_seeds(values, sign, rule, summary, TREND_ALPHA)


def _t_test_over_seeds(values: np.ndarray, sign: int, rule: str, summary: str, alpha: float) -> Verdict:
    """One-sample t-test of one statistic per seed against 0, one-sided in the claimed direction
    (sign +1: greater): holds below alpha, fails when significant the other way, else not measurable."""
    result = scipy_stats.ttest_1samp(values, 0.0, alternative="greater" if sign > 0 else "less")
    other = scipy_stats.ttest_1samp(values, 0.0, alternative="less" if sign > 0 else "greater")
    detail = f"{summary}; t-test p = {result.pvalue:.2g} (df {len(values) - 1})"
    if len(values) < MIN_CI:
        return Verdict(NOT_MEASURABLE, rule, f"{detail}: {len(values)} replicates: a test from fewer than {MIN_CI} carries no verdict")
    if result.pvalue < alpha:
        return Verdict(HOLDS, rule, detail)
    if other.pvalue < alpha:
        return Verdict(FAILS, rule, detail)
    return Verdict(NOT_MEASURABLE, rule, detail)


def by_construction(rule: str, why: str) -> Verdict:
    """A claim the instrument makes true by how it is built: shown as such, never as support."""
    return Verdict(BY_CONSTRUCTION, rule, why)


def as_check(verdict: Verdict, why: str) -> Verdict:
    """A claim the instrument makes true by how it is built (a rounding-only emulator's error must fall
    with mantissa bits), measured anyway as a check of the code: when the data agree it is "by
    construction" (neutral, never support for the paper's claim); when they contradict it, it fails (a
    bug, not a finding); an undecided check stays undecided."""
    if verdict.status != HOLDS:
        return verdict
    return Verdict(BY_CONSTRUCTION, f"a check of the code, not a finding ({why}); measured by: {verdict.rule}", verdict.detail)


def combine(parts: dict[str, Verdict]) -> Verdict:
    """A claim of several parts: holds only if every part holds; fails if none holds and one fails.

    A part true by construction is no evidence: with tested parts that all hold the claim is
    "partly"; alone, the claim is "by construction"."""
    if not parts:
        raise ValueError("combine needs at least one part")
    detail = "; ".join(f"{name}: {v.text()}" for name, v in parts.items())
    rule = "every part must hold: " + "; ".join(f"{name}: {v.rule}" for name, v in parts.items())
    return Verdict(combined_status([v.status for v in parts.values()]), rule, detail)


def combined_status(statuses: list[str]) -> str:
    """combine's status of a claim whose parts have these statuses."""
    if all(s == BY_CONSTRUCTION for s in statuses):
        return BY_CONSTRUCTION
    if all(s == HOLDS for s in statuses):
        return HOLDS
    if HOLDS in statuses or PARTLY in statuses:
        return PARTLY  # some parts hold, others fail, cannot be judged or hold by construction: never green
    if FAILS in statuses:
        return FAILS  # no part holds and at least one is contradicted
    return NOT_MEASURABLE


# combine's detail, read back: "name: <symbol> <status>[: detail]; name: ..." (a name holds no ';').
_PART = re.compile("(?:^|; )(?P<name>[^;]+?): (?P<symbol>[" + "".join(SYMBOLS.values()) + "]) (?P<status>"
                   + "|".join(STATUSES) + ")(?=: |; |$)")


def parts_of(detail: str) -> dict[str, Verdict] | None:
    """The parts of a combined verdict read back from its detail (as `combine` wrote it; their rules
    are not in it), or None when the detail is not one."""
    found = list(_PART.finditer(detail))
    if not found or found[0].start() != 0:
        return None
    parts = {}
    for match, after in zip(found, [*found[1:], None]):
        text = detail[match.start("symbol"):after.start() if after else len(detail)]
        status = match["status"]
        if SYMBOLS[status] != match["symbol"] or match["name"] in parts:
            return None
        parts[match["name"]] = Verdict(status, "", text[len(f"{match['symbol']} {status}: "):] if text != f"{match['symbol']} {status}" else "")
    if "; ".join(f"{name}: {v.text()}" for name, v in parts.items()) != detail:
        return None
    return parts


def rejudge(verdict: Verdict) -> Verdict:
    """A stored verdict, made before the house rule reached it, under the rule: one that says holds,
    fails or partly while its detail quotes a range from fewer than MIN_CI replicates ("[range of n:
    ...", RANGE_LABEL) becomes not measurable, its numbers kept and RANGE_NO_VERDICT said. A
    combined verdict is re-judged part by part (parts_of) and its status recombined (combined_status),
    its rule and the parts' order kept. Exact checks (bit identity), verdicts "by construction" and
    verdicts on 95% intervals quote no such range and stay as they are.

    For results whose per-replicate numbers are not kept (docs/results/phase1.json, gemm.json: their
    runs' records are not committed); where they are, rerun the rule on them instead (numdev-figure,
    numdev.analysis.study.rejudge)."""
    parts = parts_of(verdict.detail)
    if parts is None:
        counts = [int(n) for n in RANGE_LABEL.findall(verdict.detail)]
        if verdict.status not in JUDGED or not counts or min(counts) >= MIN_CI:
            return verdict
        return Verdict(NOT_MEASURABLE, verdict.rule, f"{verdict.detail}: {RANGE_NO_VERDICT}")
    rejudged = {name: rejudge(part) for name, part in parts.items()}
    if rejudged == parts:
        return verdict
    detail = "; ".join(f"{name}: {v.text()}" for name, v in rejudged.items())
    return Verdict(combined_status([v.status for v in rejudged.values()]), verdict.rule, detail)


def from_text(status: str, text: str, rule: str = "") -> Verdict:
    """A Verdict from its status and its text() (as figure summaries store them)."""
    prefix = f"{SYMBOLS[status]} {status}"
    if text != prefix and not text.startswith(prefix + ": "):
        raise ValueError(f"{text[:60]!r} is not the text of a verdict that {status}")
    return Verdict(status, rule, text[len(prefix) + 2:] if text != prefix else "")
