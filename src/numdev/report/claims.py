"""What the papers claim, figure by figure: the text the report sets beside our measurements."""

BENCH_CLAIMS = {
    "fig3": (
        "Fig. 3 — precision sweep",
        "The Flash-vs-Baseline deviation falls as mantissa bits grow (BF16 → FP16 → FP32 → FP64): the deviation is rounding, not a bug.",
    ),
    "fig4": (
        "Fig. 4 — against the FP64 golden value",
        "At BF16, Flash Attention shows about 10x the deviation of Baseline Attention from the FP64 golden value.",
    ),
    "fig5": (
        "Fig. 5 — sequence length",
        "With tile and SRAM size fixed, the deviation grows with sequence length, in max and in mean/std (more tiles, more rescalings).",
    ),
    "fig6": (
        "Fig. 6 — tile shapes",
        "(a) Exchanging B_r and B_c increases the deviation; (b) forcing square tiles has no impact; (c) larger tiles give less deviation.",
    ),
    "fa3_table3": (
        "FlashAttention-3, Table 3 — outlier inputs",
        "RMSE vs FP64 with N(0,1) + N(0,100)·Bernoulli(0.001) inputs: FP16 baseline 3.2e-4, FA2 1.9e-4; "
        "FP8 baseline 2.4e-2, FA3 9.1e-3 (9.3e-3 without block quantisation).",
    ),
}

STUDY_CLAIMS = {
    "fig7": (
        "Fig. 7 — Flash vs Baseline weights over training",
        "Trained with identical seeds, the Flash and Baseline runs' weights drift apart over training, by max difference and Wasserstein distance, and the gap only grows.",
    ),
    "fig8": (
        "Fig. 8 — proxies",
        "Flash's weight deviation grows at a rate comparable to or below a different random initialisation, and 2-5x below FP16-vs-FP32 training.",
    ),
}
