"""Downstream effects, the verdicts on the pre-registered claims, and function-level agreement.

Effects (EFFECT_RULE): per replicate r the role's outcome against the reference's of the same
replicate (the same seeds): the held-out loss relative to the reference's ((L_role - L_ref) / L_ref,
positive: worse), the caption agreements as the drop in percentage points (positive: worse). Each
is judged with numdev.stats.equivalence: through the shared reference (paired, per replicate) and
against the spread of independent seeds (unpaired: the role's replicates against the reference's,
whose seeds differ from each other), with the pre-registered margin.

Claims (role files, `study.claim`; CLAIM_RULES): `harms` holds when the paired held-out effect exceeds
the margin (one-sided test); `no_harm` when it is equivalent to zero within the margin (two one-sided
tests); `more_harm_than` (with `study.claim_than`) when the role's effect minus the other role's, paired
by replicate, exceeds 0. Which test, pre-registered with the margin (`study.harm.test`): the exact sign
test (numdev.stats.equivalence.SIGN_RULE: distribution-free, so a diverged run's huge effect or a
two-valued outcome cannot decide it) or the t test (HARM_RULE / EQUIVALENCE_RULE). Every effect carries
both; the claim reads the registered one. Fewer than MIN_CI replicates: not measurable, never a symbol.
"""

from __future__ import annotations

import math

from numdev.analysis.harm.outcomes import OUTCOMES, relative_effect
from numdev.runs.harm_summary import CLAIMS, HARMS, MORE_HARM, NO_HARM
from numdev.runs.harm_summary import PRIMARY_OUTCOME as PRIMARY
from numdev.stats import equivalence, verdicts
from numdev.stats import intervals as stats

__all__ = ["CLAIMS", "HARMS", "MORE_HARM", "NO_HARM", "PRIMARY"]
EFFECT_RULE = (
    "per replicate against the reference of the same replicate: held-out loss (L_role - L_ref) / L_ref, caption agreement "
    "(ref - role) in points; positive is worse"
)
CLAIM_RULES = {
    HARMS: "holds when the paired held-out effect exceeds the margin: one-sided at alpha = 0.05 by the registered test "
           "(sign: enough replicates above the margin; t: the 90% t interval's lower bound above it)",
    NO_HARM: "holds when the paired held-out effect is equivalent to 0 within +/- the margin: two one-sided tests by the "
             "registered test (sign: enough replicates inside on each side; t: the 90% t interval inside)",
    MORE_HARM: "holds when the role's held-out effect minus the named role's, paired by replicate, exceeds 0 (one-sided, "
               "alpha 0.05, by the registered test)",
}


def effect_values(outcomes: dict, role: str, reference: str, outcome: str) -> dict[str, float]:
    """replicate -> the role's effect on `outcome` against the reference (EFFECT_RULE)."""
    sense = OUTCOMES[outcome][1]
    out = {}
    for r, run in outcomes.get(role, {}).items():
        ref = outcomes.get(reference, {}).get(r)
        if ref is None:
            continue
        if outcome == PRIMARY:
            value = relative_effect(run.get(outcome), ref.get(outcome), sense)
        else:
            a, b = run.get(outcome), ref.get(outcome)
            value = None if a is None or b is None else -sense * (a - b)
        if value is not None and math.isfinite(value):
            out[str(r)] = value
    return out


def judged(values: dict[str, float], margin: float) -> dict | None:
    """The paired effect by both tests: the t test's numbers at the top level, the sign test's under "sign"."""
    if not values:
        return None
    effect = equivalence.paired_effect(list(values.values()), margin)
    sign = equivalence.sign_effect(list(values.values()), margin)
    return {"per_replicate": values, **effect.as_dict(), "text": effect.text(".3g"), "sign": {**sign.as_dict(), "text": sign.text()}}


def exceeds(entry: dict | None, test: str) -> bool:
    """Whether a judged effect exceeds its margin by the registered test."""
    if not entry:
        return False
    return entry["sign"]["harm"]["status"] == verdicts.HOLDS if test == equivalence.SIGN else bool(entry.get("exceeds"))


def against_seeds(outcomes: dict, role: str, reference: str, outcome: str, margin: float) -> dict | None:
    """The role's outcomes against the reference's independent seeds (unpaired), on the effect's scale."""
    ref = [run.get(outcome) for run in outcomes.get(reference, {}).values() if run.get(outcome) is not None]
    mine = [run.get(outcome) for run in outcomes.get(role, {}).values() if run.get(outcome) is not None]
    if len(ref) < 2 or len(mine) < 2:
        return None
    sense = OUTCOMES[outcome][1]
    scale = abs(sum(ref) / len(ref)) if outcome == PRIMARY else 1.0
    effect = equivalence.unpaired_effect([-sense * v / scale for v in mine], [-sense * v / scale for v in ref], margin)
    return {**effect.as_dict(), "text": effect.text(".3g")}


def claim_verdict(role: dict, effects: dict[str, dict], margin: float, test: str = equivalence.SIGN) -> dict | None:
    """The verdict on a role's pre-registered claim (None without one), by the registered test."""
    claim = role.get("claim")
    if claim is None:
        return None
    if claim not in CLAIMS:
        raise ValueError(f"study.claim={claim!r} of role {role['role']!r}: use one of {', '.join(CLAIMS)} (conf/train/study/{role['role']}.yaml)")
    mine = effects.get(role["role"], {}).get(PRIMARY)
    if mine is None:
        return _verdict(claim, verdicts.NOT_MEASURABLE, "no held-out loss effect", role, test)
    if claim == MORE_HARM:
        other = role.get("claim_than")
        theirs = effects.get(other, {}).get(PRIMARY) if other else None
        if theirs is None:
            return _verdict(claim, verdicts.NOT_MEASURABLE, f"study.claim_than={other!r} has no held-out effect", role, test)
        common = sorted(set(mine["per_replicate"]) & set(theirs["per_replicate"]), key=int)
        differences = [mine["per_replicate"][r] - theirs["per_replicate"][r] for r in common]
        if not differences:
            return _verdict(claim, verdicts.NOT_MEASURABLE, f"no replicate shared with {other}", role, test)
        effect = equivalence.paired_effect(differences, margin)
        sign = equivalence.sign_effect(differences, margin)
        status = sign.positive.status if test == equivalence.SIGN else _exceeds_zero(effect)
        text = (f"effect({role['role']}) - effect({other}) {effect.text('.3g').split(';')[0]}; sign test: {sign.counts['positive']} "
                f"of {sign.n} above 0 (p {sign.p['positive']:.2g})")
        return {**_verdict(claim, status, text, role, test), "difference": effect.as_dict(), "difference_sign": sign.as_dict()}
    judged_by = mine["sign"] if test == equivalence.SIGN else mine  # the verdicts of the registered test (numdev.stats.equivalence)
    status = (judged_by["harm"] if claim == HARMS else judged_by["equivalence"])["status"]
    verdict = _verdict(claim, status, f"{mine['sign']['text']}; t: {mine['text']}", role, test)
    if claim == NO_HARM:
        verdict["resolution"] = resolution(mine)
    return verdict


def resolution(effect: dict) -> dict:
    """The smallest equivalence margin this design could have certified for a role with these effects: the sign
    test needs every replicate inside +-margin (at n = 5), so no margin at or below the largest |effect| could hold;
    the t test's equivalence MDE (power 0.8 at a true 0) beside it. Read on a negative control, it is the
    study's resolution: what 'no harm' can mean for this training at this n."""
    largest = max(abs(v) for v in effect["per_replicate"].values())
    mde = effect.get("mde_equivalence")
    return {"largest_abs_effect": largest, "mde_equivalence": mde,
            "text": f"largest |effect| over the replicates {largest:.3g} (the sign test cannot certify a margin at or below it)"
                    + (f"; t equivalence MDE {mde:.3g}" if mde is not None else "")}


def _exceeds_zero(effect) -> str:
    """One-sided at alpha 0.05: holds when the 90% interval lies above 0, fails when it lies below, else not measurable."""
    if effect.tost_interval is None:
        return verdicts.NOT_MEASURABLE
    if effect.tost_interval.low > 0:
        return verdicts.HOLDS
    return verdicts.FAILS if effect.tost_interval.high < 0 else verdicts.NOT_MEASURABLE


def _verdict(claim: str, status: str, text: str, role: dict, test: str) -> dict:
    return {"claim": claim, "status": status, "symbol": verdicts.SYMBOLS[status], "rule": CLAIM_RULES[claim],
            "test": test, "than": role.get("claim_than"), "text": text}


def summarise(values: dict[str, float]) -> dict | None:
    """A per-replicate measure (churn, disagreement, barrier) over replicates: mean with its interval."""
    finite = {r: v for r, v in values.items() if v is not None and math.isfinite(v)}
    if not finite:
        return None
    estimate = stats.mean_interval(list(finite.values()))
    return {"per_replicate": finite, "estimate": estimate.as_dict(), "text": estimate.text(".3g")}
