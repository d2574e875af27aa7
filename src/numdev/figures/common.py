"""What every figure module shares: picking rows, per-seed values, spread drawn as error bars or
bands, non-finite records set aside, and the summary (caption, numbers, verdict, provenance)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from importlib import import_module

import numpy as np

from numdev.numerics.formats import parse_format
from numdev.runs.provenance import provenance
from numdev.stats.intervals import MIN_BOOTSTRAP
from numdev.stats.intervals import RULE as INTERVAL_RULE
from numdev.stats.verdicts import HOLDS, NOT_MEASURABLE, Verdict, from_text, rejudge


@dataclass(frozen=True)
class Figure:
    name: str
    title: str
    claim: str  # the paper's claim, as the report sets it beside our numbers
    phase: str  # "bench": numdev-bench experiment=<name>; "study": numdev-train experiment=flash_stability
    module: str  # where the figure's aggregation, plot and verdict live
    demo_overrides: tuple[str, ...] = ()  # smaller settings numdev-demo uses (its report says so)

    def summarise(self, rows: list[dict], out_dir) -> dict:
        if self.phase != "bench":
            raise ValueError(f"figure {self.name} is made by the study (numdev-study), not from bench records")
        return import_module(self.module).summarise(rows, out_dir)


PAIR = "flash-baseline"
# The paper's three Flash − Baseline metrics, with the line style and label every figure draws them in.
PAIR_METRICS = (("max_abs", "o-", "max |Δ|"), ("mean_abs", "s--", "mean |Δ|"), ("std", "^:", "std Δ"))


def select(rows, kind, method=None, **equal):
    """Rows of one kind ('vs_golden' or 'pair'), optionally one method, and fields equal to values
    (dots in field names written as '__': setting='paper_like', numerics__precision='bf16')."""
    wanted = {key.replace("__", "."): value for key, value in equal.items()}
    return [
        r for r in rows
        if r["kind"] == kind and (method is None or r["method"] == method)
        and all(str(r.get(k)) == str(v) for k, v in wanted.items())
    ]


def split_finite(rows):
    """(rows with finite outputs, a note on those set aside). A record whose output held NaN/Inf
    is never used for a number or a verdict; the figure says how many there were."""
    kept = [r for r in rows if not float(r.get("metrics.nonfinite") or 0)]
    bad = len(rows) - len(kept)
    note = f"{bad} record(s) with NaN/Inf outputs left out" if bad else ""
    return kept, note


def per_seed(rows, key_fn, metric) -> dict:
    """{key: {seed: value}} for one metric."""
    out = defaultdict(dict)
    for r in rows:
        out[key_fn(r)][int(r["seed"])] = float(r[f"metrics.{metric}"])
    return dict(out)


def paired(a: dict, b: dict) -> tuple[list, list]:
    """Values of two {seed: value} maps on the seeds they share, in seed order."""
    seeds = sorted(set(a) & set(b))
    return [a[s] for s in seeds], [b[s] for s in seeds]


def values(by_seed: dict | None) -> list[float]:
    return [by_seed[s] for s in sorted(by_seed)] if by_seed else []


def mean(by_seed: dict | None) -> float:
    vals = values(by_seed)
    return float(np.mean(vals)) if vals else math.nan


def spread(by_seed_list) -> tuple[list, list, list]:
    """(means, distance down to the smallest seed, up to the largest) for error bars."""
    means, lows, highs = [], [], []
    for by_seed in by_seed_list:
        vals = values(by_seed)
        if not vals:
            means.append(math.nan), lows.append(0.0), highs.append(0.0)
            continue
        m = float(np.mean(vals))  # of equal values it can round past them: a bar's length is never negative
        means.append(m), lows.append(max(m - min(vals), 0.0)), highs.append(max(max(vals) - m, 0.0))
    return means, lows, highs


def errorbar(ax, xs, by_seed_list, fmt="o-", **kwargs):
    """Mean over seeds with a bar from the smallest to the largest seed."""
    means, lows, highs = spread(by_seed_list)
    ax.errorbar(xs, means, yerr=[lows, highs], fmt=fmt, capsize=3, **kwargs)
    return means


def band(ax, xs, by_seed_list, style="o-", **kwargs):
    """Mean over seeds as a line, the range over seeds as a shaded band."""
    means, lows, highs = spread(by_seed_list)
    line = ax.plot(xs, means, style, **kwargs)[0]
    ax.fill_between(xs, [m - lo for m, lo in zip(means, lows)], [m + hi for m, hi in zip(means, highs)],
                    color=line.get_color(), alpha=0.2, lw=0)
    return means


def mantissa_bits(precision: str) -> int:
    return parse_format(precision).mantissa_bits


def by_mantissa_bits(precision: str) -> tuple[int, str]:
    """Sort key: mantissa bits, then the name, so formats with equal bits (fp16, tf32) keep one order
    whatever the set's iteration order (string hashing differs between processes)."""
    return mantissa_bits(precision), precision


def seeds_of(rows) -> list[int]:
    return sorted({int(r["seed"]) for r in rows})


def spread_sentence(rows) -> str:
    n = len(seeds_of(rows))
    spread = (f"a number's spread is the {INTERVAL_RULE}" if n >= MIN_BOOTSTRAP else
              f"a number's spread is the range over the {n} seeds (labelled 'range of {n}'): fewer than "
              f"{MIN_BOOTSTRAP} seeds give no 95% interval")
    return f"{n} seed(s); points are means over seeds, bars/bands the range over seeds; {spread}."


def curves(by_x: dict) -> dict:
    """{x: {seed: value}} -> {seed: {x: value}}: one curve per seed, as trend_verdict takes them."""
    out = defaultdict(dict)
    for x, by_seed in by_x.items():
        for seed, value in (by_seed or {}).items():
            out[seed][x] = value
    return dict(out)


# The Baselines a Flash ratio can divide by, by their numerics preset (numdev.numerics.stages).
BASELINES = {
    "paper": "the paper's Baseline (every stage, exp and row sum included, in the run precision)",
    "eager": "eager PyTorch's Baseline (softmax computed in FP32 inside, P rounded once)",
}


def baseline_name(rows) -> str:
    """Which Baseline the rows' `baseline` method is, in words (from its recorded formats)."""
    names = []
    for r in rows:
        if r.get("method") != "baseline" or r.get("kind") != "vs_golden":
            continue
        preset = str(r.get("knobs.formats.preset", "?"))
        if preset in BASELINES:
            name = BASELINES[preset]
        else:
            stages = ("score", "stats", "prob", "accum", "output")
            name = (f"a custom Baseline ({preset}: "
                    + ", ".join(f"{st} {r.get(f'knobs.formats.{st}')}" for st in stages) + ")")
        if name not in names:
            names.append(name)
    return " / ".join(names) or "no Baseline recorded"


def unmeasurable(rule: str, why: str) -> Verdict:
    return Verdict(NOT_MEASURABLE, rule, why)


def summary(name: str, caption: str, verdict: Verdict, rows, parts: dict | None = None, note: str = "", **numbers) -> dict:
    """The figure's summary.json body: caption, verdict (status, rule, detail), parts, numbers and
    provenance. `claim_holds` is True only when the whole claim holds."""
    if note:
        caption = f"{caption} ({note}.)"
    return {
        "figure": name,
        "caption": caption,
        "status": verdict.status,
        "verdict": verdict.text(),
        "verdict_rule": verdict.rule,
        "claim_holds": verdict.status == HOLDS,
        "parts": {k: v.as_dict() for k, v in (parts or {}).items()},
        "nonfinite_note": note,
        **numbers,
        "provenance": provenance(seeds=seeds_of(rows)),
    }


def rejudged(figure: dict) -> dict:
    """A figure's stored summary (its <name>.json, or its entry in docs/results/phase1.json) with its
    verdict re-judged by numdev.stats.verdicts.rejudge: status, verdict, claim_holds, its parts and
    the parts quoted in its caption; every number as it was. The same summary when nothing changes."""
    verdict = from_text(figure["status"], figure["verdict"], figure.get("verdict_rule", ""))
    new = rejudge(verdict)
    if new == verdict:
        return figure
    out = {**figure, "status": new.status, "verdict": new.text()}
    if "claim_holds" in figure:
        out["claim_holds"] = new.status == HOLDS
    if figure.get("parts"):
        parts = {name: Verdict(**part) for name, part in figure["parts"].items()}
        caption = figure.get("caption") or ""
        for name, part in parts.items():
            changed = rejudge(part)
            if changed != part:
                caption = caption.replace(f"{name}: {part.text()}", f"{name}: {changed.text()}")
                parts[name] = changed
        out["parts"] = {name: part.as_dict() for name, part in parts.items()}
        if "caption" in figure:
            out["caption"] = caption
    return out


def rejudge_results(result: dict, date: str) -> dict:
    """A committed results file of figure summaries ({"figures": {name: summary}, ...}: docs/results/
    phase1.json, gemm.json) with every figure rejudged; its `rejudged` note names the figures whose
    verdict changed (this time or before), the rule and when. Unchanged when nothing changes."""
    from numdev.stats.verdicts import RANGE_NO_VERDICT

    figures = {name: rejudged(figure) for name, figure in result["figures"].items()}
    changed = [name for name in figures if figures[name] != result["figures"][name]]
    if not changed:
        return result
    before = (result.get("rejudged") or {}).get("figures") or []
    note = {"date": date, "rule": RANGE_NO_VERDICT, "figures": [n for n in figures if n in changed or n in before]}
    return {**result, "figures": figures, "rejudged": note}


def rejudged_note(result: dict, command: str) -> str:
    """The sentence a generated block adds when its results' verdicts were re-judged (rejudge_results)."""
    note = result.get("rejudged")
    if not note:
        return ""
    return (f" Verdicts re-judged from the stored results by today's rules on {note['date'][:10]} (`{command}`: "
            f"{note['rule']}; every number as the runs wrote it): {', '.join(note['figures'])}.")
