"""GEMM by format: each element format's matrix product against the FP64 golden product (the Fig. 3
of matrix products), and the real kernels on this CPU beside their emulation, bit for bit."""

from __future__ import annotations

from pathlib import Path

from numdev.figures.common import Figure, errorbar, mean, paired, spread_sentence, summary, unmeasurable
from numdev.figures.gemm_common import bit_identity_verdict, by_label, kind_of, labels, model_of, records
from numdev.figures.plotting import plt, save_png
from numdev.numerics.formats import parse_format
from numdev.stats.intervals import ratio_spread, replicate_spread
from numdev.stats.verdicts import as_check, combine, ratio_verdict, trend_verdict

FIGURE = Figure(
    "gemm_formats",
    "GEMM — by format",
    "A matrix product's deviation from FP64 falls as its element format's mantissa bits grow (FP4 → FP6 → FP8 → "
    "BF16 → FP32, unscaled or MX-scaled); torch._scaled_mm and a torch.compile'd matmul give their emulation's bits; "
    "set_float32_matmul_precision('medium') deviates more than FP32 and less than bf16 operands.",
    phase="bench",
    module=__name__,
    demo_overrides=("runner.ks=[512]",),
)


def summarise(rows, out_dir: Path) -> dict:
    rows, note = records(rows)
    names = labels(rows)
    if not names:
        return summary("gemm_formats", "no records", unmeasurable("by format", "no records"), rows, note=note)
    k = max(int(r["shape.k"]) for r in rows)
    err = by_label(rows, "max_abs", k)
    models = {label: model_of(rows, label) for label in names}
    kinds = {label: kind_of(rows, label) for label in names}
    bits = {label: parse_format(models[label]["input"]).mantissa_bits for label in names}
    order = sorted(names, key=lambda label: (kinds[label] != "emulated", bits[label], label))
    fig, ax = plt.subplots(figsize=(max(7, 0.75 * len(order)), 4.5))
    xs = list(range(len(order)))
    for kind, style in (("emulated", "o"), ("kernel", "s")):
        chosen = [i for i, label in enumerate(order) if (kinds[label] == "emulated") == (kind == "emulated")]
        if chosen:
            errorbar(ax, [xs[i] for i in chosen], [err.get(order[i]) for i in chosen], style, label=kind)
    ax.set_yscale("log")
    ax.set_xticks(xs, [f"{label}\n({models[label]['input']}, {models[label]['scaling']})" for label in order],
                  rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("max |C − C_fp64|")
    ax.set_title(f"GEMM by format: {rows[0]['shape.m']}x{k} @ {k}x{rows[0]['shape.n']} vs FP64 golden\n"
                 "(mean over seeds, bars: range over seeds)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    save_png(fig, out_dir / "gemm_formats.png")

    parts = {}
    # Unscaled formats and MX blocks (per-tensor FP8 and accumulator variants have their own figures).
    family = [label for label in names if kinds[label] == "emulated" and models[label]["scaling"] in ("none", "block")
              and models[label]["order"] == "matmul" and models[label]["accum"] == "fp32"]
    if len({bits[label] for label in family}) >= 3:
        curves = {}
        for label in family:
            for seed, value in err[label].items():
                curves.setdefault(seed, {})[label] = value
        parts["falls with mantissa bits"] = as_check(
            trend_verdict({label: bits[label] for label in family}, curves, "decreasing", what="max |C − C_fp64|", log_x=False,
                          unit="mantissa bit"), "a product of operands rounded to fewer bits errs more")
    for label in names:
        if kinds[label] in ("scaled_mm", "compiled"):
            parts[f"{label} bit for bit"] = bit_identity_verdict(rows, label)
    medium = [label for label in names if kinds[label] == "matmul_precision"]
    fp32 = next((label for label in family if models[label]["input"] == "fp32"), None)
    bf16 = next((label for label in family if models[label]["input"] == "bf16"), None)
    for label in medium:
        if fp32:
            parts[f"{label} above fp32"] = ratio_verdict(ratio_spread(*paired(err[label], err[fp32])), "above", 1.0,
                                                         what=f"{label} / {fp32} max error")
        if bf16:
            parts[f"{label} below bf16 operands"] = ratio_verdict(ratio_spread(*paired(err[label], err[bf16])), "below", 1.0,
                                                                  what=f"{label} / {bf16} max error")
    verdict = combine(parts) if parts else unmeasurable("by format", "too few formats or kernels")
    estimates = {label: replicate_spread(list(err[label].values())) for label in order}
    shares = {label: min(float(r["metrics.bit_identical_to_model"]) for r in rows if r["method"] == label)
              for label in order if kinds[label] != "emulated"}
    caption = (
        f"Max |C − C_fp64| at M={rows[0]['shape.m']}, K={k}, N={rows[0]['shape.n']} (N(0,1) operands in float32), mean over "
        "seeds [spread]: " + ", ".join(f"{label} {estimates[label].text('.2e')}" for label in order)
        + ". Real kernels' outputs bit-identical to their emulation (worst seed): "
        + ", ".join(f"{label} {share:.4%}" for label, share in shares.items())
        + f". {spread_sentence(rows)}"
    )
    return summary("gemm_formats", caption, verdict, rows, parts=parts, note=note, k=k,
                   max_abs={label: mean(err[label]) for label in order},
                   max_abs_interval={label: estimates[label].as_dict() for label in order},
                   bit_identical_to_model_worst=shares)
