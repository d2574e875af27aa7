"""The early phase: measures that tell perturbation sizes apart, and the calibration ladder.

A small perturbation e of the weights grows roughly like e·exp(λt) until it saturates; two
perturbations of different size differ early (a shift of their log-distance curves) and look alike
once saturated (docs/study.md#early). So every role's distance to the reference (relative Frobenius,
EARLY_METRIC) is read early, on the log-spaced snapshot schedule (numdev.train.callbacks.snapshots.LOG_STEPS):

- **ratio at fixed steps**: D_role / D_under_test at EARLY_STEPS, per replicate, summarised by the
  geometric mean with a t interval (numdev.stats.intervals.log_ratio_interval; "range of n" below 5 replicates);
- **first crossing**: the first step at which a curve reaches D in THRESHOLDS, log-linearly
  interpolated between the two snapshot steps around it;
- **shift**: log D_role(t) = a_role + b t and log D_ut(t) = a_ut + b t fitted together (common
  slope, one intercept each) per replicate over the pair's exponential window; exp(a_role - a_ut)
  summarised as above. WINDOW_RULE says how the window is found; it is reported with the shift.

The ladder (conf/train/study/eps_*.yaml, delta_*.yaml, ulp.yaml: `study.ladder: {name, size}`) gives the
units. Its init ladder perturbs the initial weights by relative sizes eps (ulp = ULP_RELATIVE); its
smallest rung (ulp) is the floor control. At a step s:

- **resolution floor**: the smallest rung eps whose distance is told apart from the floor control's
  (the ratio's interval lies above 1; FLOOR_RULE); reported with the bracket (largest rung below it not
  told apart, floor] and the ratio's interval;
- **equivalent size** of a role: per replicate, its D(s) placed on the ladder's curve log D(s) against
  log eps (piecewise linear through the replicate's own rungs, made non-decreasing), summarised by the geometric mean with its t
  interval; "below the floor (< eps_floor)" when the role is not told apart from the floor control.

The calibration step is the early step with the lowest floor (ties: the earliest): where the ladder
resolves the smallest sizes (CALIBRATION_RULE).
"""

from __future__ import annotations

import math

import numpy as np

from numdev.models.perturb import ULP_RELATIVE
from numdev.stats import intervals as stats
from numdev.stats import verdicts
from numdev.weights.metrics import EARLY_METRIC

EARLY_STEPS = (2, 4, 8, 16, 32)
THRESHOLDS = (1e-4, 1e-3, 1e-2)
SATURATION_FRACTION = 0.1
MIN_WINDOW_STEPS = 3
INIT_LADDER, NOISE_LADDER = "init", "attention_noise"
WINDOW_RULE = (
    f"the pair's exponential window: snapshot steps from the first at which both curves are above 0 in every replicate up "
    f"to the last step at which both curves' replicate means are "
    f"below {SATURATION_FRACTION:g} of the largest mean either reaches in the run (past it they saturate and merge); at least "
    f"{MIN_WINDOW_STEPS} steps, else no shift"
)
FLOOR_RULE = "the smallest ladder eps whose D(s) / D_floor-control(s) interval over replicates lies above 1"
CALIBRATION_RULE = "the early step with the lowest resolution floor (ties: the earliest)"
SATURATED_AT_START = 0.5  # a curve at >= this fraction of its largest value at step 0 starts saturated


def ladder_size(size) -> float:
    """A rung's size from its role file: a number, or 'ulp' (ULP_RELATIVE)."""
    if size == "ulp":
        return ULP_RELATIVE
    if isinstance(size, bool) or not isinstance(size, (int, float)) or not size > 0:
        raise ValueError(f"study.ladder.size={size!r}: a positive number or ulp")
    return float(size)


def _at(steps: list[int], values: list[float], step: int) -> float | None:
    return float(values[steps.index(step)]) if step in steps else None


def crossing_step(steps, values, threshold: float) -> float | None:
    """The first step at which the curve reaches `threshold` (log-linear between snapshot steps); None if never."""
    x, y = np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)
    hit = np.flatnonzero(y >= threshold)
    if hit.size == 0:
        return None
    i = int(hit[0])
    if i == 0 or y[i - 1] <= 0:
        return float(x[i])
    a, b = math.log(y[i - 1]), math.log(y[i])
    return float(x[i - 1] + (x[i] - x[i - 1]) * (math.log(threshold) - a) / (b - a))


def _paired(curves: dict, role: str, other: str, step: int, metric: str) -> tuple[list[int], list[float], list[float]]:
    """Replicates both roles have at `step`, with their distances there."""
    reps, top, bottom = [], [], []
    for r in sorted(set(curves.get(role, {})) & set(curves.get(other, {}))):
        (s1, v1), (s2, v2) = curves[role][r], curves[other][r]
        a, b = (_at(s1, v1.get(metric, []), step), _at(s2, v2.get(metric, []), step))
        if a is not None and b is not None:
            reps.append(r)
            top.append(a)
            bottom.append(b)
    return reps, top, bottom


def ratio_at(curves: dict, role: str, other: str, step: int, metric: str = EARLY_METRIC) -> dict | None:
    """D_role / D_other at `step` per replicate and their geometric mean with its interval."""
    reps, top, bottom = _paired(curves, role, other, step, metric)
    if not reps:
        return None
    per = {str(r): (a / b if b > 0 else None) for r, a, b in zip(reps, top, bottom)}
    if any(b <= 0 or a <= 0 for a, b in zip(top, bottom)):
        return {"per_replicate": per, "estimate": None, "problem": "a zero distance: no log ratio"}
    estimate = stats.log_ratio_interval(top, bottom)
    return {"per_replicate": per, "estimate": estimate.as_dict()}


def early_ratios(curves: dict, under_test: str, metric: str = EARLY_METRIC) -> dict:
    """role -> str(step) -> ratio_at(role, under_test) for every role and EARLY_STEPS."""
    out = {}
    for role in curves:
        if role == under_test:
            continue
        row = {str(s): ratio_at(curves, role, under_test, s, metric) for s in EARLY_STEPS}
        out[role] = {k: v for k, v in row.items() if v is not None}
    return out


def crossings(curves: dict, metric: str = EARLY_METRIC) -> dict:
    """role -> str(threshold) -> per-replicate first step reaching it, how many reached it, their mean."""
    out = {}
    for role, by_rep in curves.items():
        row = {}
        for threshold in THRESHOLDS:
            per = {str(r): crossing_step(s, v[metric], threshold) for r, (s, v) in sorted(by_rep.items()) if metric in v}
            reached = [x for x in per.values() if x is not None]
            entry = {"per_replicate": per, "reached": len(reached), "replicates": len(per),
                     "at_start": sum(1 for x in reached if x == 0)}  # already above it at step 0
            if reached and len(reached) == len(per) and min(reached) > 0:
                entry["estimate"] = stats.log_mean_interval(reached).as_dict()
            row[f"{threshold:g}"] = entry
        out[role] = row
    return out


def _mean_curve(by_rep: dict, metric: str) -> tuple[list[int], np.ndarray]:
    steps = next(iter(by_rep.values()))[0]
    values = np.array([by_rep[r][1][metric] for r in sorted(by_rep)], dtype=np.float64)
    return list(steps), values.mean(axis=0)


def exponential_window(curves: dict, roles: tuple[str, ...], metric: str = EARLY_METRIC) -> list[int]:
    """WINDOW_RULE: the steps (>= 1) of the roles' common exponential window."""
    means = [_mean_curve(curves[role], metric) for role in roles]
    steps = means[0][0]
    if any(m[0] != steps for m in means):
        return []
    level = max(float(m[1].max()) for m in means)
    below = np.all([m[1] < SATURATION_FRACTION * level for m in means], axis=0)
    positive = np.all([np.min([curves[role][r][1][metric] for r in curves[role]], axis=0) > 0 for role in roles], axis=0)
    window = []
    for step, ok, up in zip(steps, below, positive):
        if step < 1 or (not up and not window):
            continue
        if not ok or not up:
            break
        window.append(step)
    return window


def common_slope_fit(x: np.ndarray, logs: np.ndarray) -> tuple[float, np.ndarray]:
    """Least squares of logs[k, i] = a_k + b x[i]: the common slope b and one intercept a_k per curve."""
    centred_x = x - x.mean()
    centred_y = logs - logs.mean(axis=1, keepdims=True)
    slope = float((centred_y * centred_x).sum() / (len(logs) * (centred_x**2).sum()))
    return slope, logs.mean(axis=1) - slope * x.mean()


def shift(curves: dict, role: str, under_test: str, metric: str = EARLY_METRIC) -> dict:
    """The shift of role's log-distance curve against under_test's in their exponential window."""
    window = exponential_window(curves, (role, under_test), metric)
    out = {"window": window, "rule": WINDOW_RULE}
    if len(window) < MIN_WINDOW_STEPS:
        out["problem"] = f"no exponential window: {len(window)} step(s) before saturation"
        return out
    per, slopes = {}, {}
    for r in sorted(set(curves[role]) & set(curves[under_test])):
        (steps, a), (_, b) = curves[role][r], curves[under_test][r]
        index = [steps.index(s) for s in window]
        logs = np.log(np.array([np.asarray(a[metric])[index], np.asarray(b[metric])[index]], dtype=np.float64))
        if not np.isfinite(logs).all():
            continue
        slope, intercepts = common_slope_fit(np.asarray(window, dtype=np.float64), logs)
        per[str(r)] = float(math.exp(intercepts[0] - intercepts[1]))
        slopes[str(r)] = slope
    out.update(per_replicate=per, slope_per_replicate=slopes)
    if per:
        out["estimate"] = stats.log_mean_interval(list(per.values())).as_dict()
    return out


def shifts(curves: dict, under_test: str, metric: str = EARLY_METRIC) -> dict:
    return {role: shift(curves, role, under_test, metric) for role in curves if role != under_test}


# ----------------------------------------------------------------------------- the ladder


def ladders(roles: dict[str, dict]) -> dict[str, list[tuple[str, float]]]:
    """ladder name -> [(role, size)] ascending, from the roles' `ladder` blocks."""
    out: dict[str, list] = {}
    for role, info in roles.items():
        block = info.get("ladder")
        if block:
            out.setdefault(block["name"], []).append((role, ladder_size(block["size"])))
    return {name: sorted(rungs, key=lambda rung: rung[1]) for name, rungs in out.items()}


def isotonic(y: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence closest to y in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for value in np.asarray(y, dtype=np.float64):
        blocks.append([float(value), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, c2), (m1, c1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    return np.concatenate([np.full(int(c), m) for m, c in blocks])


def invert(sizes: np.ndarray, values: np.ndarray, value: float) -> tuple[float, str]:
    """The size at which the ladder's curve (log D against log size, made non-decreasing by isotonic
    regression: rungs below the floor scatter) reaches `value`: ("inside" | "below" | "above")."""
    x, y = np.log(sizes), isotonic(np.log(values))
    v = math.log(value)
    if v <= y[0]:
        return float(sizes[0]), "below"
    if v >= y[-1]:
        return float(sizes[-1]), "above"
    i = int(np.searchsorted(y, v, side="right")) - 1
    return float(math.exp(x[i] + (x[i + 1] - x[i]) * (v - y[i]) / (y[i + 1] - y[i]))), "inside"


def floor_at(curves: dict, rungs: list[tuple[str, float]], step: int, metric: str = EARLY_METRIC) -> dict:
    """FLOOR_RULE at `step`: the ratio of every rung to the floor control (the smallest rung)."""
    control = rungs[0][0]
    ratios, floor, bracket_low = {}, None, rungs[0][1]
    for role, size in rungs[1:]:
        entry = ratio_at(curves, role, control, step, metric)
        if entry is None or entry.get("estimate") is None:
            ratios[role] = entry
            continue
        estimate = stats.Estimate(**entry["estimate"])
        entry["told_apart"] = bool(estimate.has_interval and estimate.low > 1)
        ratios[role] = entry
        if entry["told_apart"] and floor is None:
            floor = (role, size)
        elif not entry["told_apart"] and floor is None:
            bracket_low = size
    out = {"step": step, "control": control, "rule": FLOOR_RULE, "ratios_to_control": ratios}
    if floor is None:
        out.update(floor=None, text=f"no rung told apart from {control} (floor above {rungs[-1][1]:g})")
    else:
        out.update(floor=floor[1], floor_role=floor[0], bracket=[bracket_low, floor[1]],
                   text=f"eps_floor = {floor[1]:g} (between {bracket_low:.2g} and {floor[1]:g}; "
                        f"{floor[0]}/{control} = {stats.Estimate(**ratios[floor[0]]['estimate']).text('.3g', 'x')})")
    return out


def equivalent_size(curves: dict, rungs: list[tuple[str, float]], role: str, step: int, floor: dict,
                    metric: str = EARLY_METRIC) -> dict:
    """The role's equivalent size on one ladder at `step` (see the module's docstring)."""
    control = floor["control"]
    names = [name for name, _ in rungs]
    sizes = np.array([size for _, size in rungs])
    per, where = {}, {}
    for r in sorted(curves.get(role, {})):
        if any(r not in curves.get(name, {}) for name in names):
            continue
        value = _at(*_curve(curves, role, r, metric), step)
        ladder = [_at(*_curve(curves, name, r, metric), step) for name in names]
        if value is None or any(v is None for v in ladder) or value <= 0 or min(ladder) <= 0:
            continue
        per[str(r)], where[str(r)] = invert(sizes, np.array(ladder), value)
    out = {"step": step, "per_replicate": per, "placed": where}
    if not per:
        out.update(status="not measurable", text="not measurable: no replicate with every rung at this step")
        return out
    estimate = stats.log_mean_interval(list(per.values()))
    out["estimate"] = estimate.as_dict()
    to_control = ratio_at(curves, role, control, step, metric) if role != control else None
    told = to_control is not None and to_control.get("estimate") is not None and stats.Estimate(**to_control["estimate"]).low > 1 \
        and stats.Estimate(**to_control["estimate"]).has_interval
    out["ratio_to_control"] = to_control
    floor_value = floor.get("floor")
    if estimate.n < stats.MIN_SEEDS:
        out.update(status="not measurable", text=f"not measurable: {estimate.n} replicate(s), no interval "
                                                 f"(eps* = {estimate.value:.2g} by the one ladder)")
    elif role == control or not told:
        bound = f"{floor_value:.2g}" if floor_value is not None else f"{sizes[-1]:g} (no rung resolved)"
        out.update(status="below the floor", text=f"below the floor (< {bound}): not told apart from {control}")
    elif any(w == "above" for w in where.values()):
        out.update(status="above the ladder", text=f"above the ladder (> {sizes[-1]:g})")
    else:
        out.update(status="measured", text=f"{estimate.text('.2g')}")
    return out


def _curve(curves, role, replicate, metric):
    steps, values = curves[role][replicate]
    return steps, values.get(metric, [])


def calibration(curves: dict, roles: dict[str, dict], under_test: str | None, metric: str = EARLY_METRIC) -> dict:
    """Floors at every early step, the calibration step, every role's equivalent size on every ladder."""
    all_ladders = ladders(roles)
    init = all_ladders.get(INIT_LADDER)
    if not init or len(init) < 2 or any(name not in curves for name, _ in init):
        return {"problem": "no init ladder (conf/train/study/ulp.yaml and eps_*.yaml) in this study"}
    have = [s for s in EARLY_STEPS if all(_paired(curves, name, init[0][0], s, metric)[0] for name, _ in init[1:])]
    if not have:
        return {"problem": f"the ladder's curves have none of the early steps {EARLY_STEPS}: use snapshot.schedule=log"}
    floors = {str(s): floor_at(curves, init, s, metric) for s in have}
    resolved = [s for s in have if floors[str(s)]["floor"] is not None]
    step = min(resolved, key=lambda s: (floors[str(s)]["floor"], s)) if resolved else have[0]
    floor = floors[str(step)]
    equivalents = {}
    for name, rungs in all_ladders.items():
        if any(r not in curves for r, _ in rungs):
            continue
        equivalents[name] = {role: equivalent_size(curves, rungs, role, step, floor, metric) for role in curves}
    return {
        "metric": metric, "step": step, "step_rule": CALIBRATION_RULE, "floors": floors, "floor": floor,
        "ladders": {name: [{"role": r, "size": s} for r, s in rungs] for name, rungs in all_ladders.items()},
        "equivalent": equivalents, "under_test": under_test,
    }


def equivalent_ratio(calib: dict, numerator: str, denominator: str, ladder: str = INIT_LADDER) -> dict:
    """eps*(numerator) / eps*(denominator) per replicate (paired), with its interval: measured only when both are."""
    entries = calib.get("equivalent", {}).get(ladder, {})
    top, bottom = entries.get(numerator), entries.get(denominator)
    what = f"eps*({numerator}) / eps*({denominator})"
    if not top or not bottom:
        return {"what": what, "status": "not measurable", "text": f"{what}: a role is missing"}
    unmeasured = [name for name, e in ((numerator, top), (denominator, bottom)) if e.get("status") != "measured"]
    if unmeasured:
        return {"what": what, "status": "not measurable",
                "text": f"{what}: not measurable: " + " and ".join(f"{n} is {entries[n]['text']}" for n in unmeasured)}
    common = sorted(set(top["per_replicate"]) & set(bottom["per_replicate"]), key=int)
    estimate = stats.log_ratio_interval([top["per_replicate"][r] for r in common], [bottom["per_replicate"][r] for r in common])
    return {"what": what, "status": "measured", "estimate": estimate.as_dict(), "text": f"{what} = {estimate.text('.2g', 'x')}"}


def saturated_at_start(by_rep: dict, metric: str = EARLY_METRIC) -> tuple[bool, float]:
    """A curve that starts at >= SATURATED_AT_START of its largest (replicate-mean) value: its growth
    cannot be compared with one that starts at zero. Returns (saturated, mean D at step 0)."""
    steps, mean = _mean_curve(by_rep, metric)
    start = float(mean[steps.index(0)]) if 0 in steps else math.nan
    return bool(math.isfinite(start) and start >= SATURATED_AT_START * float(mean.max()) and start > 0), start


def saturation_verdict(by_rep: dict, what: str, metric: str = EARLY_METRIC) -> verdicts.Verdict | None:
    """'not comparable: saturated at step 0' for a proxy that starts apart; None when its growth can be compared."""
    saturated, start = saturated_at_start(by_rep, metric)
    if not saturated:
        return None
    return verdicts.Verdict(
        verdicts.NOT_MEASURABLE,
        f"a growth ratio needs a curve that starts below {SATURATED_AT_START:g} of its largest value",
        f"{what}: not comparable: saturated at step 0 (D = {start:.3g} at step 0)",
    )
