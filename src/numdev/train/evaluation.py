"""How well generated images follow their shapes captions: colour, shape and position agreement.

For each image whose caption names one object (numdev.data.shapes grammar):
  foreground  pixels whose brightest channel is above FOREGROUND (the background is black);
  colour      the palette colour nearest to most foreground pixels (the dominant colour);
  shape       from how much of its bounding box the dominant-colour region fills:
              square ~1, circle ~pi/4, triangle ~1/2;
  position    the 3 x 3 grid cell of the region's centroid.
An image with too little foreground has no colour, shape or position and counts as a miss.
Chance levels: colour 1/6, shape 1/3, position 1/9. On the dataset's own images all three are
(close to) 1 - the test suite checks this, so a low score is the model's, not the metric's.
"""

from __future__ import annotations

from collections import Counter

import torch

from numdev.data.shapes import COLOURS, POSITIONS, SHAPES, parse_caption

# What a guess scores: one of the dataset's colours, shapes and 3 x 3 positions at random.
CHANCE = {"colour": 1 / len(COLOURS), "shape": 1 / len(SHAPES), "position": 1 / len(POSITIONS)}
FOREGROUND = 0.3  # brightest channel, in [0, 1]
MIN_PIXELS_FRACTION = 0.01  # less foreground than this: "no object"
# Fill ratio of the bounding box: square 1.0, circle 0.785, triangle 0.5 (boundaries halfway).
SQUARE_ABOVE, CIRCLE_ABOVE = 0.89, 0.64


def classify(image: torch.Tensor) -> dict:
    """(3, H, W) in [-1, 1] -> {"colour", "shape", "position"} (None where there is no object)."""
    rgb = (image.detach().float().cpu().clamp(-1, 1) + 1) / 2  # (3, H, W) in [0, 1]
    _, height, width = rgb.shape
    foreground = rgb.amax(dim=0) > FOREGROUND  # (H, W)
    if foreground.sum() < max(1, MIN_PIXELS_FRACTION * height * width):
        return {"colour": None, "shape": None, "position": None}
    palette = torch.tensor(list(COLOURS.values()), dtype=torch.float32) / 255  # (K, 3)
    pixels = rgb[:, foreground].T  # (P, 3)
    nearest = torch.cdist(pixels, palette).argmin(dim=1)  # (P,)
    dominant = int(torch.bincount(nearest, minlength=len(palette)).argmax())
    region = torch.zeros_like(foreground)
    region[foreground] = nearest == dominant
    rows, cols = region.nonzero(as_tuple=True)
    box_area = (int(rows.max()) - int(rows.min()) + 1) * (int(cols.max()) - int(cols.min()) + 1)
    fill = len(rows) / box_area
    shape = "square" if fill > SQUARE_ABOVE else "circle" if fill > CIRCLE_ABOVE else "triangle"
    row = min(int(rows.float().mean() * 3 / height), 2)
    col = min(int(cols.float().mean() * 3 / width), 2)
    return {"colour": list(COLOURS)[dominant], "shape": shape, "position": POSITIONS[row * 3 + col]}


def score_shapes(images: torch.Tensor, captions: list[str]) -> dict:
    """Agreement of images (B, 3, H, W) in [-1, 1] with their captions.

    Returns {"scored": n, "colour_accuracy", "shape_accuracy", "position_accuracy", "samples"}:
    samples[i] is {"caption", "colour", "shape", "position"} (what image i shows), or None when
    caption i is not a single shapes-grammar object; only those are scored (accuracies are None
    when none is).
    """
    hits, samples = Counter(), []
    for image, text in zip(images, captions):
        objects = parse_caption(text)
        if objects is None or len(objects) != 1:
            samples.append(None)
            continue
        found = classify(image)
        for key in ("colour", "shape", "position"):
            hits[key] += found[key] == getattr(objects[0], key)
        samples.append({"caption": text, **found})
    n = sum(s is not None for s in samples)
    accuracy = {f"{k}_accuracy": (hits[k] / n if n else None) for k in ("colour", "shape", "position")}
    return {"scored": n, **accuracy, "samples": samples}


def agreement_text(scores: dict) -> str:
    """'colour 83% (chance 17%), shape 33% (chance 33%), position 11% (chance 11%)': how the terminal
    and the report both say it, each score beside what a guess would score."""
    return ", ".join(f"{key} {scores[f'{key}_accuracy']:.0%} (chance {CHANCE[key]:.0%})" for key in ("colour", "shape", "position"))
