"""The harm threshold delta_harm and every role's margin to it.

The attention-noise ladder runs the same training with every attention output times (1 + delta z)
for delta from below Flash's deviation up to where training is harmed. With the downstream effect
of every rung (its held-out loss over the reference's, paired by replicate: numdev.analysis.harm.effects),
per replicate (HARM_RULE):

- the effect against log delta is made non-decreasing (isotonic regression: more noise does not
  help), and delta_harm_r is where it reaches the study's margin, linear in log delta between the
  two rungs around it; a replicate whose largest rung stays below the margin is censored (above the
  ladder), one whose smallest rung is already above it gives at most the smallest rung;
- over replicates: the geometric mean with its interval (numdev.stats.intervals.LOG_RULE) when
  every replicate crosses inside the ladder;
- beside it, the smallest rung whose effect exceeds the margin by the one-sided test of
  numdev.stats.equivalence (the discrete answer, no interpolation).

A role's margin to harm (MARGIN_RULE) is delta_harm_r / delta*_r per replicate (delta* from the
calibration's stable window), summarised the same way: "its per-call deviation is 1/M of the
smallest that measurably harms this training". When the role's delta* is below the ladder or
the floor, M is a lower bound (delta_harm over the smallest rung).

Beside it, where the role's per-call deviation is measured directly (the shadow: its attention
output against eager attention's on the same inputs, relative RMS, in the ladder's own units since
a rung multiplies the output by 1 + delta z), the per-call margin (PER_CALL_RULE) is
delta_harm_r / rel_rms_r per replicate: no calibration through the weights, which one ulp's chaos
can hide, but the assumption that the role's error harms no more than i.i.d. noise of its size
(a biased error may: experiment=harm's biased_1e-1 role tests it).
"""

from __future__ import annotations

import math

import numpy as np

from numdev.analysis.early import isotonic
from numdev.stats import intervals as stats

HARM_RULE = (
    "per replicate, the rungs' effects against log delta made non-decreasing (isotonic regression), delta_harm where they "
    "reach the margin (linear in log delta between the rungs around it); over replicates the geometric mean with its "
    "interval when every replicate crosses inside the ladder"
)
MARGIN_RULE = "delta_harm_r / delta*_r per replicate (delta* over the calibration's stable window), then over replicates"
PER_CALL_RULE = ("delta_harm_r / the role's per-call relative RMS deviation measured by the shadow (mean over layers and steps) "
                 "per replicate, then over replicates (geometric mean, LOG_RULE); read as if the role's error were i.i.d. noise")


def crossing(sizes: list[float], effects: list[float], margin: float) -> tuple[str, float | None]:
    """("inside", delta) | ("above", None) | ("at_or_below", sizes[0]) for one replicate's rungs."""
    fitted = isotonic(np.asarray(effects, dtype=np.float64))
    if fitted[-1] < margin:
        return "above", None
    if fitted[0] >= margin:
        return "at_or_below", sizes[0]
    i = int(np.flatnonzero(fitted >= margin)[0])
    x0, x1 = math.log(sizes[i - 1]), math.log(sizes[i])
    y0, y1 = fitted[i - 1], fitted[i]
    return "inside", math.exp(x0 + (x1 - x0) * (margin - y0) / (y1 - y0))


def delta_harm(rungs: list[tuple[str, float]], effects: dict[str, dict], margin: float, exceeds: dict[str, bool]) -> dict:
    """HARM_RULE from the rungs [(role, delta)] ascending and each rung's per-replicate effects {role: {r: e}}."""
    sizes = [size for _, size in rungs]
    replicates = sorted(set.intersection(*(set(effects.get(role, {})) for role, _ in rungs)), key=int) if rungs else []
    per, where = {}, {}
    for r in replicates:
        kind, value = crossing(sizes, [effects[role][r] for role, _ in rungs], margin)
        where[r] = kind
        if value is not None:
            per[r] = value
    smallest = next((size for role, size in rungs if exceeds.get(role)), None)
    out = {"rule": HARM_RULE, "margin": margin, "rungs": [{"role": n, "size": s} for n, s in rungs],
           "per_replicate": per, "placed": where, "smallest_rung_exceeding": smallest}
    if not replicates:
        out.update(status="not measured", text="not measured: no replicate has every rung's outcome")
    elif all(w == "inside" for w in where.values()):
        estimate = stats.log_mean_interval(list(per.values()))
        out.update(status="measured", estimate=estimate.as_dict(), text=estimate.text(".2g"))
    elif all(w == "above" for w in where.values()):
        out.update(status="above the ladder", text=f"above the ladder: no rung up to {sizes[-1]:g} reaches the margin")
    else:
        counts = ", ".join(f"{list(where.values()).count(k)} {k}" for k in ("inside", "above", "at_or_below")
                           if list(where.values()).count(k))
        out.update(status="not measured", text=f"not measured: replicates {counts}")
    return out


def margin_to_harm(harm: dict, equivalent: dict | None, smallest_rung: float) -> dict:
    """MARGIN_RULE for one role, from delta_harm and the role's calibration value (None: not measured)."""
    if harm.get("status") != "measured":
        return {"status": "not measured", "text": f"not measured: delta_harm is {harm.get('text', 'missing')}"}
    if equivalent is None or equivalent.get("estimate") is None:
        return {"status": "not measured", "text": "not measured: the role's delta* has no stable value"}
    paired = _paired_margin(harm["per_replicate"], equivalent["per_replicate"], MARGIN_RULE)
    return paired or {"status": "not measured", "text": "not measured: no replicate with both delta_harm and delta*"}


def _paired_margin(harm_per_replicate: dict, sizes: dict, rule: str) -> dict | None:
    """delta_harm_r / size_r over the replicates that have both, summarised by LOG_RULE (None: no such replicate)."""
    common = sorted(set(harm_per_replicate) & set(sizes), key=int)
    if not common:
        return None
    ratios = [harm_per_replicate[r] / sizes[r] for r in common]
    estimate = stats.log_mean_interval(ratios)
    return {"status": "measured", "rule": rule, "per_replicate": dict(zip(common, ratios)),
            "estimate": estimate.as_dict(), "text": estimate.text(".2g", "x")}


def margin_bound(harm: dict, smallest_rung: float, why: str) -> dict:
    """A role below the ladder or the floor: its margin is at least delta_harm / the smallest rung."""
    if harm.get("status") != "measured":
        return {"status": "not measured", "text": f"not measured: delta_harm is {harm.get('text', 'missing')}"}
    low = harm["estimate"]["low"] if harm["estimate"].get("low") is not None else harm["estimate"]["value"]
    bound = low / smallest_rung
    return {"status": "lower bound", "bound": bound, "text": f"> {bound:.2g}x ({why}: delta* < {smallest_rung:g})"}


def margin_per_call(harm: dict, rel_rms: dict[str, float]) -> dict | None:
    """PER_CALL_RULE for one role from delta_harm and its per-replicate per-call relative RMS {replicate: value}."""
    measured = {str(r): float(v) for r, v in rel_rms.items() if v is not None and math.isfinite(float(v)) and float(v) > 0}
    if not measured:
        return None
    if harm.get("status") != "measured":
        return {"status": "not measured", "rule": PER_CALL_RULE, "text": f"not measured: delta_harm is {harm.get('text', 'missing')}"}
    paired = _paired_margin(harm["per_replicate"], measured, PER_CALL_RULE)
    return paired or {"status": "not measured", "rule": PER_CALL_RULE,
                      "text": "not measured: no replicate with both delta_harm and a per-call deviation"}
