"""The calibration over steps: every role's equivalent per-call noise delta* at every comparison step.

A role's weights drift from the reference's; the attention-noise ladder (roles of kind ladder with
`study.ladder: {name: attention_noise, size: delta}`: every attention output times (1 + delta z))
says how large a per-call deviation drifts that far. At each snapshot step s and for each replicate
r, the role's distance D_role(s, r) (relative Frobenius, numdev.weights.metrics.EARLY_METRIC) is placed
on that replicate's own ladder (log D against log delta, linear between the two rungs that bracket
it). What can happen, per replicate (PLACEMENTS):

- `inside`: bracketed by two rungs whose distances increase: delta* interpolated between them;
- `non-monotone`: the bracket's rungs do not increase (the larger rung drifted less): no value, and
  the step says so (isotonic pooling would hide it);
- `below the ladder`: below the smallest rung; `above the ladder`: above the largest.

Over replicates (STATUS_RULE): "below the floor" when the role is not told apart from the floor
control (the `ulp` role: D_role / D_ulp's interval does not lie above 1); "as small as one ulp" when
that ratio's interval lies inside [1/AS_ULP_FACTOR, AS_ULP_FACTOR] (an affirmative equivalence, from
MIN_CI replicates); otherwise "measured" (every replicate inside: the geometric mean of delta*_r with
its interval, numdev.stats.intervals.LOG_RULE), "below the ladder", "above the ladder", or "not
measured" (a non-monotone bracket, or replicates on both sides of the ladder's ends).

Stability (STABILITY_RULE): delta* is stable from the first step s0 from which every later measured
step's delta* lies within a factor STABLE_FACTOR of the median over those steps, over at least
MIN_STABLE_STEPS steps; the role's delta* is then, per replicate, the median of delta*_r(s) over the
window, summarised over replicates as above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from numdev.analysis.early import ladder_size
from numdev.stats import intervals as stats
from numdev.weights.metrics import EARLY_METRIC

NOISE_LADDER, INIT_LADDER = "attention_noise", "init"
FLOOR_ROLE = "ulp"
AS_ULP_FACTOR = 2.0
STABLE_FACTOR = 2.0
MIN_STABLE_STEPS = 3
INSIDE, NON_MONOTONE, BELOW, ABOVE = "inside", "non-monotone", "below the ladder", "above the ladder"
PLACEMENTS = (INSIDE, NON_MONOTONE, BELOW, ABOVE)
MEASURED, BELOW_FLOOR, AS_ULP, NOT_MEASURED = "measured", "below the floor", "as small as one ulp", "not measured"
STATUS_RULE = (
    f"per step, over replicates: 'as small as one ulp' when D_role / D_ulp's interval lies inside [1/{AS_ULP_FACTOR:g}, "
    f"{AS_ULP_FACTOR:g}] (from {stats.MIN_CI} replicates), else 'below the floor' when it does not lie above 1; 'measured' when every replicate is bracketed by two "
    "increasing rungs (the geometric mean of the per-replicate values with its interval); 'below/above the ladder' when every "
    "replicate is; 'not measured' when a bracket's rungs do not increase or replicates fall on both sides"
)
STABILITY_RULE = (
    f"stable from the first step s0 from which every later measured step lies within a factor {STABLE_FACTOR:g} of those "
    f"steps' median (at least {MIN_STABLE_STEPS} steps); the role's value: per replicate the median over that window, "
    "then over replicates"
)


@dataclass(frozen=True)
class Placement:
    where: str  # one of PLACEMENTS
    value: float | None  # the equivalent size (inside only)
    bracket: tuple[float, float] | None  # the two rung sizes around it


def place(sizes: list[float], ladder: list[float], value: float) -> Placement:
    """`value` (a distance) placed on one replicate's ladder: rung `sizes` (ascending) with distances `ladder`.

    Inside the ladder's range every pair of neighbouring rungs that straddles the value is a candidate
    bracket; exactly one, with increasing distances, places it; a decreasing one, or several (the
    ladder folds back over the value), is non-monotone: the value's size is ambiguous.
    """
    hits = [i for i in range(len(sizes) - 1) if min(ladder[i], ladder[i + 1]) <= value < max(ladder[i], ladder[i + 1])]
    if not hits:  # below every rung or at/above every rung
        return Placement(BELOW if value < ladder[0] else ABOVE, None, None)
    i = hits[0]
    bracket = (sizes[i], sizes[i + 1])
    if len(hits) > 1 or not ladder[i + 1] > ladder[i] or not ladder[0] <= value < ladder[-1]:
        return Placement(NON_MONOTONE, None, bracket)
    x0, x1, y0, y1 = math.log(sizes[i]), math.log(sizes[i + 1]), math.log(ladder[i]), math.log(ladder[i + 1])
    return Placement(INSIDE, math.exp(x0 + (x1 - x0) * (math.log(value) - y0) / (y1 - y0)), bracket)


def monotone(ladder: list[float]) -> bool:
    return all(b > a for a, b in zip(ladder, ladder[1:]))


def ladder_rungs(roles: dict[str, dict], name: str) -> list[tuple[str, float]]:
    """[(role, size)] of one ladder, ascending (the roles' `study.ladder` blocks); the floor control is not a rung here."""
    rungs = [(role, ladder_size(info["ladder"]["size"])) for role, info in roles.items()
             if (info.get("ladder") or {}).get("name") == name and info["ladder"]["size"] != "ulp"]
    return sorted(rungs, key=lambda rung: rung[1])


def _value(curves: dict, role: str, replicate: int, step: int, metric: str) -> float | None:
    by_rep = curves.get(role, {})
    if replicate not in by_rep:
        return None
    steps, values = by_rep[replicate]
    if step not in steps or metric not in values:
        return None
    v = float(values[metric][steps.index(step)])
    return v if math.isfinite(v) else None


def at_step(curves: dict, rungs: list[tuple[str, float]], role: str, step: int, metric: str = EARLY_METRIC,
            floor_role: str = FLOOR_ROLE) -> dict:
    """One role's calibration at one step: placements per replicate, the floor test, the status and delta*."""
    sizes = [size for _, size in rungs]
    per, placements, ladder_monotone, to_floor = {}, {}, {}, []
    for r in sorted(curves.get(role, {})):
        value = _value(curves, role, r, step, metric)
        ladder = [_value(curves, name, r, step, metric) for name, _ in rungs]
        if value is None or any(v is None or v <= 0 for v in ladder) or value <= 0:
            continue
        p = place(sizes, ladder, value)
        placements[str(r)] = {"where": p.where, "bracket": list(p.bracket) if p.bracket else None}
        ladder_monotone[str(r)] = monotone(ladder)
        if p.value is not None:
            per[str(r)] = p.value
        floor = _value(curves, floor_role, r, step, metric)
        if floor is not None and floor > 0:
            to_floor.append((value, floor))
    out: dict = {"step": step, "per_replicate": per, "placements": placements, "ladder_monotone": ladder_monotone}
    n = len(placements)
    if n == 0:
        out.update(status=NOT_MEASURED, text="not measured: no replicate has the role and every rung at this step")
        return out
    floor_ratio = stats.log_ratio_interval([a for a, _ in to_floor], [b for _, b in to_floor]) if len(to_floor) == n else None
    out["ratio_to_floor"] = floor_ratio.as_dict() if floor_ratio else None
    told_apart = floor_ratio is not None and floor_ratio.has_interval and floor_ratio.low > 1
    wheres = [p["where"] for p in placements.values()]
    as_ulp = (floor_ratio is not None and floor_ratio.n >= stats.MIN_CI and floor_ratio.method != stats.RANGE
              and floor_ratio.has_interval and floor_ratio.low >= 1 / AS_ULP_FACTOR and floor_ratio.high <= AS_ULP_FACTOR)
    if role == floor_role or as_ulp or (floor_ratio is not None and not told_apart):
        status = AS_ULP if as_ulp else BELOW_FLOOR
        ratio = floor_ratio.text(".2g", "x") if floor_ratio else "n/a"
        out.update(status=status, text=f"{status}: D/D_{floor_role} = {ratio}")
    elif all(w == BELOW for w in wheres):
        out.update(status=BELOW, text=f"below the ladder (< {sizes[0]:g}), above the floor")
    elif all(w == ABOVE for w in wheres):
        out.update(status=ABOVE, text=f"above the ladder (> {sizes[-1]:g})")
    elif NON_MONOTONE in wheres:
        bad = [r for r, p in placements.items() if p["where"] == NON_MONOTONE]
        out.update(status=NOT_MEASURED, text=f"not measured: non-monotone bracket in replicate(s) {', '.join(bad)} of {n}")
    elif len(per) < n:
        counts = ", ".join(f"{wheres.count(w)} {w}" for w in PLACEMENTS if wheres.count(w))
        out.update(status=NOT_MEASURED, text=f"not measured: replicates on both sides of the ladder ({counts})")
    else:
        estimate = stats.log_mean_interval(list(per.values()))
        out.update(status=MEASURED, estimate=estimate.as_dict(), text=estimate.text(".2g"))
    return out


def stable_window(per_step: dict[int, dict]) -> dict:
    """STABILITY_RULE over the measured steps of one role (step -> at_step(...))."""
    measured = [(s, e["estimate"]["value"]) for s, e in sorted(per_step.items()) if e.get("status") == MEASURED]
    for k in range(len(measured)):
        tail = measured[k:]
        if len(tail) < MIN_STABLE_STEPS:
            break
        median = float(np.median([v for _, v in tail]))
        if all(median / STABLE_FACTOR <= v <= median * STABLE_FACTOR for _, v in tail):
            return {"stable": True, "from_step": tail[0][0], "steps": [s for s, _ in tail], "median": median}
    return {"stable": False, "steps": [s for s, _ in measured],
            "why": f"{len(measured)} measured step(s), none from which every later one stays within a factor {STABLE_FACTOR:g}"}


def window_value(per_step: dict[int, dict], window: dict) -> dict | None:
    """Per replicate, the median delta*_r over the stable window; over replicates, LOG_RULE."""
    if not window.get("stable"):
        return None
    by_rep: dict[str, list[float]] = {}
    for s in window["steps"]:
        for r, v in per_step[s]["per_replicate"].items():
            by_rep.setdefault(r, []).append(v)
    per = {r: float(np.median(v)) for r, v in by_rep.items() if len(v) == len(window["steps"])}
    if not per:
        return None
    estimate = stats.log_mean_interval(list(per.values()))
    return {"per_replicate": per, "estimate": estimate.as_dict(), "text": estimate.text(".2g")}


def calibrate(curves: dict, roles: dict[str, dict], ladder: str = NOISE_LADDER, metric: str = EARLY_METRIC) -> dict:
    """Every role's equivalent size on `ladder` at every common snapshot step after 0, its stability and value."""
    rungs = ladder_rungs(roles, ladder)
    if len(rungs) < 2 or any(name not in curves for name, _ in rungs):
        return {"ladder": ladder, "problem": f"no {ladder} ladder of at least 2 rungs among this study's roles"}
    steps = sorted(set.intersection(*(set(s for s in curves[name][r][0] if s > 0)
                                      for name, _ in rungs for r in curves[name])))
    roles_out = {}
    for role in curves:
        per_step = {s: at_step(curves, rungs, role, s, metric) for s in steps}
        window = stable_window(per_step)
        roles_out[role] = {"steps": {str(s): e for s, e in per_step.items()}, "stability": window,
                           "value": window_value(per_step, window)}
    non_monotone = {str(s): sorted(r for r in {r for name, _ in rungs for r in curves[name]}
                                   if not monotone([_value(curves, n, r, s, metric) or 0.0 for n, _ in rungs]))
                    for s in steps}
    return {"ladder": ladder, "metric": metric, "rungs": [{"role": n, "size": s} for n, s in rungs], "steps": steps,
            "floor_role": FLOOR_ROLE, "status_rule": STATUS_RULE, "stability_rule": STABILITY_RULE,
            "non_monotone_replicates": {s: r for s, r in non_monotone.items() if r}, "roles": roles_out}
