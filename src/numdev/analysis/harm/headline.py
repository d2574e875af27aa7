"""The harm study's answer: its headline sentence (gated by the controls) and its table of every measure.

The sentence (HEADLINE_RULE) says, for each role under test, how far its per-call deviation is from
the smallest that measurably harms this training: "Flash's per-call deviation is 1/M of the smallest
that measurably harms this training [interval]". It is shown only when every pre-registered claim
holds (the positive controls harm, the negative controls do not); otherwise the summary says which
claim did not hold and why, and no sentence is made.

The table (TABLE_RULE) puts every measure the study has side by side for the roles under test and
the low-precision proxy (bf16-mixed vs fp32 training), and for each the ratio proxy / Flash (FA2's
formats), paired by replicate, judged against the paper's "2-5x" by numdev.stats.verdicts.range_verdict
(from fewer than MIN_CI replicates a range, no symbol). No measure is the headline: they are shown together.
"""

from __future__ import annotations

import math

import numpy as np

from numdev.stats import intervals as stats
from numdev.stats import verdicts

PAPER_RANGE = (2.0, 5.0)
LEARNED_LM = 0.75  # a language model's held-out loss over the unigram entropy the answer needs in every replicate
LEARNED = 0.9  # the reference's colour and position agreement the answer needs in every replicate (LEARNED_RULE)
HEADLINE_RULE = ("shown only when the reference learned what the samples are judged on in every replicate (LEARNED_RULE) "
                 "and every pre-registered claim holds (positive controls harm, negative controls do not); "
                 "M = delta_harm / delta* (numdev.analysis.harm.threshold.MARGIN_RULE), beside it delta_harm / the "
                 "per-call deviation the shadow measured (PER_CALL_RULE)")
LEARNED_RULE = (f"the workload is judged only where learning finished: the reference's colour and position agreement at the end, "
                f"in every replicate, at least {LEARNED:.0%}; a study that ends mid-learning compares runs on either side of a "
                f"transition, and its answer is withheld. A language model (no samples to score) must end with a held-out "
                f"loss below {LEARNED_LM:.0%} of the held-out bytes' unigram entropy (the best loss without context) in every "
                f"replicate: it learned the text's structure, a weaker gate than the images' (it cannot say learning has ended). "
                f"A user's own model: its held-out loss at most study.harm.learned_below, registered with the margin; unset, "
                f"no answer")
TABLE_RULE = ("each measure per replicate; the ratio proxy / Flash paired by replicate (geometric mean, LOG_RULE; the inverse "
              "for the margin to harm, where larger is further from harm), judged against the paper's 2-5x")


def learned(reference_outcomes: dict, threshold: float = LEARNED, learned_below: float | None = None) -> dict:
    """LEARNED_RULE over the reference's runs {replicate: outcomes}: `ok`, and which replicate fell short."""
    short, images = [], False
    for r, run in sorted(reference_outcomes.items(), key=lambda item: int(item[0])):
        if learned_below is not None:  # registered by the study (study.harm.learned_below: a user's own model)
            loss = run.get("heldout_loss")
            if loss is None or not loss <= learned_below:
                short.append(f"replicate {r} held-out loss {'missing' if loss is None else f'{loss:.3g}'} (needs at most {learned_below:g}: "
                             "study.harm.learned_below)")
            continue
        if run.get("unigram_entropy") is not None:  # a language model
            loss, bound = run.get("heldout_loss"), LEARNED_LM * run["unigram_entropy"]
            if loss is None or not loss <= bound:
                short.append(f"replicate {r} held-out loss {'missing' if loss is None else f'{loss:.3g}'} (needs at most {bound:.3g} nats)")
            continue
        for key, label in (("colour_accuracy", "colour"), ("position_accuracy", "position")):
            value = run.get(key)
            if value is None or not value >= threshold:
                short.append(f"replicate {r} {label} {'missing' if value is None else f'{value:.0%}'}")
                images = True
    return {"ok": not short, "threshold": threshold, "rule": LEARNED_RULE,
            "why": ("" if not short else f"learning did not finish: the reference's {', '.join(short)} "
                                         f"({f'needs {threshold:.0%}: ' if images else ''}LEARNED_RULE)")}


def gate(roles: dict, workload: dict | None = None) -> dict:
    """Every claimed role's verdict; `open` when all hold and the workload learned (LEARNED_RULE)."""
    claims = {name: role["control"] for name, role in roles.items() if role.get("control")}
    failing = {name: c for name, c in claims.items() if c["status"] != verdicts.HOLDS}
    unlearned = workload is not None and not workload["ok"]
    why = ("no pre-registered claim in this study" if not claims else
           "; ".join(f"{name}: claim '{c['claim']}' {c['status']} ({c['text']})" for name, c in failing.items()))
    if unlearned:
        why = workload["why"] + (f"; {why}" if why else "")
    return {"open": bool(claims) and not failing and not unlearned, "claims": claims, "learned": workload, "why": why}


def short_why(gates: dict) -> str:
    """The gate's reason in a few words (the console's line, the report's first screen): which requirement did
    not hold, each as `role: claim 'x' status`; the full detail stays in `why` and the report's list."""
    short = [f"{name}: claim '{c['claim']}' {c['status']}" for name, c in (gates.get("claims") or {}).items()
             if c["status"] != verdicts.HOLDS]
    if gates.get("learned") and not gates["learned"]["ok"]:
        short.insert(0, "learning did not finish")
    return "; ".join(short) or ("no pre-registered claim in this study" if not gates.get("claims") else "")


def sentence(roles: dict, under_test: list[str], harm: dict, gates: dict) -> dict:
    """HEADLINE_RULE: the sentence, or why there is none."""
    if not gates["open"]:
        return {"shown": False, "rule": HEADLINE_RULE, "why": f"withheld: {gates['why']}"}
    parts = []
    for name in under_test:
        margin = roles[name].get("margin_to_harm") or {}
        label = roles[name]["label"]
        if margin.get("status") == "measured":
            e = stats.Estimate(**margin["estimate"])
            parts.append(f"{label}: 1/{e.value:.2g} of it [1/{e.high:.2g}, 1/{e.low:.2g}]"
                         if e.has_interval else f"{label}: 1/{e.value:.2g} of it [no interval]")
        elif margin.get("status") == "lower bound":
            parts.append(f"{label}: less than 1/{margin['bound']:.2g} of it (below the ladder)")
        else:
            parts.append(f"{label}: {margin.get('text', 'not measured')}")
        per_call = roles[name].get("margin_per_call") or {}
        if per_call.get("status") == "measured":
            e = stats.Estimate(**per_call["estimate"])
            parts[-1] += (f" by its weights; per call 1/{e.value:.2g} of it [1/{e.high:.2g}, 1/{e.low:.2g}]" if e.has_interval
                          else f" by its weights; per call 1/{e.value:.2g} of it [no interval]")
    text = (f"The per-call deviation that measurably harms this training (held-out loss worse by more than "
            f"{harm['margin']:.0%}) is delta_harm = {harm.get('text', 'not measured')}; " + "; ".join(parts) + ".")
    return {"shown": True, "rule": HEADLINE_RULE, "text": text}


def _per_replicate(role: dict, measure: str) -> dict[str, float]:
    """One measure's per-replicate values of one role (TABLE's rows)."""
    getters = {
        "delta_star": lambda: ((role["calibration"].get("attention_noise") or {}).get("value") or {}).get("per_replicate", {}),
        "eps_star": lambda: ((role["calibration"].get("init") or {}).get("value") or {}).get("per_replicate", {}),
        "distance_step_2": lambda: role.get("distance_at", {}).get("2", {}),
        "w1_slope": lambda: role.get("w1_slope", {}),
        "prediction_disagreement": lambda: (role["function_level"].get("prediction_disagreement") or {}).get("per_replicate", {}),
        "churn": lambda: (role["function_level"].get("churn") or {}).get("per_replicate", {}),
        "loss_barrier": lambda: (role["function_level"].get("loss_barrier") or {}).get("per_replicate", {}),
        "heldout_effect": lambda: (role["effects"].get("heldout_loss") or {}).get("per_replicate", {}),
        "margin_to_harm": lambda: (role.get("margin_to_harm") or {}).get("per_replicate", {}),
        "per_call_rel_rms": lambda: role.get("outcomes", {}).get("per_call_rel_rms", {}),
        "margin_per_call": lambda: (role.get("margin_per_call") or {}).get("per_replicate", {}),
    }
    return {str(r): float(v) for r, v in getters[measure]().items() if v is not None and math.isfinite(float(v))}


MEASURES = {  # measure -> (label, the side that is "more deviation")
    "delta_star": ("delta* (equivalent per-call noise, stable window)", +1),
    "eps_star": ("eps* (equivalent initial-weight perturbation)", +1),
    "distance_step_2": ("relative weight distance ‖ΔW‖/‖W‖ at step 2", +1),
    "w1_slope": ("the paper's pooled W1 slope over the run", +1),
    "prediction_disagreement": ("held-out prediction disagreement (relative RMS)", +1),
    "churn": ("churn: samples whose colour, shape or position differ", +1),
    "loss_barrier": ("loss barrier on the line between the two runs", +1),
    "heldout_effect": ("held-out loss effect (relative)", +1),
    "margin_to_harm": ("margin to harm (delta_harm / delta*)", -1),
    "per_call_rel_rms": ("per-call deviation of the attention output (the shadow's relative RMS)", +1),
    "margin_per_call": ("margin to harm per call (delta_harm / that relative RMS)", -1),
}


def table(roles: dict, columns: list[str], flash: str | None, proxy: str | None) -> list[dict]:
    """TABLE_RULE rows: measure, each column's value with its interval, the proxy / Flash ratio and its verdict."""
    rows = []
    for measure, (label, direction) in MEASURES.items():
        cells = {}
        for name in columns:
            values = _per_replicate(roles[name], measure)
            cells[name] = _cell(values)
        row = {"measure": measure, "label": label, "cells": cells}
        if flash and proxy and flash in roles and proxy in roles:
            row["ratio"] = _ratio(_per_replicate(roles[proxy], measure), _per_replicate(roles[flash], measure), direction)
        if any(cell is not None for cell in cells.values()):
            rows.append(row)
    return rows


def _cell(values: dict[str, float]) -> dict | None:
    if not values:
        return None
    array = np.array(list(values.values()))
    estimate = stats.log_mean_interval(array) if (array > 0).all() else stats.mean_interval(array)
    return {"estimate": estimate.as_dict(), "text": estimate.text(".2g")}


def _ratio(top: dict[str, float], bottom: dict[str, float], direction: int) -> dict:
    common = sorted(set(top) & set(bottom), key=int)
    what = "proxy / Flash" if direction > 0 else "Flash / proxy"
    if not common:
        return {"status": verdicts.NOT_MEASURABLE, "text": "no replicate with both"}
    a, b = np.array([top[r] for r in common]), np.array([bottom[r] for r in common])
    if direction < 0:
        a, b = b, a
    if (a <= 0).any() or (b <= 0).any():
        return {"status": verdicts.NOT_MEASURABLE, "text": f"{what}: not a ratio (values of either sign or zero)"}
    estimate = stats.log_ratio_interval(a, b)
    verdict = verdicts.range_verdict(estimate, *PAPER_RANGE, what=what)
    return {"estimate": estimate.as_dict(), "text": estimate.text(".2g", "x"), "verdict": verdict.as_dict()}
