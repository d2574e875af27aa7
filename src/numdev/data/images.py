"""Decoding and preparing caption-dataset images: RGB, resized and centre-cropped, scaled to [-1, 1].

Every mode PIL can open is converted with its real range, not clipped to 8 bits:

- 16-bit greyscale ('I;16', 'I;16B', ...; PNG and PGM open as these or as 'I'): 0..65535 -> 0..255;
- 32-bit integer 'I': 0..65535 when its values fit in 16 bits (16-bit files opened as 'I'); wider
  values are refused (no range can be assumed);
- 32-bit float 'F': values in [0, 1] are scaled by 255, values in [0, 255] kept; anything else
  (negative, above 255, NaN/Inf) is refused;
- alpha ('LA', 'RGBA', 'PA', 'La', 'RGBa', palette or greyscale with a transparency entry):
  composited over white, so transparent pixels do not show whatever colour they happened to store;
- palette 'P', 'CMYK', 'YCbCr', 'HSV', '1', 'L': PIL's own conversion to RGB ('LAB' by its profile).

A refused or unconvertible image raises ValueError, one of DECODE_ERRORS (skipped or an error as
data.on_bad_image says).
"""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image, ImageCms, ImageOps, UnidentifiedImageError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff", ".gif", ".pgm", ".ppm")
ON_BAD_IMAGE = ("skip", "error")

# What PIL raises on a file that is not a decodable image (truncated, corrupt, not an image).
DECODE_ERRORS = (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError)
WHITE = 255


def decode(source) -> Image.Image:
    """An RGB image, fully decoded, from a path or bytes (raises one of DECODE_ERRORS if it cannot be)."""
    if isinstance(source, bytes):
        source = io.BytesIO(source)
    with Image.open(source) as image:
        image.load()
        return to_rgb(image)


def to_rgb(image: Image.Image) -> Image.Image:
    """`image` as 8-bit RGB with its real range (see the module doc); ValueError if it has none."""
    mode = image.mode
    if mode == "RGB":
        return image.copy()
    if mode.startswith("I;16") or mode in ("I", "F"):
        return Image.fromarray(_wide_to_uint8(image), "L").convert("RGB")
    if mode in ("RGBa", "La"):  # premultiplied alpha
        mode = {"RGBa": "RGBA", "La": "LA"}[mode]
        image = image.convert(mode)
    if mode == "LAB":
        transform = ImageCms.buildTransform(ImageCms.createProfile("LAB"), ImageCms.createProfile("sRGB"), "LAB", "RGB")
        return ImageCms.applyTransform(image, transform)
    has_alpha = mode in ("LA", "RGBA", "PA") or "transparency" in image.info
    if has_alpha:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (WHITE, WHITE, WHITE, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def _wide_to_uint8(image: Image.Image) -> np.ndarray:
    mode = image.mode
    if mode.startswith("I;16"):
        values = np.asarray(image).astype(np.float64)
        top = 65535.0
    else:
        values = np.asarray(image.convert("F") if mode == "I" else image, dtype=np.float64)
        if not np.isfinite(values).all():
            raise ValueError(f"a {mode!r} image with NaN or infinite values: it has no displayable range")
        low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
        if low < 0:
            raise ValueError(f"a {mode!r} image with negative values (min {low:g}): convert it to 8 or 16 bits first")
        if mode == "I":
            if high > 65535:
                raise ValueError(f"a 32-bit integer image with values beyond 16 bits (max {high:g}): convert it to 8 or 16 bits first")
            top = 65535.0
        elif high <= 1.0:
            top = 1.0
        elif high <= 255.0:
            top = 255.0
        else:
            raise ValueError(f"a float image with values up to {high:g}, outside [0, 1] and [0, 255]: convert it to 8 or 16 bits first")
    return np.clip(np.rint(values * (255.0 / top)), 0, 255).astype(np.uint8)


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
