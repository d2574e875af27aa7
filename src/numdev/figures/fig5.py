"""Fig. 5: the deviation grows with sequence length N, tiles fixed, in the paper-like and the
real-kernel setting; in the paper's own metric (Flash − Baseline: max, mean, std), against the
FP64 golden value, and as a bias (mean signed error against the golden value)."""

from __future__ import annotations

from pathlib import Path

from numdev.figures.common import (
    PAIR,
    PAIR_METRICS,
    Figure,
    band,
    baseline_name,
    curves,
    mean,
    per_seed,
    select,
    split_finite,
    spread_sentence,
    summary,
    unmeasurable,
)
from numdev.figures.fig4 import _short, setting_of
from numdev.figures.plotting import plt, save_png
from numdev.stats.verdicts import combine, trend_verdict

FIGURE = Figure(
    "fig5",
    "Fig. 5 — sequence length",
    "With tile and SRAM size fixed, the deviation grows with sequence length, in max and in mean/std (more tiles, more rescalings).",
    phase="bench",
    module=__name__,
    demo_overrides=("shape.seq_q=256,512,1024,2048,4096",),
)


QUANTISED_VALUES = 2  # a max |Δ| taking no more distinct values than this over every N and seed is quantised


def _quantised(series, label: str):
    """A max |Δ| quantised to the output's ulps (a 16-bit output: max |flash − baseline| is one or two
    ulps at every N) cannot show growth, whatever the deviation does: not measurable, and the mean and
    std parts judge the claim. None when the values are not so quantised."""
    values = sorted({float(v) for by_seed in series if by_seed for v in by_seed.values()})
    if not values or len(values) > QUANTISED_VALUES or len(series) < 3:
        return None
    return unmeasurable(
        f"a max |Δ| with at most {QUANTISED_VALUES} distinct values over every N and seed is quantised to the output's ulps, "
        "not judged for growth",
        f"{label} takes only {', '.join(f'{v:.3g}' for v in values)} over {len(series)} lengths and every seed: the output's "
        "ulps, not a trend (the mean |Δ| and std Δ parts judge growth)")


def summarise(rows, out_dir: Path) -> dict:
    pairs, note = split_finite(select(rows, "pair", PAIR))
    golden, note_golden = split_finite(select(rows, "vs_golden"))
    settings = sorted({setting_of(r) for r in pairs}, key=lambda s: (s != "paper_like", s))
    lengths = sorted({int(r["shape.seq_q"]) for r in pairs})
    n_key = lambda r: (setting_of(r), int(r["shape.seq_q"]))  # noqa: E731
    by = {m: per_seed(pairs, n_key, m) for m, _, _ in PAIR_METRICS}
    gold_key = lambda r: (setting_of(r), r["method"], int(r["shape.seq_q"]))  # noqa: E731
    gold = {m: per_seed(golden, gold_key, m) for m in ("max_abs", "mean_signed", "rel_rmse")}
    fig, axes = plt.subplots(len(settings), 3, figsize=(16, 4 * len(settings)), squeeze=False)
    parts, growth = {}, {}
    for row_axes, setting in zip(axes, settings):
        for metric, style, label in PAIR_METRICS:
            series = [by[metric].get((setting, n)) for n in lengths]
            band(row_axes[0], lengths, series, style, label=label)
            parts[f"{setting} {label}"] = (_quantised(series, label) if metric == "max_abs" else None) or trend_verdict(
                lengths, curves(dict(zip(lengths, series))), "increasing", what=f"{setting} flash − baseline {label}")
            growth[f"{setting}/{metric}"] = mean(series[-1]) / mean(series[0]) if series[0] and series[-1] else None
        for method, style in (("flash", "o-"), ("baseline", "s--")):
            band(row_axes[1], lengths, [gold["max_abs"].get((setting, method, n)) for n in lengths], style, label=method)
            band(row_axes[2], lengths, [gold["mean_signed"].get((setting, method, n)) for n in lengths], style, label=method)
        row_axes[0].set_title(f"{setting}: flash − {_short(golden, setting)} baseline (the paper's metric)")
        row_axes[1].set_title(f"{setting}: max |Δ| vs FP64 golden")
        row_axes[2].set_title(f"{setting}: mean signed error vs FP64 (bias)")
        row_axes[2].axhline(0.0, color="k", lw=0.8)
        for ax in row_axes:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("sequence length N")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        row_axes[0].set_yscale("log")
        row_axes[1].set_yscale("log")
    tiles = sorted({f"{r.get('knobs.a.tiles.block_r')}x{r.get('knobs.a.tiles.block_c')}" for r in pairs})
    precision = "/".join(sorted({r["numerics.precision"] for r in pairs}))
    fig.suptitle(f"Fig. 5: deviation against N ({precision}; tiles B_r x B_c requested {', '.join(tiles)}; bands: range over seeds)")
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    save_png(fig, out_dir / "fig5.png")
    verdict = combine(parts) if parts else unmeasurable("growth with N", "no pair records")
    caption = (
        f"From N={lengths[0]} to N={lengths[-1]} the mean over seeds of flash − baseline changes by "
        + "; ".join(f"{key} {value:.2g}x" for key, value in growth.items() if value is not None)
        + ". Bias (mean signed error vs FP64) at the largest N: "
        + "; ".join(
            f"{s} {m} {mean(gold['mean_signed'].get((s, m, lengths[-1]))):+.2e}" for s in settings for m in ("flash", "baseline")
        )
        + ". The Baseline in each setting: "
        + "; ".join(f"{s}: {baseline_name([r for r in golden if setting_of(r) == s])}" for s in settings)
        + f". {spread_sentence(pairs)}"
    )
    numbers = {f"{s}/{metric}": {str(n): mean(by[metric].get((s, n))) for n in lengths} for s in settings for metric, _, _ in PAIR_METRICS}
    bias = {f"{s}/{m}": {str(n): mean(gold["mean_signed"].get((s, m, n))) for n in lengths} for s in settings for m in ("flash", "baseline")}
    return summary("fig5", caption, verdict, pairs, parts=parts, note=note or note_golden,
                   growth=growth, flash_minus_baseline=numbers, mean_signed_vs_golden=bias)
