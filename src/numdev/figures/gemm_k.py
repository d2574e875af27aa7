"""GEMM by accumulation length K: the relative error of bf16-operand products accumulated in FP32,
or in a 14-bit accumulator (rounding to nearest or truncating), promoted to FP32 every N_c products
or not (the Fig. 5 of matrix products)."""

from __future__ import annotations

from pathlib import Path

from numdev.figures.common import Figure, band, curves, mean, paired, per_seed, spread_sentence, summary, unmeasurable
from numdev.figures.gemm_common import labels, model_of, records
from numdev.figures.plotting import plt, save_png
from numdev.stats.intervals import ratio_spread
from numdev.stats.verdicts import combine, range_verdict, ratio_verdict, trend_verdict

FIGURE = Figure(
    "gemm_k",
    "GEMM — accumulation length",
    "A low-precision accumulator's error grows with K (the accumulation length) and an FP32 accumulator's does not; "
    "promoting the partial sum to FP32 every N_c = 128 products (DeepSeek-V3's fix for Hopper's FP8 GEMM) stops the growth.",
    phase="bench",
    module=__name__,
    demo_overrides=("runner.ks=[64,256,1024,4096]",),
)
METRIC = "rel_rmse"  # RMS error over RMS of the golden product: comparable across K
FLAT = (0.5, 2.0)  # "does not grow": the error at the largest K over that at the smallest lies within this band


def roles(rows) -> dict[str, str]:
    """Which method plays which part of the claim, from its recorded stage formats."""
    found = {}
    for label in labels(rows):
        m = model_of(rows, label)
        if m["accum"] == "fp32":
            found.setdefault("fp32", label)
        elif m["accum_rounding"] == "toward_zero":
            found.setdefault("promoted" if m.get("chunk") not in (None, "None") else "unpromoted", label)
    return found


def summarise(rows, out_dir: Path) -> dict:
    rows, note = records(rows)
    names = labels(rows)
    ks = sorted({int(r["shape.k"]) for r in rows})
    if not names or len(ks) < 2:
        return summary("gemm_k", "too few K", unmeasurable("growth with K", "fewer than 2 values of K"), rows, note=note)
    err = per_seed(rows, lambda r: (r["method"], int(r["shape.k"])), METRIC)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, label in enumerate(names):
        m = model_of(rows, label)
        promote = f", promoted every {m['chunk']}" if m.get("chunk") not in (None, "None") else ""
        band(ax, ks, [err.get((label, k)) for k in ks], "o-", color=f"C{i}",
             label=f"{label} ({m['input']} operands, accum {m['accum']} {m['accum_rounding']}{promote})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("K (accumulation length)")
    ax.set_ylabel("RMS error / RMS of C_fp64")
    ax.set_title(f"GEMM relative error against K (M={rows[0]['shape.m']}, N={rows[0]['shape.n']}; bands: range over seeds)",
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save_png(fig, out_dir / "gemm_k.png")

    role = roles(rows)
    parts = {}
    lo, hi = ks[0], ks[-1]
    if "unpromoted" in role:
        label = role["unpromoted"]
        parts["low-precision accumulator grows with K"] = trend_verdict(
            ks, curves({k: err.get((label, k)) for k in ks}), "increasing", what=f"{label} relative error")
    if "fp32" in role:
        label = role["fp32"]
        parts["FP32 accumulator does not grow"] = range_verdict(
            ratio_spread(*paired(err[(label, hi)], err[(label, lo)])), *FLAT, what=f"{label} error at K={hi} / at K={lo}")
    if "promoted" in role and "unpromoted" in role:
        parts["promotion stops the growth"] = ratio_verdict(
            ratio_spread(*paired(err[(role["promoted"], hi)], err[(role["unpromoted"], hi)])), "below", 0.5,
            what=f"{role['promoted']} / {role['unpromoted']} error at K={hi}")
    verdict = combine(parts) if parts else unmeasurable("growth with K", "no accumulator of the claim was measured")
    growth = {label: mean(err.get((label, hi))) / mean(err.get((label, lo))) for label in names}
    caption = (
        f"Relative RMS error against FP64 from K={lo} to K={hi}: "
        + "; ".join(f"{label} {mean(err.get((label, lo))):.2e} → {mean(err.get((label, hi))):.2e} ({growth[label]:.3g}x)"
                    for label in names)
        + f". {spread_sentence(rows)}"
    )
    numbers = {label: {str(k): mean(err.get((label, k))) for k in ks} for label in names}
    return summary("gemm_k", caption, verdict, rows, parts=parts, note=note, rel_rmse=numbers, growth=growth, roles=role)
