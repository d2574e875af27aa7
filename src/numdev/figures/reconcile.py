"""Reconciliation: which choice turns "flash is more accurate" (FA2/FA3 authors) into "flash
deviates ~10x more" (this paper)?

A factorial grid at one shape (default N=4096, d=64, bf16): input distribution (normal, uniform,
outliers) x variant (fa1, fa2) x stage formats (the paper preset; the paper preset with exactly
one of score / stats / rescale / prob / accum promoted to fp32; the fa2 preset) x key/value tile
(B_c 16, 64, 256, and FlashAttention-1's SRAM rule with an A100-like M). Every cell's Flash is
compared, seed by seed, with the same Baseline — the paper's, every stage in bf16 — against the
FP64 golden value; the ratio of means over seeds gets a paired 95% bootstrap interval. Real
kernels are placed on the same scale: the cpu_sdpa emulation (fa2 formats, PyTorch's CPU tile
rule) and PyTorch's CPU flash kernel itself.

All cells sharing one seed's inputs run in one process, against one golden value and one
Baseline (one numdev-bench job, not one Hydra job per cell).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from numdev.attention import Baseline, FlashEmulated, SdpaFlash, golden_attention
from numdev.bench.inputs import GENERATORS, Shape
from numdev.bench.metrics import deviation
from numdev.bench.runner import warn_nonfinite
from numdev.figures import Figure
from numdev.figures.common import paired, per_seed, select, split_finite, spread_sentence, summary, unmeasurable
from numdev.numerics import stage_formats
from numdev.plotting import plt, save_png
from numdev.stats import ratio_interval
from numdev.verdicts import HOLDS, combine, range_verdict, ratio_verdict

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
# grid's reference tile, B_c=64 by default).
PAPER_LIKE = {"inputs": "uniform", "variant": "fa1", "formats": "paper"}
FA2_CELL = {"inputs": "uniform", "variant": "fa2", "formats": "fa2"}
ABOUT_10X = (5.0, 20.0)  # "about 10x": within a factor of two of 10


def formats_for(name: str, precision: str):
    """'paper', 'fa2', or a promoted stage ('stats': the paper preset with stats in fp32)."""
    if name in ("paper", "fa2", "cpu_sdpa"):
        return stage_formats(name, precision)
    if name in PROMOTABLE:
        return stage_formats("paper", precision, **{name: "fp32"})
    raise ValueError(f"reconcile: unknown formats {name!r}: use paper, fa2 or one of {', '.join(PROMOTABLE)} (promoted to fp32)")


class Grid:
    """The numdev-bench runner of experiment=reconcile (conf/experiment/reconcile.yaml)."""

    def __init__(self, inputs, variants, formats, block_c, sram: int, block_r: int = 64, kernels: bool = True,
                 reference_block_c: int = 64):
        self.inputs, self.variants, self.formats = list(inputs), list(variants), list(formats)
        self.block_c, self.sram, self.block_r, self.kernels = [int(c) for c in block_c], int(sram), int(block_r), kernels
        # The tile of the cells the sentences and verdict name (the paper-like and the fa2 cell).
        self.reference_block_c = int(reference_block_c)
        if self.reference_block_c not in self.block_c:
            raise ValueError(f"runner.reference_block_c={reference_block_c} must be one of runner.block_c={self.block_c}")
        unknown = [name for name in self.inputs if name not in GENERATORS]
        if unknown:
            raise ValueError(f"runner.inputs: unknown {unknown}: use {', '.join(GENERATORS)}")
        for name in self.formats:
            formats_for(name, "bf16")

    def tiles(self):
        """(label, FlashEmulated tile kwargs): the explicit B_c values, then FA1's SRAM rule."""
        for c in self.block_c:
            yield str(c), {"block_r": self.block_r, "block_c": c, "tile_rule": "explicit"}
        yield f"sram {self.sram}", {"sram": self.sram, "tile_rule": "sram"}

    def __call__(self, cfg, log=print, emit=None) -> list[dict]:
        """The records; `emit(record)` gets each as soon as it is computed (numdev-bench appends it then)."""
        shape = Shape(**cfg.shape)
        precision = str(cfg.numerics.precision)
        causal = bool(cfg.causal)
        common = {"experiment": cfg.get("experiment_name"), "shape": asdict(shape), "causal": causal, "precision": precision,
                  "reference_tiles": str(self.reference_block_c)}
        records = []

        def record(method, seed, cell, out, golden, seconds, knobs):
            metrics = deviation(out, golden)
            warn_nonfinite(f"{method} {cell}", metrics, out.numel(), log)
            records.append({**common, "kind": "vs_golden", "method": method, "seed": seed, "cell": cell,
                            "seconds": seconds, "knobs": knobs, "metrics": metrics})
            if emit is not None:
                emit(records[-1])
            return metrics

        def timed(backend, q, k, v):
            start = time.perf_counter()
            with torch.no_grad():
                out = backend(q, k, v, causal=causal)
            return out, time.perf_counter() - start

        for seed in (int(s) for s in cfg.seeds):
            for name in self.inputs:
                base_formats = stage_formats("paper", precision)
                q, k, v = GENERATORS[name](quantize=True)(shape, seed, base_formats.input)
                golden = golden_attention(q, k, v, causal=causal)
                base = Baseline(base_formats)
                out, seconds = timed(base, q, k, v)
                m = record("baseline", seed, {"inputs": name, "formats": "paper"}, out, golden, seconds, base.describe())
                log(f"seed {seed} {name:>8} baseline (paper, {precision}): max {m['max_abs']:.3e}")
                if self.kernels:
                    for method, backend in (
                        ("cpu_sdpa", FlashEmulated(stage_formats("cpu_sdpa", precision), tile_rule="cpu_sdpa")),
                        ("sdpa_flash", SdpaFlash(dtype=precision)),
                    ):
                        out, seconds = timed(backend, q, k, v)
                        record(method, seed, {"inputs": name}, out, golden, seconds, backend.describe())
                for variant in self.variants:
                    for formats in self.formats:
                        for tile_label, tiles in self.tiles():
                            flash = FlashEmulated(formats_for(formats, precision), variant=variant, **tiles)
                            out, seconds = timed(flash, q, k, v)
                            cell = {"inputs": name, "variant": variant, "formats": formats, "tiles": tile_label}
                            m = record("flash", seed, cell, out, golden, seconds, flash.describe())
                    log(f"seed {seed} {name:>8} {variant}: {len(self.formats) * (len(self.block_c) + 1)} cells done")
        return records


def _cell_key(row) -> tuple:
    return tuple(str(row.get(f"cell.{k}")) for k in ("inputs", "variant", "formats", "tiles"))


def ratios(rows) -> dict:
    """{(method, inputs, variant, formats, tiles): {metric: Estimate}} against the paper Baseline."""
    base = {m: per_seed(select(rows, "vs_golden", "baseline"), lambda r: r["cell.inputs"], m) for m in ("max_abs", "mean_abs")}
    out = {}
    for method in ("flash", "cpu_sdpa", "sdpa_flash"):
        chosen = select(rows, "vs_golden", method)
        by = {m: per_seed(chosen, lambda r, method=method: (method, *_cell_key(r)), m) for m in ("max_abs", "mean_abs")}
        for key in by["max_abs"]:
            inputs = key[1]
            if inputs not in base["max_abs"]:
                continue
            out[key] = {m: ratio_interval(*paired(by[m][key], base[m][inputs])) for m in ("max_abs", "mean_abs")}
    return out


def _key(method="flash", **cell) -> tuple:
    return (method, *(str(cell.get(k)) for k in ("inputs", "variant", "formats", "tiles")))


def _overlap(a, b) -> bool:
    """Whether two estimates' intervals overlap (False when either has none: nothing to compare)."""
    return a.has_interval and b.has_interval and a.low <= b.high and b.low <= a.high


def _x(estimate) -> str:
    if estimate.has_interval:
        return f"{estimate.value:.3g}x [{estimate.low:.3g}, {estimate.high:.3g}]"
    return f"{estimate.value:.3g}x"


def sentences(r: dict, tile: str = "64") -> tuple[dict, str, str, str]:
    """The three findings, each one sentence, plus the verdict parts behind them."""
    paper_cell, fa2_cell = {**PAPER_LIKE, "tiles": tile}, {**FA2_CELL, "tiles": tile}
    parts = {}
    paper = r.get(_key(**paper_cell))
    if paper is None:
        s1 = f"The paper-like cell (uniform inputs, fa1, paper preset, B_c={tile}) is not in this grid."
    else:
        others = [f"{inp} {r[_key(**{**paper_cell, 'inputs': inp})]['max_abs'].value:.2g}x"
                  for inp in ("normal", "outliers") if _key(**{**paper_cell, "inputs": inp}) in r]
        top = max((k for k in r if k[0] == "flash"), key=lambda k: r[k]["max_abs"].value)
        parts["paper-like cell ~10x"] = range_verdict(paper["max_abs"], *ABOUT_10X, what="paper-like flash/baseline max |Δ|")
        about = "the paper's ~10x" if parts["paper-like cell ~10x"].status == HOLDS else "not the paper's ~10x at this N"
        s1 = (f"The paper-like cell (U[0,1) inputs, FA1, every stage in bf16, B_c={tile}) gives flash/baseline "
              f"{_x(paper['max_abs'])} by max |Δ| and {_x(paper['mean_abs'])} by mean |Δ| ({about})"
              + (f"; the same cell gives {', '.join(others)} with the other inputs" if others else "")
              + f"; the largest cell is {'/'.join(top[1:])} at {r[top]['max_abs'].value:.3g}x.")
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
    kernels = [(label, r[key]) for label, key in (
        (f"fa2 emulation (FA2, fa2 preset, B_c={tile})", _key(**fa2_cell)),
        ("cpu_sdpa emulation", ("cpu_sdpa", "uniform", "None", "None", "None")),
        ("PyTorch's CPU flash kernel", ("sdpa_flash", "uniform", "None", "None", "None")),
    ) if key in r]
    if kernels:
        s3 = ("Real kernels sit below the bf16 Baseline on the same U[0,1) inputs: "
              + "; ".join(f"{label} {_x(e['max_abs'])} by max, {e['mean_abs'].value:.2g}x by mean" for label, e in kernels) + ".")
        for label, e in kernels:
            parts[f"{label} below 1"] = ratio_verdict(e["max_abs"], "below", 1.0, what=f"{label} flash/baseline max |Δ|")
    else:
        s3 = "No real-kernel cell is in this grid."
    return parts, s1, s2, s3


def summarise(rows, out_dir: Path) -> dict:
    rows, note = split_finite(rows)
    r = ratios(rows)
    parts, s1, s2, s3 = sentences(r, next(iter({str(x.get("reference_tiles", "64")) for x in rows}), "64"))
    inputs = [i for i in ("normal", "uniform", "outliers") if any(k[1] == i for k in r)]
    row_labels = sorted({(k[2], k[3]) for k in r if k[0] == "flash"},
                        key=lambda vf: (vf[0], ["paper", *PROMOTABLE, "fa2"].index(vf[1]) if vf[1] in ["paper", *PROMOTABLE, "fa2"] else 99))
    tiles = sorted({k[4] for k in r if k[0] == "flash"}, key=lambda t: (not t.isdigit(), int(t) if t.isdigit() else 0))
    width = max(1, len(inputs))
    fig, axes = plt.subplots(1, width, figsize=(4.6 * width + 2.5, 0.36 * len(row_labels) + 4.2), squeeze=False, sharey=True)
    image = None
    for ax, inp in zip(axes[0], inputs):
        grid = np.full((len(row_labels), len(tiles)), np.nan)
        for i, (variant, formats) in enumerate(row_labels):
            for j, tile in enumerate(tiles):
                e = r.get(("flash", inp, variant, formats, tile))
                if e is not None:
                    grid[i, j] = e["max_abs"].value
                    ax.text(j, i, f"{e['max_abs'].value:.2g}/{e['mean_abs'].value:.2g}", ha="center", va="center", fontsize=7)
        image = ax.imshow(np.log10(grid), cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
        ax.set_xticks(range(len(tiles)), [f"B_c {t}" if t.isdigit() else "FA1 SRAM\n" + t.replace("sram ", "M=") for t in tiles], fontsize=8)
        kern = [f"{m} {r[(m, inp, 'None', 'None', 'None')]['max_abs'].value:.2g}x" for m in ("cpu_sdpa", "sdpa_flash")
                if (m, inp, "None", "None", "None") in r]
        ax.set_title(f"{inp} inputs\n" + ("real kernels: " + ", ".join(kern) if kern else ""), fontsize=9)
    axes[0][0].set_yticks(range(len(row_labels)), [f"{v} {f if f in ('paper', 'fa2') else 'paper, ' + f + ' fp32'}" for v, f in row_labels], fontsize=8)
    if image is not None:
        fig.colorbar(image, cax=fig.add_axes([0.875, 0.3, 0.012, 0.55]), label="log10 flash/baseline max |Δ| vs FP64")
    n = next(iter({int(x["shape.seq_q"]) for x in rows}), "?")
    fig.suptitle(f"Reconciliation at N={n}, bf16: flash / bf16-baseline deviation from FP64 (cell: max/mean |Δ| ratio, mean over seeds)", fontsize=10)
    fig.text(0.01, 0.005, "\n".join(_wrap(f"{i}. {s}", 190) for i, s in enumerate((s1, s2, s3), start=1)), fontsize=7.5, va="bottom")
    fig.subplots_adjust(bottom=0.22, top=0.88, left=0.12, right=0.86, wspace=0.08)
    save_png(fig, out_dir / "reconcile.png")
    verdict = combine(parts) if parts else unmeasurable("the paper-like cell and the real kernels", "not in this grid")
    table = ["| inputs | variant | formats | tiles | max ratio [95%] | mean ratio [95%] |", "|---|---|---|---|---|---|"]
    for key in sorted(r):
        table.append(f"| {key[1]} | {key[2] if key[0] == 'flash' else key[0]} | {key[3] if key[0] == 'flash' else '-'} | "
                     f"{key[4] if key[0] == 'flash' else '-'} | {_x(r[key]['max_abs'])} | {_x(r[key]['mean_abs'])} |")
    caption = f"{s1} {s2} {s3} Baseline: every stage in bf16. {spread_sentence(select(rows, 'vs_golden', 'baseline'))}"
    return summary("reconcile", caption, verdict, rows, parts=parts, note=note, sentences=[s1, s2, s3], table="\n".join(table),
                   ratio={"/".join(k): {m: e.as_dict() for m, e in v.items()} for k, v in r.items()}, seq_q=n)


def _wrap(text: str, width: int = 170) -> str:
    words, lines, line = text.split(), [], ""
    for w in words:
        if len(line) + len(w) + 1 > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    return "\n".join([*lines, line])

