"""A figure of generated samples, each above its caption (and, for shapes captions, what was seen)."""

from __future__ import annotations

import math
import textwrap

import torch

from numdev.figures.plotting import plt

CAPTION_CHARS, CAPTION_LINES = 120, 5  # what a grid cell shows of a caption


def sample_figure(images: torch.Tensor, captions: list[str], title: str, seen: list[dict] | None = None, columns: int = 6):
    """images (B, 3, H, W) in [-1, 1]; `seen` (optional) per image: {"colour", "shape", ...} found in it."""
    n = len(captions)
    rows = math.ceil(n / columns)
    # Sized to be read at a report's page width (~1100 px): 8.5 pt captions; constrained layout keeps
    # the title off the first row's captions.
    fig, axes = plt.subplots(rows, columns, figsize=(columns * 1.9, rows * 2.6 + 0.3), squeeze=False, layout="constrained")
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i >= n:
            continue
        ax.imshow(((images[i].detach().float().cpu().clamp(-1, 1) + 1) / 2).permute(1, 2, 0).numpy(), interpolation="nearest")
        label = "\n".join(textwrap.wrap(captions[i][:CAPTION_CHARS], 20)[:CAPTION_LINES])  # bounded: drawing is slow
        if seen is not None and seen[i] is not None:
            found = seen[i]
            label += f"\n[seen: {found.get('colour') or '-'} {found.get('shape') or '-'}]"
        ax.set_title(label, fontsize=8.5)
    fig.suptitle(title, fontsize=10)
    return fig

