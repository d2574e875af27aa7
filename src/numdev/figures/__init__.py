"""The paper's figures: one module per figure, holding its aggregation, plot, claim and verdict
rule together, and this one list of them that every caller imports (numdev-bench's sweep
callback, numdev-figure, numdev-demo, numdev-report, the Makefile's bench-figures target via
`numdev-figure --list`, scripts/bench_emulator.py).

A bench figure `NAME` is made by `numdev-bench experiment=NAME` (conf/bench/experiment/NAME.yaml) and
drawn by `numdev.figures.NAME.summarise(rows, out_dir)`, which returns its caption, numbers,
verdict (numdev.stats.verdicts, by a stated rule) and provenance. Study figures (Figs. 7 and 8) are made
by `numdev-train experiment=flash_stability`: their numbers and verdicts come from numdev.analysis.study,
their claims and drawings from numdev.figures.study.
"""

from __future__ import annotations

from importlib import import_module

from numdev.figures.common import Figure

# The one list of figures, in report order. Each bench module defines FIGURE.
_BENCH_MODULES = ("fig3", "fig4", "fig5", "fig6", "fa3_table3", "reconcile", "bias", "gemm_formats", "gemm_k", "gemm_scaling")


def _load() -> dict[str, Figure]:
    from numdev.figures.study import STUDY_FIGURES

    figures = [import_module(f"numdev.figures.{name}").FIGURE for name in _BENCH_MODULES]
    return {f.name: f for f in [*figures, *STUDY_FIGURES]}


FIGURES: dict[str, Figure] = _load()
BENCH_FIGURES: tuple[str, ...] = tuple(name for name, f in FIGURES.items() if f.phase == "bench")
STUDY_FIGURE_NAMES: tuple[str, ...] = tuple(name for name, f in FIGURES.items() if f.phase == "study")


def get(name: str) -> Figure:
    if name not in FIGURES:
        raise ValueError(f"unknown figure {name!r}: use one of {', '.join(FIGURES)}")
    return FIGURES[name]
