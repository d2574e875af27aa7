"""Figures for files, not screens: matplotlib's Agg backend, and PNGs written atomically."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from numdev.runs.atomic import write_bytes  # noqa: E402

__all__ = ["plt", "save_png", "legible", "DISPLAY_PX", "MIN_TEXT_PX"]


DISPLAY_PX = 1068  # the widest a figure is shown: the report's page (1100 CSS px less its padding)
MIN_TEXT_PX = 10  # every label, tick, legend and title at least this tall where the figure is shown


def legible(fig, dpi: int) -> int:
    """Raise every text of `fig` smaller than MIN_TEXT_PX as shown (at most DISPLAY_PX wide, so a wide
    figure is scaled down) to that size; returns how many were raised."""
    from matplotlib.text import Text

    width_px = fig.get_figwidth() * dpi
    px_per_pt = dpi / 72 * min(1.0, DISPLAY_PX / width_px)
    needed = MIN_TEXT_PX / px_per_pt
    raised = 0
    for ax in fig.axes:  # tick labels are remade when drawn: their size is the axis' setting
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            ticks = axis.get_major_ticks()
            if ticks and ticks[0].label1.get_fontsize() < needed:
                ax.tick_params(axis=name, which="both", labelsize=needed)
                raised += 1
    for text in fig.findobj(Text):
        if text.get_text() and text.get_visible() and text.get_fontsize() < needed:
            text.set_fontsize(needed)
            raised += 1
    return raised


def save_png(fig, path: str | Path, dpi: int = 120) -> None:
    """Render `fig` to PNG in memory (every text legible where it is shown: `legible`), write it atomically
    to `path`, close it."""
    legible(fig, dpi)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    write_bytes(path, buffer.getvalue())
