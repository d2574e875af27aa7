"""Reconciliation: which choice turns "flash is more accurate" (FA2/FA3 authors) into "flash
deviates ~10x more" (this paper)?

A factorial grid at one shape (default N=4096, d=64, bf16): input distribution (normal, uniform,
outliers) x variant (fa1, fa2) x stage formats (the paper preset; the paper preset with exactly
one of score / stats / rescale / prob / accum promoted to fp32; the fa2 preset) x the number of
key/value blocks (16, 64, 256: B_c = ceil(N / blocks), and FlashAttention-1's SRAM rule with an
A100-like M). Every cell's Flash is compared, seed by seed, with the paper's Baseline (every stage
in bf16) against the FP64 golden value; the ratio of means over seeds gets a paired spread (95%
bootstrap from 5 seeds, else the range over seeds). Real kernels — the fa2 emulation, the cpu_sdpa
emulation (fa2 formats, PyTorch's CPU tile rule) and PyTorch's CPU flash kernel — are placed on the
same scale against both Baselines: the paper's, and eager PyTorch's (numerics preset eager: softmax
in FP32 inside, P rounded once), the Baseline they really replace.

The central figure (reconcile.png) is the ratio against the number of key/value blocks, one panel
per input distribution, one line per variant and stage formats; reconcile_grid.png is the whole
grid as a table of colours.

All cells sharing one seed's inputs run in one process, against one golden value and one pair of
Baselines (one numdev-bench job, not one Hydra job per cell).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from numdev.figures.common import (
    BASELINES,
    Figure,
    paired,
    per_seed,
    select,
    split_finite,
    spread_sentence,
    summary,
    unmeasurable,
)
from numdev.figures.plotting import plt, save_png
from numdev.stats.intervals import RANGE, ratio_spread
from numdev.stats.verdicts import (
    ABOUT_10X,
    HOLDS,
    RANGE_NO_VERDICT,
    about_verdict,
    combine,
    judgeable,
    ratio_verdict,
    trend_verdict,
)

FIGURE = Figure(
    "reconcile",
    "Reconciliation — where the paper's ~10x comes from",
    "The paper reports ~10x (Flash vs Baseline against FP64, BF16); FA2/FA3's authors report Flash more accurate "
    "than a low-precision Baseline. Which inputs, variant, stage formats and tiles give which?",
    phase="bench",
    module=__name__,
    demo_overrides=("shape.seq_q=2048",),
)
PROMOTABLE = ("score", "stats", "rescale", "prob", "accum")
# The paper-like cell and the real-kernel cell the sentences and the verdict are about (at the
# grid's reference number of key/value blocks, 64 by default: N=4096 with B_c=64).
PAPER_LIKE = {"inputs": "uniform", "variant": "fa1", "formats": "paper"}
FA2_CELL = {"inputs": "uniform", "variant": "fa2", "formats": "fa2"}
KERNELS = ("cpu_sdpa", "sdpa_flash")


def _cell_key(row) -> tuple:
    return tuple(str(row.get(f"cell.{k}")) for k in ("inputs", "variant", "formats", "tiles"))


def ratios(rows, baseline: str = "baseline") -> dict:
    """{(method, inputs, variant, formats, tiles): {metric: Estimate}} against one Baseline
    ('baseline': the paper's, every stage in bf16; 'baseline_eager': eager PyTorch's)."""
    base = {m: per_seed(select(rows, "vs_golden", baseline), lambda r: r["cell.inputs"], m) for m in ("max_abs", "mean_abs")}
    out = {}
    for method in ("flash", *KERNELS):
        chosen = select(rows, "vs_golden", method)
        by = {m: per_seed(chosen, lambda r, method=method: (method, *_cell_key(r)), m) for m in ("max_abs", "mean_abs")}
        for key in by["max_abs"]:
            inputs = key[1]
            if inputs not in base["max_abs"]:
                continue
            out[key] = {m: ratio_spread(*paired(by[m][key], base[m][inputs])) for m in ("max_abs", "mean_abs")}
    return out


def per_seed_ratios(rows, baseline: str = "baseline") -> dict:
    """{(method, inputs, variant, formats, tiles): {seed: flash/baseline max |Δ|}}: one value per seed."""
    base = per_seed(select(rows, "vs_golden", baseline), lambda r: r["cell.inputs"], "max_abs")
    flash = per_seed(select(rows, "vs_golden", "flash"), lambda r: ("flash", *_cell_key(r)), "max_abs")
    return {key: {s: v / base[key[1]][s] for s, v in by.items() if s in base.get(key[1], {}) and base[key[1]][s] > 0}
            for key, by in flash.items()}


def kv_blocks_of(rows) -> dict:
    """{tiles label: key/value blocks run} from the flash records."""
    return {str(r.get("cell.tiles")): int(r["cell.kv_blocks"]) for r in rows
            if r.get("method") == "flash" and r.get("cell.kv_blocks") not in (None, "None")}


def _key(method="flash", **cell) -> tuple:
    return (method, *(str(cell.get(k)) for k in ("inputs", "variant", "formats", "tiles")))


def _overlap(a, b) -> bool:
    """Whether two estimates' intervals overlap (False when either has none: nothing to compare)."""
    return a.has_interval and b.has_interval and a.low <= b.high and b.low <= a.high


def _ranged(*estimates) -> bool:
    """Whether any of the estimates is a range from fewer than 5 replicates (which carries no verdict)."""
    return any(e.method == RANGE and e.has_interval for e in estimates)


def _x(estimate) -> str:
    if estimate.has_interval:
        label = f"range of {estimate.n}: " if estimate.method == "range" else ""
        return f"{estimate.value:.3g}x [{label}{estimate.low:.3g}, {estimate.high:.3g}]"
    return f"{estimate.value:.3g}x"


def _tile_order(tiles, blocks) -> list:
    """Tile labels by the number of key/value blocks they run (few to many)."""
    return sorted(tiles, key=lambda t: (blocks.get(t, 0), t))


def sentences(r: dict, tile: str = "64", blocks: dict | None = None, seed_ratios: dict | None = None,
              eager: dict | None = None) -> tuple[dict, str, str, str, str]:
    """The findings, one sentence each, plus the verdict parts behind them:
    s1 the paper-like cell and how the ratio follows the number of key/value blocks; s2 which single
    stage's promotion lowers it most; s3 the real kernels against both Baselines; s4 the factors the
    grid supports. `r`: ratios against the paper's Baseline; `eager`: against eager PyTorch's."""
    blocks = blocks or {}
    paper_cell, fa2_cell = {**PAPER_LIKE, "tiles": tile}, {**FA2_CELL, "tiles": tile}
    parts = {}
    paper = r.get(_key(**paper_cell))
    n_blocks = blocks.get(tile, tile)
    if paper is None:
        s1 = f"The paper-like cell (uniform inputs, fa1, paper preset, {n_blocks} key/value blocks) is not in this grid."
    else:
        others = [f"{inp} {r[_key(**{**paper_cell, 'inputs': inp})]['max_abs'].value:.2g}x"
                  for inp in ("normal", "outliers") if _key(**{**paper_cell, "inputs": inp}) in r]
        parts["paper-like cell ~10x"] = about_verdict(paper["max_abs"], ABOUT_10X, what="paper-like flash/baseline max |Δ|")
        band = f"[{ABOUT_10X[0]:g}, {ABOUT_10X[1]:g}]"
        if parts["paper-like cell ~10x"].status == HOLDS:
            about = f"about 10x: within the stated band {band}"
        elif not judgeable(paper["max_abs"]):  # a range, or no interval: nothing said about the band
            about = f"no verdict on the stated band {band}: " + (RANGE_NO_VERDICT if _ranged(paper["max_abs"]) else "no interval")
        else:
            about = f"not about 10x: outside the stated band {band}"
        tiles = _tile_order({k[4] for k in r if k[0] == "flash" and k[1:4] == ("uniform", "fa1", "paper")}, blocks)
        follow = ", ".join(f"{blocks.get(t, t)}{' (FA1 SRAM rule)' if t.startswith('sram') else ''} -> "
                           f"{r[_key(**{**paper_cell, 'tiles': t})]['max_abs'].value:.3g}x" for t in tiles)
        s1 = (f"The paper-like cell (U[0,1) inputs, FA1, every stage in bf16, {n_blocks} key/value blocks) gives flash/baseline "
              f"{_x(paper['max_abs'])} by max |Δ| and {_x(paper['mean_abs'])} by mean |Δ| against the paper's Baseline ({about})"
              + (f"; the same cell gives {', '.join(others)} with the other inputs" if others else "")
              + f". The ratio follows the number of key/value blocks (blocks -> ratio by max): {follow}.")
        curve = {t: (seed_ratios or {}).get(_key(**{**paper_cell, "tiles": t})) for t in tiles}
        if seed_ratios and all(curve.values()):
            by_seed = {}
            for t, by in curve.items():
                for seed, value in by.items():
                    by_seed.setdefault(seed, {})[t] = value
            parts["paper-like ratio grows with key/value blocks"] = trend_verdict(
                {t: blocks.get(t, 0) for t in tiles}, by_seed, "increasing", what="paper-like flash/baseline max |Δ|")
    promoted = {s: r[_key(**{**paper_cell, "formats": s})] for s in PROMOTABLE if _key(**{**paper_cell, "formats": s}) in r}
    if promoted and paper is not None:
        ranked = sorted(promoted, key=lambda s: promoted[s]["mean_abs"].value)
        best = ranked[0]
        # Stages whose interval by mean overlaps the best one's are not told apart from it by these seeds.
        tied = [s for s in ranked[1:] if _overlap(promoted[s]["mean_abs"], promoted[best]["mean_abs"])]
        all_fp32 = r.get(_key(**{**paper_cell, "formats": "fa2"}))
        rest = ", ".join(f"{s} {_x(promoted[s]['mean_abs']) if s in tied else format(promoted[s]['mean_abs'].value, '.2g') + 'x'}"
                         for s in ranked[1:])
        tie = (f", though {' and '.join(tied)} {'is' if len(tied) == 1 else 'are'} not told apart from it "
               "(overlapping intervals by mean)") if tied else ""
        s2 = (f"Promoting one stage to fp32 in that cell, {best} lowers it most{tie}: to {_x(promoted[best]['max_abs'])} by max, "
              f"{_x(promoted[best]['mean_abs'])} by mean" + (f" (then {rest}, by mean)" if rest else "")
              + ("" if promoted[best]["mean_abs"].value < 1.5 else "; no single stage removes it")
              + (f"; FA1 with the fa2 formats (score, stats, rescale and accum all fp32) gives {_x(all_fp32['mean_abs'])} by mean."
                 if all_fp32 is not None else "."))
    else:
        s2 = "No single-stage promotion of the paper-like cell is in this grid."
    kernels = [(label, key) for label, key in (
        (f"fa2 emulation (FA2, fa2 preset, {n_blocks} blocks)", _key(**fa2_cell)),
        ("cpu_sdpa emulation", ("cpu_sdpa", "uniform", "None", "None", "None")),
        ("PyTorch's CPU flash kernel", ("sdpa_flash", "uniform", "None", "None", "None")),
    ) if key in r]
    if kernels:
        against = []
        if eager:
            against.append("against eager PyTorch's Baseline (softmax in FP32 inside, P rounded once: the Baseline they replace) "
                           + "; ".join(f"{label} {_x(eager[key]['max_abs'])} by max, {eager[key]['mean_abs'].value:.2g}x by mean"
                                       for label, key in kernels if key in eager))
            # Kernels whose numbers agree (the cpu_sdpa model gives the CPU kernel's bits on all but ~1e-6 of outputs)
            # are one piece of evidence, judged once under both names, not two parts that hold together.
            groups: list[list] = []
            for label, key in kernels:
                if key in eager:
                    group = next((g for g in groups if _agree(eager[g[0][1]], eager[key])), None)
                    (group.append((label, key)) if group is not None else groups.append([(label, key)]))
            for group in groups:
                label = " = ".join(lbl for lbl, _ in group) + (" (the same numbers to 1e-3: one piece of evidence)" if len(group) > 1 else "")
                parts[f"{label} below eager PyTorch's Baseline"] = ratio_verdict(
                    eager[group[0][1]]["max_abs"], "below", 1.0, what=f"{group[0][0]} flash/eager-baseline max |Δ|")
        against.append("against the paper's Baseline " + "; ".join(
            f"{label} {_x(r[key]['max_abs'])} by max, {r[key]['mean_abs'].value:.2g}x by mean" for label, key in kernels))
        s3 = "Real kernels on the same U[0,1) inputs: " + "; and ".join(against) + "."
    else:
        s3 = "No real-kernel cell is in this grid."
    return parts, s1, s2, s3, factors(r, blocks)


SAME_NUMBERS = 1e-3  # two cells whose max and mean |Δ| ratios agree to this relative tolerance are one piece of evidence


def _agree(a: dict, b: dict) -> bool:
    return all(abs(a[m].value - b[m].value) <= SAME_NUMBERS * abs(b[m].value) for m in ("max_abs", "mean_abs"))


def factors(r: dict, blocks: dict) -> str:
    """The factors the grid supports, read off the grid at its most key/value blocks (by max |Δ|)."""
    explicit = [t for t in {k[4] for k in r if k[0] == "flash"} if not t.startswith("sram")]
    if not explicit:
        return "No cells with a pinned number of key/value blocks are in this grid."
    most = _tile_order(explicit, blocks)[-1]
    fewest = _tile_order(explicit, blocks)[0]

    def ratio(inputs="uniform", variant="fa1", formats="paper", tiles=most):
        e = r.get(_key(inputs=inputs, variant=variant, formats=formats, tiles=tiles))
        return e["max_abs"] if e else None

    said = []
    inputs = {i: ratio(i) for i in ("uniform", "normal", "outliers") if ratio(i) is not None}
    if len(inputs) > 1:
        top = max(inputs, key=lambda i: inputs[i].value)
        lead = "all-positive inputs" if top == "uniform" else f"{top} inputs"
        said.append(f"{lead} (FA1, paper formats: " + ", ".join(f"{i} {e.value:.2g}x" for i, e in inputs.items()) + ")")
    if ratio(tiles=fewest) is not None and fewest != most:
        said.append(f"the number of key/value blocks (uniform, FA1, paper formats: {blocks.get(fewest, fewest)} blocks "
                    f"{ratio(tiles=fewest).value:.2g}x, {blocks.get(most, most)} blocks {ratio().value:.2g}x)")
    stage_notes = []
    for variant in ("fa1", "fa2"):
        cells = {f: ratio(variant=variant, formats=f) for f in ("paper", "accum", "stats", "fa2")}
        if any(e is None for e in cells.values()):
            continue
        # Read off intervals only: a range from fewer than 5 seeds says none of it (RANGE_NO_VERDICT).
        removes = [f for f in ("accum", "stats") if judgeable(cells[f]) and cells[f].high < 1]
        keeps = [f for f in ("accum", "stats") if judgeable(cells[f]) and cells[f].low > 1]
        if len(keeps) == 2 and judgeable(cells["fa2"]) and cells["fa2"].high < 1:
            reading = "either bf16 stage alone keeps Flash above the Baseline; only both in fp32 bring it below"
        elif removes:
            reading = f"promoting {' or '.join(removes)} alone brings it below 1"
        elif _ranged(cells["accum"], cells["stats"], cells["fa2"]):
            reading = f"nothing read off their spreads: {RANGE_NO_VERDICT}"
        else:
            reading = "the promotions are not told apart from 1 by these seeds"
        stage_notes.append(f"{variant.upper()} paper formats {cells['paper'].value:.3g}x, accumulator alone in fp32 "
                           f"{cells['accum'].value:.3g}x, statistics alone in fp32 {cells['stats'].value:.3g}x, both (fa2 formats) "
                           f"{cells['fa2'].value:.3g}x: {reading}")
    if stage_notes:
        said.append("bf16 statistics or accumulator (uniform, " + f"{blocks.get(most, most)} blocks: " + "; ".join(stage_notes) + ")")
    fa2_paper, fa1_paper = ratio(variant="fa2"), ratio()
    if fa2_paper is not None and fa1_paper is not None:
        needed = ("FA1 is not needed" if judgeable(fa2_paper) and fa2_paper.low > 1
                  else f"nothing read off its spread: {RANGE_NO_VERDICT}" if _ranged(fa2_paper) else "FA2 is not told apart from 1")
        said.append(f"and not the variant alone (FA2 with the paper formats {fa2_paper.value:.3g}x beside FA1's "
                    f"{fa1_paper.value:.3g}x: {needed})")
    return "What the grid supports, by max |Δ| against the paper's Baseline: " + "; ".join(said) + "."


def summarise(rows, out_dir: Path) -> dict:
    rows, note = split_finite(rows)
    r = ratios(rows)
    r_eager = ratios(rows, "baseline_eager") if select(rows, "vs_golden", "baseline_eager") else {}
    blocks = kv_blocks_of(rows)
    reference = next(iter({str(x.get("reference_tiles", "64")) for x in rows}), "64")
    parts, s1, s2, s3, s4 = sentences(r, reference, blocks, per_seed_ratios(rows), r_eager)
    n = next(iter({int(x["shape.seq_q"]) for x in rows}), "?")
    _draw_lines(r, r_eager, blocks, n, out_dir)
    _draw_grid(r, blocks, n, (s1, s4, s2, s3), out_dir)
    verdict = combine(parts) if parts else unmeasurable("the paper-like cell and the real kernels", "not in this grid")
    table = ["| inputs | variant | formats | key/value blocks | max ratio [spread] | mean ratio [spread] |", "|---|---|---|---|---|---|"]
    deciding = []  # the table rows the verdict reads: the paper-like cell over the blocks, the real kernels
    for i, key in enumerate(sorted(r)):
        if key[0] != "flash" or (key[1], key[2], key[3]) == ("uniform", "fa1", "paper"):
            deciding.append(i)
        table.append(f"| {key[1]} | {key[2] if key[0] == 'flash' else key[0]} | {key[3] if key[0] == 'flash' else '-'} | "
                     f"{blocks.get(key[4], '-') if key[0] == 'flash' else '-'} | {_x(r[key]['max_abs'])} | {_x(r[key]['mean_abs'])} |")
    caption = (f"{s1} {s4} {s2} {s3} Grid cells divide by {BASELINES['paper']}; real kernels by both Baselines. "
               f"{spread_sentence(select(rows, 'vs_golden', 'baseline'))}")
    return summary("reconcile", caption, verdict, rows, parts=parts, note=note, sentences=[s1, s4, s2, s3], table="\n".join(table), deciding_rows=deciding,
                   ratio={"/".join(k): {m: e.as_dict() for m, e in v.items()} for k, v in r.items()},
                   ratio_vs_eager={"/".join(k): {m: e.as_dict() for m, e in v.items()} for k, v in r_eager.items()},
                   kv_blocks=blocks, seq_q=n)


STYLES = {"paper": "-", "stats": "--", "accum": ":", "fa2": "-."}


def _draw_lines(r, r_eager, blocks, n, out_dir: Path) -> None:
    """The central figure: flash/baseline max |Δ| against the number of key/value blocks."""
    inputs = [i for i in ("uniform", "normal", "outliers") if any(k[1] == i for k in r)]
    fig, axes = plt.subplots(1, max(1, len(inputs)), figsize=(5.2 * max(1, len(inputs)), 4.6), squeeze=False, sharey=True)
    for ax, inp in zip(axes[0], inputs):
        ax.axhspan(*ABOUT_10X, color="0.85", label=f"'about 10x' band [{ABOUT_10X[0]:g}, {ABOUT_10X[1]:g}]")
        ax.axhline(1.0, color="k", lw=0.8)
        for i, variant in enumerate(("fa1", "fa2")):
            for formats, style in STYLES.items():
                tiles = _tile_order([k[4] for k in r if k[0] == "flash" and k[1:4] == (inp, variant, formats)], blocks)
                if not tiles:
                    continue
                xs = [blocks.get(t, math.nan) for t in tiles]
                est = [r[("flash", inp, variant, formats, t)]["max_abs"] for t in tiles]
                ys = [e.value for e in est]
                low = [e.value - e.low if e.has_interval else 0 for e in est]
                high = [e.high - e.value if e.has_interval else 0 for e in est]
                label = f"{variant}, " + ("paper formats" if formats == "paper" else "fa2 formats" if formats == "fa2" else f"{formats} in fp32")
                ax.errorbar(xs, ys, yerr=[low, high], fmt="o" + style, color=f"C{i}", capsize=2, ms=3, label=label)
        for j, m in enumerate(KERNELS):
            key = (m, inp, "None", "None", "None")
            if key in r_eager:
                ax.axhline(r_eager[key]["max_abs"].value, color=f"C{j + 2}", ls=(0, (4, 2)), lw=1,
                           label=f"{'PyTorch CPU kernel' if m == 'sdpa_flash' else 'cpu_sdpa emulation'} / eager baseline")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("key/value blocks (N / B_c: rescalings)")
        ax.set_title(f"{inp} inputs", fontsize=12)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("flash / paper-baseline max |Δ| vs FP64")
    # Drawn ~16 in wide, shown at a report's page width (~0.6x): legend and titles large enough to read there.
    axes[0][-1].legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"Reconciliation at N={n}, bf16: the ratio follows the number of key/value blocks\n"
                 "(mean over seeds; bars: spread; grid lines divide by the paper's Baseline, kernel lines by eager PyTorch's)",
                 fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.91))
    save_png(fig, out_dir / "reconcile.png")


def _draw_grid(r, blocks, n, texts, out_dir: Path) -> None:
    """The whole grid as colours: reconcile_grid.png."""
    inputs = [i for i in ("normal", "uniform", "outliers") if any(k[1] == i for k in r)]
    order = ["paper", *PROMOTABLE, "fa2"]
    row_labels = sorted({(k[2], k[3]) for k in r if k[0] == "flash"},
                        key=lambda vf: (vf[0], order.index(vf[1]) if vf[1] in order else 99))
    tiles = _tile_order({k[4] for k in r if k[0] == "flash"}, blocks)
    width = max(1, len(inputs))
    fig, axes = plt.subplots(1, width, figsize=(4.6 * width + 2.5, 0.44 * len(row_labels) + 4.6), squeeze=False, sharey=True)
    image = None
    for ax, inp in zip(axes[0], inputs):
        grid = np.full((len(row_labels), len(tiles)), np.nan)
        for i, (variant, formats) in enumerate(row_labels):
            for j, tile in enumerate(tiles):
                e = r.get(("flash", inp, variant, formats, tile))
                if e is not None:
                    grid[i, j] = e["max_abs"].value
                    dark = abs(math.log10(e["max_abs"].value)) > 0.55 if e["max_abs"].value > 0 else False  # deep red or blue
                    ax.text(j, i, f"{e['max_abs'].value:.2g}/{e['mean_abs'].value:.2g}", ha="center", va="center",
                            fontsize=9, color="white" if dark else "black")
        image = ax.imshow(np.log10(grid), cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
        ax.set_xticks(range(len(tiles)), [f"{blocks.get(t, '?')} blocks" + ("\n(FA1 SRAM)" if t.startswith("sram") else "")
                                          for t in tiles], fontsize=10)
        ax.set_title(f"{inp} inputs", fontsize=11)
    axes[0][0].set_yticks(range(len(row_labels)), [f"{v} {f if f in ('paper', 'fa2') else 'paper, ' + f + ' fp32'}" for v, f in row_labels], fontsize=10)
    if image is not None:
        fig.colorbar(image, cax=fig.add_axes([0.875, 0.3, 0.012, 0.55]), label="log10 flash/paper-baseline max |Δ| vs FP64")
    fig.suptitle(f"Reconciliation grid at N={n}, bf16: flash / paper-baseline deviation from FP64 (cell: max/mean |Δ| ratio, mean over seeds)", fontsize=10)
    fig.text(0.01, 0.005, "\n".join(_wrap(f"{i}. {s}", 190) for i, s in enumerate(texts, start=1)), fontsize=8.5, va="bottom")
    fig.subplots_adjust(bottom=0.3, top=0.88, left=0.12, right=0.86, wspace=0.08)
    save_png(fig, out_dir / "reconcile_grid.png")


def _wrap(text: str, width: int = 170) -> str:
    words, lines, line = text.split(), [], ""
    for w in words:
        if len(line) + len(w) + 1 > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    return "\n".join([*lines, line])
