"""What the papers claim, figure by figure: the text the report sets beside our measurements.

The claims live with their figures (numdev.figures.<name>.FIGURE, numdev.figures.study for
Figs. 7 and 8); these two tables are views of that one list, kept for existing imports.
"""

from numdev.figures import FIGURES

BENCH_CLAIMS = {name: (f.title, f.claim) for name, f in FIGURES.items() if f.phase == "bench"}
STUDY_CLAIMS = {name: (f.title, f.claim) for name, f in FIGURES.items() if f.phase == "study"}
