"""The study's figures (Figs. 7 and 8) in the figure list. Their curves, fits, plots and verdicts
are computed by numdev.analysis.study (the study's own module); only the claim text lives here."""

from numdev.figures.common import Figure

STUDY_FIGURES = (
    Figure(
        "fig7",
        "Fig. 7 — Flash vs Baseline weights over training",
        "Trained with identical seeds, the Flash and Baseline runs' weights drift apart over training, by max difference and Wasserstein distance, and the gap only grows.",
        phase="study",
        module="numdev.analysis.study",
    ),
    Figure(
        "fig8",
        "Fig. 8 — proxies",
        "Flash's weight deviation grows at a rate comparable to or below a different random initialisation, and 2-5x below FP16-vs-FP32 training.",
        phase="study",
        module="numdev.analysis.study",
    ),
)
