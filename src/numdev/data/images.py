"""Decoding and preparing caption-dataset images: RGB, resized and centre-cropped, scaled to [-1, 1]."""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
ON_BAD_IMAGE = ("skip", "error")

# What PIL raises on a file that is not a decodable image (truncated, corrupt, not an image).
DECODE_ERRORS = (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError)


def decode(source) -> Image.Image:
    """An RGB image, fully decoded, from a path or bytes (raises one of DECODE_ERRORS if it cannot be)."""
    if isinstance(source, bytes):
        source = io.BytesIO(source)
    with Image.open(source) as image:
        image.load()
        return image.convert("RGB")


def to_tensor(image: Image.Image, resolution: int) -> torch.Tensor:
    """(3, resolution, resolution) float32 in [-1, 1]: shorter side resized, centre cropped."""
    if image.size != (resolution, resolution):
        image = ImageOps.fit(image, (resolution, resolution), method=Image.Resampling.BICUBIC)
    array = np.asarray(image, dtype=np.uint8)  # (H, W, 3)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float().div(127.5).sub(1.0)


def check_on_bad_image(value: str) -> str:
    if value not in ON_BAD_IMAGE:
        raise ValueError(f"data.on_bad_image={value!r}: use one of {', '.join(ON_BAD_IMAGE)}")
    return value
