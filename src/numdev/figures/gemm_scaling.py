"""GEMM by scaling granularity: per-tensor, per-row, DeepSeek-V3's 1 x 128 / 128 x 128 tiles, MX 32-element
block scales (floor, ceil, NVIDIA's rceil) and NVFP4, per element format, on activations with outliers
(the Fig. 4 of matrix products)."""

from __future__ import annotations

from pathlib import Path

from numdev.figures.common import Figure, errorbar, mean, paired, spread_sentence, summary, unmeasurable
from numdev.figures.gemm_common import by_label, labels, model_of, records
from numdev.figures.plotting import plt, save_png
from numdev.numerics.formats import parse_format
from numdev.stats.intervals import ratio_spread
from numdev.stats.verdicts import combine, ratio_verdict

FIGURE = Figure(
    "gemm_scaling",
    "GEMM — scaling granularity",
    "With outliers in the activations, MX block scaling (32 elements, E8M0 scales) gives a lower max error than "
    "per-tensor scaling, for every element format: an outlier sets the scale of its block only; DeepSeek-V3's FP8 "
    "tiles (1 x 128, 128 x 128) lower it below per-tensor FP8's, and NVFP4 (16-element blocks, e4m3 scales) below "
    "MXFP4's.",
    phase="bench",
    module=__name__,
    demo_overrides=("runner.ks=[512]",),
)
# block: the OCP MX v1.0 scale; block_ceil: rounded up exactly; block_rceil: NVIDIA's float32 round-up;
# tile: DeepSeek-V3's FP8 tiles; nvfp4: 16-element blocks with e4m3 scales and a tensor scale
SCALINGS = ("tensor", "row", "tile", "block", "block_ceil", "block_rceil", "nvfp4")
MARKERS = "osvD^<*"
COMPARED = (("block", "tensor"), ("tile", "tensor"), ("nvfp4", "block"))  # (finer, coarser): the finer's max error lies below


def summarise(rows, out_dir: Path) -> dict:
    rows, note = records(rows)
    names = labels(rows)
    if not names:
        return summary("gemm_scaling", "no records", unmeasurable("block below tensor", "no records"), rows, note=note)
    err = by_label(rows, "max_abs")
    cell = {}  # (format, scaling) -> label
    for label in names:
        m = model_of(rows, label)
        scaling = m["scaling"]
        if scaling == "block" and m.get("block_scale", "floor") != "floor":
            scaling = f"block_{m['block_scale']}"
        cell.setdefault((m["input"], scaling), label)
    formats = sorted({f for f, _ in cell}, key=lambda f: (parse_format(f).mantissa_bits, f))  # a name breaks ties (fp6_e2m3, fp8_e4m3): sets iterate in a per-process order
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    xs = list(range(len(formats)))
    for i, scaling in enumerate(SCALINGS):
        chosen = [(x, cell[(f, scaling)]) for x, f in zip(xs, formats) if (f, scaling) in cell]
        if chosen:
            errorbar(ax, [x + (i - (len(SCALINGS) - 1) / 2) * 0.11 for x, _ in chosen], [err[label] for _, label in chosen], MARKERS[i], label=scaling)
    ax.set_yscale("log")
    ax.set_xticks(xs, formats)
    ax.set_ylabel("max |C − C_fp64|")
    inputs = rows[0].get("inputs.activations.generator", "?")
    ax.set_title(f"GEMM by scaling granularity ({inputs} activations, K={rows[0]['shape.k']}; bars: range over seeds)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    save_png(fig, out_dir / "gemm_scaling.png")
    parts = {}
    for f in formats:
        for finer, coarser in COMPARED:
            if (f, finer) in cell and (f, coarser) in cell:
                low, high = cell[(f, finer)], cell[(f, coarser)]
                parts[f"{f}: {finer} below {coarser}"] = ratio_verdict(ratio_spread(*paired(err[low], err[high])), "below", 1.0,
                                                                       what=f"{f} {finer} / {coarser} max error")
    verdict = combine(parts) if parts else unmeasurable("block below tensor", "no format with a finer and a coarser scaling")
    table = {f: {s: mean(err[cell[(f, s)]]) for s in SCALINGS if (f, s) in cell} for f in formats}
    caption = (
        f"Max |C − C_fp64| by scaling ({inputs} activations: outlier_std {rows[0].get('inputs.activations.outlier_std', 'n/a')}, "
        f"outlier_prob {rows[0].get('inputs.activations.outlier_prob', 'n/a')}), mean over seeds: "
        + "; ".join(f"{f} " + ", ".join(f"{s} {v:.2e}" for s, v in table[f].items()) for f in formats)
        + f". {spread_sentence(rows)}"
    )
    return summary("gemm_scaling", caption, verdict, rows, parts=parts, note=note, max_abs=table)
