"""numdev-compare's figure (distances.png): the weight distance between two runs over training, one
panel per metric, one line per named comparison (rows as numdev.analysis.compare.compare_runs returns)."""

from __future__ import annotations

from pathlib import Path

from numdev.figures.plotting import plt, save_png
from numdev.runs.layout import MODEL_ROW

PANELS = (
    ("max_abs", "max |Δ| (trained weights)"),
    ("mean_abs", "mean |Δ| (trained weights)"),
    ("w1_over_std", "W1 / std, numel-weighted mean"),
    ("pooled_wasserstein", "pooled W1 (whole model, the paper's)"),
)


def model_curve(rows: list[dict], metric: str) -> tuple[list[int], list[float]]:
    model_rows = [r for r in rows if r["tensor"] == MODEL_ROW]
    return [int(r["step"]) for r in model_rows], [float(r[metric]) for r in model_rows]


def plot_curves(curves: dict[str, list[dict]], path: Path, title: str) -> None:
    """One panel per metric; one line per named comparison (rows as compare_runs returns)."""
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 4))
    for ax, (metric, label) in zip(axes, PANELS):
        for name, rows in curves.items():
            steps, values = model_curve(rows, metric)
            ax.plot(steps, values, "o-", ms=3, label=name)
        ax.set_xlabel("training step")
        ax.set_ylabel(label)
        ax.set_yscale("symlog", linthresh=1e-12)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    save_png(fig, path)
