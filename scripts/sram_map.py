"""Phase 1's ~10x as a map: Flash / Baseline by SRAM size and N under the paper's FA1 tile rule.

    .venv/bin/python scripts/sram_map.py                  # runs the sweep, prints JSON
    .venv/bin/python scripts/sram_map.py --write-docs     # also docs/results/sram_map.json, docs/results/sram_map.png
                                                          # and the sram-map block of docs/microbenchmark.md
    .venv/bin/python scripts/sram_map.py --sweep DIR      # summarise an earlier sweep instead of running one

One `numdev-bench -m` sweep (the bench's own loop and records): setting=paper_like (U[0, 1) inputs,
FA1, every stage in bf16, against the paper's Baseline) with the tile rule the paper states for
FlashAttention-1, B_c = ceil(M / 4d) and B_r = min(B_c, d) (tiles.rule=sram), M the SRAM size in
FP32 elements (bytes / 4: 48 KiB, the default shared memory per CUDA block; 100, 164, 192 and 228 KiB,
the largest per SM of Ampere and Hopper parts), head dim 64, N = 1024, 2048, 4096, 5 seeds. Per cell
the ratio of Flash's to the Baseline's max |error| against FP64 (and of the mean |error|), paired by
seed, with its 95% bootstrap interval (numdev.stats.intervals.RULE), the key/value block count
(N / B_c), and whether the interval lies inside the band fig4's verdict reads as the paper's "~10x"
(numdev.stats.verdicts.ABOUT_10X). `setting=paper_like`'s pinned 64 blocks is one chosen cell of this map.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import json
import math
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from numdev.bench.gather import read_sweep  # noqa: E402
from numdev.cli.script_args import ScriptParser, run_script  # noqa: E402
from numdev.report.docblocks import check_blocks, replace_block  # noqa: E402
from numdev.runs.atomic import write_json  # noqa: E402
from numdev.runs.provenance import machine_line  # noqa: E402
from numdev.stats import intervals as stats  # noqa: E402
from numdev.stats.verdicts import ABOUT_10X  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "docs" / "results" / "sram_map.json"
FIGURE = REPO / "docs" / "results" / "sram_map.png"
DOC = REPO / "docs" / "microbenchmark.md"
KIB = (48, 100, 164, 192, 228)
LENGTHS = (1024, 2048, 4096)
SEEDS = "seeds=[0,1,2,3,4]"


def command(outputs: Path) -> list[str]:
    return ["-m", "setting=paper_like", "tiles.rule=sram", "tiles.sram=" + ",".join(str(k * 1024 // 4) for k in KIB),
            "shape.seq_q=" + ",".join(map(str, LENGTHS)), SEEDS, "threads=1", f"output_root={outputs}"]


def run(outputs: Path) -> Path:
    before = set(outputs.glob("bench/*/multirun_*"))
    args = command(outputs)
    print("numdev-bench " + " ".join(args[:-1]), file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "numdev.bench.app", *args], check=True, stdout=subprocess.DEVNULL)
    (new,) = set(outputs.glob("bench/*/multirun_*")) - before
    return new


def summarise(sweep_dir: Path) -> dict:
    sweep = read_sweep(sweep_dir)
    rows = [r for r in sweep.rows if r["kind"] == "vs_golden" and r.get("setting") == "paper_like"]
    per = {}
    for r in rows:
        cell = (int(r["tiles.sram"]), int(r["shape.seq_q"]))
        per.setdefault(cell, {}).setdefault(r["method"], {})[r["seed"]] = r
    cells = []
    for (sram, n), methods in sorted(per.items()):
        flash, base = methods.get("flash", {}), methods.get("baseline", {})
        seeds = sorted(set(flash) & set(base))
        if not seeds:
            continue
        block_c = int(flash[seeds[0]]["knobs.tiles.block_c"])
        cell = {"sram_kib": sram * 4 // 1024, "sram_elements": sram, "n": n, "block_c": block_c, "kv_blocks": math.ceil(n / block_c),
                "seeds": len(seeds)}
        for metric in ("max_abs", "mean_abs"):
            ratio = stats.ratio_spread([flash[s][f"metrics.{metric}"] for s in seeds], [base[s][f"metrics.{metric}"] for s in seeds])
            cell[f"ratio_{metric}"] = ratio.as_dict()
            cell[f"ratio_{metric}_text"] = ratio.text(".2g", "x")
        r = stats.Estimate(**cell["ratio_max_abs"])
        cell["in_band"] = (None if not r.has_interval or r.method == "range"
                           else ABOUT_10X[0] <= r.low and r.high <= ABOUT_10X[1])
        cells.append(cell)
    provenance = sweep.common_provenance() or rows[0].get("provenance")
    return {"provenance": provenance, "sweep": str(sweep_dir), "band": ABOUT_10X, "cells": cells}


def figure(result: dict, path: Path) -> None:
    sizes = sorted({c["sram_kib"] for c in result["cells"]})
    lengths = sorted({c["n"] for c in result["cells"]})
    grid = [[next((c["ratio_max_abs"]["value"] for c in result["cells"] if c["sram_kib"] == s and c["n"] == n), math.nan)
             for s in sizes] for n in lengths]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    image = ax.imshow(grid, cmap="viridis", origin="lower", aspect="auto")
    for i, n in enumerate(lengths):
        for j, s in enumerate(sizes):
            c = next(c for c in result["cells"] if c["sram_kib"] == s and c["n"] == n)
            ax.text(j, i, f"{c['ratio_max_abs']['value']:.2g}x\n{c['kv_blocks']} blocks", ha="center", va="center", fontsize=7,
                    color="white" if c["ratio_max_abs"]["value"] < max(max(row) for row in grid) * 0.6 else "black")
    ax.set_xticks(range(len(sizes)), [f"{s} KiB" for s in sizes])
    ax.set_yticks(range(len(lengths)), [f"N={n}" for n in lengths])
    ax.set_xlabel("SRAM M (FA1 tile rule B_c = ceil(M / 4d), d = 64)")
    ax.set_title("Flash / Baseline max |error| vs FP64, bf16, U[0,1), FA1 (paper-like)", fontsize=9)
    fig.colorbar(image, ax=ax, label="ratio (mean over seeds)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(result: dict) -> str:
    cells = result["cells"]
    band = [c for c in cells if c["in_band"]]
    lines = [f"From [results/sram_map.json](results/sram_map.json) and [results/sram_map.png](results/sram_map.png) "
             f"(`.venv/bin/python scripts/sram_map.py --write-docs`, which runs `.venv/bin/numdev-bench "
             f"{' '.join(command(Path('<outputs>'))[:-1])}`, on {machine_line(result['provenance'])}). Flash / Baseline (the paper's) "
             f"error against FP64, paired by seed, mean over {cells[0]['seeds']} seeds with its {stats.RULE}; 'in the band': the "
             f"max |error| ratio's interval inside [{result['band'][0]:g}x, {result['band'][1]:g}x] (fig4's reading of the paper's ~10x, numdev.stats.verdicts.ABOUT_10X).", "",
             "| SRAM M | N | B_c | key/value blocks | max \\|error\\| ratio | mean \\|error\\| ratio | in the band |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in cells:
        mark = "yes" if c["in_band"] else "no" if c["in_band"] is False else "–"
        lines.append(f"| {c['sram_kib']} KiB | {c['n']} | {c['block_c']} | {c['kv_blocks']} | {c['ratio_max_abs_text']} | "
                     f"{c['ratio_mean_abs_text']} | {mark} |")
    lines += ["", f"{len(band)} of {len(cells)} cells lie in the band"
              + (": " + ", ".join(f"{c['sram_kib']} KiB at N = {c['n']} ({c['kv_blocks']} blocks)" for c in band) if band else "")
              + ". The ratio follows the number of key/value blocks, N / B_c, not N or M alone."]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outputs", type=Path, default=REPO / "outputs", help="where the sweep goes (default outputs/)")
    parser.add_argument("--sweep", type=Path, default=None, help="summarise this earlier sweep instead of running one")
    parser.add_argument("--write-docs", action="store_true", help="write docs/results/sram_map.{json,png} and the docs block")
    args = parser.parse_args(argv)
    if args.write_docs:
        check_blocks((DOC, "sram-map"))
    try:
        sweep_dir = args.sweep if args.sweep is not None else run(args.outputs)
    except subprocess.CalledProcessError as error:  # numdev-bench said why on stderr, in one line
        raise SystemExit(f"sram_map.py: the sweep failed (exit {error.returncode}): see numdev-bench's message above") from None
    try:
        result = summarise(sweep_dir)
    except (OSError, ValueError) as error:  # no such sweep, or records gather refuses (named file and line)
        raise SystemExit(f"sram_map.py: {error}") from None
    if not result["cells"]:
        raise SystemExit(f"sram_map.py: {sweep_dir} holds no paper_like records of Flash and the Baseline")
    if args.write_docs:
        figure(result, FIGURE)
        write_json(RESULT, result)
        replace_block(DOC, "sram-map", markdown(result))
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    run_script(main)
