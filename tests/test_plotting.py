"""Every figure numdev writes is legible where the report shows it (numdev.figures.plotting.legible)."""

from __future__ import annotations

import pytest
from matplotlib.text import Text

from numdev.figures.plotting import DISPLAY_PX, MIN_TEXT_PX, legible, plt, save_png


def _shown_px(fig, dpi: int, points: float) -> float:
    return points * dpi / 72 * min(1.0, DISPLAY_PX / (fig.get_figwidth() * dpi))


@pytest.mark.parametrize("width", [6.0, 16.0, 24.0])  # narrower than the page, and scaled down to it
def test_every_text_of_a_figure_is_at_least_ten_pixels_as_shown(width, tmp_path):
    fig, axes = plt.subplots(1, 3, figsize=(width, 4))
    for ax in axes:
        ax.plot([1, 2, 3], label="a line")
        ax.set_title("a title", fontsize=7)
        ax.legend(fontsize=6)
        ax.text(0.5, 0.5, "a note", fontsize=5)
    ax.set_xlabel("")  # an empty text is left alone
    legible(fig, 120)
    fig.canvas.draw()  # the tick labels as drawn
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_text() and t.get_visible()]
    assert sizes and min(_shown_px(fig, 120, s) for s in sizes) >= MIN_TEXT_PX - 1e-9
    save_png(fig, tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 0


def test_a_legible_figure_is_left_as_it_is():
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.set_title("big", fontsize=20)
    ax.tick_params(labelsize=14)
    assert legible(fig, 120) == 0
    assert ax.title.get_fontsize() == 20
    plt.close(fig)
