"""Figures for files, not screens: matplotlib's Agg backend, and PNGs written atomically."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from numdev.runs.atomic import write_bytes  # noqa: E402

__all__ = ["plt", "save_png"]


def save_png(fig, path: str | Path, dpi: int = 120) -> None:
    """Render `fig` to PNG in memory, write it atomically to `path`, close it."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    write_bytes(path, buffer.getvalue())
