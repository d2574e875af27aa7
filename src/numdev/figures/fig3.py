"""Fig. 3: the Flash-vs-Baseline deviation falls as mantissa bits grow (bf16 → fp16 → tf32 → fp32 → fp64)."""

from __future__ import annotations

from pathlib import Path

from numdev.figures.common import (
    PAIR,
    PAIR_METRICS,
    Figure,
    baseline_name,
    by_mantissa_bits,
    curves,
    errorbar,
    mantissa_bits,
    mean,
    per_seed,
    select,
    split_finite,
    spread_sentence,
    summary,
)
from numdev.figures.plotting import plt, save_png
from numdev.stats.intervals import replicate_spread
from numdev.stats.verdicts import as_check, trend_verdict

FIGURE = Figure(
    "fig3",
    "Fig. 3 — precision sweep",
    "The Flash-vs-Baseline deviation falls as mantissa bits grow (BF16 → FP16 → FP32 → FP64): the deviation is rounding, not a bug.",
    phase="bench",
    module=__name__,
    demo_overrides=("shape.seq_q=2048",),
)


def summarise(rows, out_dir: Path) -> dict:
    pairs, note = split_finite(select(rows, "pair", PAIR))
    precisions = sorted({r["numerics.precision"] for r in pairs}, key=by_mantissa_bits)
    by = {m: per_seed(pairs, lambda r: r["numerics.precision"], m) for m, _, _ in PAIR_METRICS}
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    xs = list(range(len(precisions)))
    for metric, style, label in PAIR_METRICS:
        errorbar(ax, xs, [by[metric].get(p) for p in precisions], style, label=label)
    ax.set_yscale("log")
    ax.set_xticks(xs, [f"{p}\n({mantissa_bits(p)} bits)" for p in precisions])
    ax.set_xlabel("format (mantissa bits)")
    ax.set_ylabel("flash − baseline")
    ax.set_title("Fig. 3: deviation falls with mantissa bits\n(mean over seeds, bars: range over seeds)", fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    save_png(fig, out_dir / "fig3.png")
    # Rule: per-seed slope of log max |flash − baseline| on the mantissa bits, t-test over seeds.
    bits = {p: mantissa_bits(p) for p in precisions}
    verdict = as_check(trend_verdict(
        bits, curves({p: by["max_abs"].get(p) for p in precisions}),
        "decreasing", what="max |flash − baseline|", log_x=False, unit="mantissa bit",
    ), "an emulator that only rounds differs less with every mantissa bit")
    estimates = {p: replicate_spread(list(by["max_abs"][p].values())) for p in precisions}
    caption = (
        "Max |flash − baseline| per format, mean over seeds [spread]: "
        + ", ".join(f"{p} {estimates[p].text('.2e')}" for p in precisions)
        + f". Baseline: {baseline_name(select(rows, 'vs_golden', 'baseline'))}. {spread_sentence(pairs)}"
    )
    return summary(
        "fig3", caption, verdict, pairs, note=note,
        max_abs={p: mean(by["max_abs"][p]) for p in precisions},
        max_abs_interval={p: estimates[p].as_dict() for p in precisions},
    )
