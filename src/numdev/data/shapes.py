"""Captioned shapes: procedurally drawn coloured shapes on black, captioned from their attributes.

"a large red circle at the top left and a small blue square at the bottom" - colour, shape,
size and position (a 3 x 3 grid) of one or more objects, each in its own grid cell. Item i is
drawn from its own generator seeded by (content_seed, i), so the dataset is the same on every
machine, at any resolution, in any order and with any number of workers; nothing is downloaded.
Drawn at 4x and box-filtered down, so edges are antialiased.

The caption grammar is regular, so a generated image can be scored against its caption
(numdev.train.evaluation); `parse_caption` inverts `caption`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch.utils.data import Dataset

from numdev.data.datamodule import CaptionDataModule
from numdev.data.images import to_tensor

COLOURS = {
    "red": (230, 30, 30),
    "green": (30, 200, 40),
    "blue": (40, 70, 235),
    "yellow": (235, 220, 30),
    "magenta": (220, 40, 220),
    "cyan": (30, 210, 220),
}
SHAPES = ("circle", "square", "triangle")
SIZES = {"small": 0.3, "large": 0.5}  # extent as a fraction of the image side
POSITIONS = (  # row-major 3 x 3 grid cells
    "top left", "top", "top right",
    "left", "center", "right",
    "bottom left", "bottom", "bottom right",
)  # fmt: skip
BACKGROUND = (0, 0, 0)
SUPERSAMPLE = 4


@dataclass(frozen=True)
class ShapeSpec:
    colour: str
    shape: str
    size: str
    position: str

    def phrase(self) -> str:
        return f"a {self.size} {self.colour} {self.shape} at the {self.position}"


def caption(objects: list[ShapeSpec]) -> str:
    return " and ".join(o.phrase() for o in objects)


_PHRASE = re.compile(
    rf"a ({'|'.join(SIZES)}) ({'|'.join(COLOURS)}) ({'|'.join(SHAPES)}) at the ({'|'.join(POSITIONS)})"
)


def parse_caption(text: str) -> list[ShapeSpec] | None:
    """The objects of a shapes caption, or None if `text` is not one."""
    parts = text.strip().split(" and ")
    objects = []
    for part in parts:
        match = _PHRASE.fullmatch(part)
        if match is None:
            return None
        objects.append(ShapeSpec(colour=match[2], shape=match[3], size=match[1], position=match[4]))
    return objects


def draw(objects: list[ShapeSpec], resolution: int, rng: np.random.Generator | None = None) -> Image.Image:
    """The image of `objects`; `rng` jitters positions inside their cells (None: cell centres)."""
    side = resolution * SUPERSAMPLE
    image = Image.new("RGB", (side, side), BACKGROUND)
    pen = ImageDraw.Draw(image)
    cell = side / 3
    for obj in objects:
        extent = SIZES[obj.size] * side
        row, col = divmod(POSITIONS.index(obj.position), 3)
        jitter = rng.uniform(-cell / 6, cell / 6, size=2) if rng is not None else (0.0, 0.0)
        # Centre in the cell, kept inside the image: a large shape in a corner touches the border.
        cx = min(max((col + 0.5) * cell + jitter[0], extent / 2), side - extent / 2)
        cy = min(max((row + 0.5) * cell + jitter[1], extent / 2), side - extent / 2)
        box = (cx - extent / 2, cy - extent / 2, cx + extent / 2, cy + extent / 2)
        fill = COLOURS[obj.colour]
        if obj.shape == "circle":
            pen.ellipse(box, fill=fill)
        elif obj.shape == "square":
            pen.rectangle(box, fill=fill)
        else:  # upright isosceles triangle filling its box
            pen.polygon([(cx, box[1]), (box[2], box[3]), (box[0], box[3])], fill=fill)
    return image.resize((resolution, resolution), Image.Resampling.BOX)


class ShapesDataset(Dataset):
    def __init__(self, size: int = 20000, resolution: int = 32, min_objects: int = 1, max_objects: int = 1, content_seed: int = 0):
        if size <= 0:
            raise ValueError(f"data.size={size} must be a positive integer")
        if resolution < 8:
            raise ValueError(f"data.resolution={resolution} is too small to draw shapes in: use 8 or more")
        if not 1 <= min_objects <= max_objects <= len(POSITIONS):
            raise ValueError(
                f"data.min_objects={min_objects}, data.max_objects={max_objects}: need 1 <= min <= max <= {len(POSITIONS)}"
            )
        self.size, self.resolution = size, resolution
        self.min_objects, self.max_objects, self.content_seed = min_objects, max_objects, content_seed

    def __len__(self) -> int:
        return self.size

    def objects(self, index: int) -> tuple[list[ShapeSpec], np.random.Generator]:
        rng = np.random.default_rng([self.content_seed, index])
        count = int(rng.integers(self.min_objects, self.max_objects + 1))
        cells = rng.choice(len(POSITIONS), size=count, replace=False)
        colours, sizes = list(COLOURS), list(SIZES)
        objects = [
            ShapeSpec(
                colour=colours[int(rng.integers(len(colours)))],
                shape=SHAPES[int(rng.integers(len(SHAPES)))],
                size=sizes[int(rng.integers(len(sizes)))],
                position=POSITIONS[int(cell)],
            )
            for cell in cells
        ]
        return objects, rng

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < self.size:
            raise IndexError(index)
        objects, rng = self.objects(index)
        image = draw(objects, self.resolution, rng)
        return {"image": to_tensor(image, self.resolution), "caption": caption(objects)}


def preview_specs(n: int) -> list[ShapeSpec]:
    """n single objects that cycle through every colour x shape x size, positions varying."""
    specs = []
    for i in range(n):
        colour = list(COLOURS)[i % len(COLOURS)]
        shape = SHAPES[(i // len(COLOURS)) % len(SHAPES)]
        size = list(SIZES)[(i // (len(COLOURS) * len(SHAPES))) % len(SIZES)]
        specs.append(ShapeSpec(colour, shape, size, POSITIONS[(i * 4) % len(POSITIONS)]))
    return specs


HELDOUT_SEED_OFFSET = 1_000_003  # held-out images: content_seed + this


class ShapesDataModule(CaptionDataModule):
    def __init__(
        self,
        resolution: int = 32,
        size: int = 20000,
        min_objects: int = 1,
        max_objects: int = 1,
        content_seed: int = 0,
        batch_size: int = 32,
        num_workers: int = 0,
        seed: int = 0,
    ):
        super().__init__(batch_size=batch_size, num_workers=num_workers, seed=seed)
        self.dataset_args = dict(
            size=size, resolution=resolution, min_objects=min_objects, max_objects=max_objects, content_seed=content_seed
        )
        ShapesDataset(**self.dataset_args)  # bad values fail here, at construction

    def build_dataset(self) -> ShapesDataset:
        return ShapesDataset(**self.dataset_args)

    def caption_vocabulary(self) -> tuple[list[str], str]:
        """Every one-object phrase, and one two-object caption for the joining "and": the tokenizer
        encodes words one by one, so these hold every token a caption of this grammar can have."""
        phrases = [
            caption([ShapeSpec(colour, shape, size, position)])
            for colour in COLOURS for shape in SHAPES for size in SIZES for position in POSITIONS
        ]
        if self.dataset_args["max_objects"] > 1:
            phrases.append(f"{phrases[0]} and {phrases[1]}")
        return phrases, f"the shapes caption grammar ({len(phrases)} phrases)"

    def preview_captions(self, n: int) -> list[str]:
        return [caption([spec]) for spec in preview_specs(n)]

    def heldout_dataset(self, n: int) -> ShapesDataset:
        """n images training never draws: the same grammar from another content seed."""
        return ShapesDataset(**{**self.dataset_args, "size": n, "content_seed": self.dataset_args["content_seed"] + HELDOUT_SEED_OFFSET})


def images_of(specs: list[ShapeSpec], resolution: int) -> torch.Tensor:
    """Reference drawings (cell centres) of single objects, (B, 3, R, R) in [-1, 1]."""
    return torch.stack([to_tensor(draw([s], resolution), resolution) for s in specs])
