"""THE ONE PLACE where the MX linear (numdev.optimizations.mx_linear) gets its quantisation.

    quantize(x, fmt, scaling, block=32, axis=-1) -> x quantised and dequantised (fp32)

MERGE NOTE: the `gemm` branch builds numdev's FP8/MX quantisation module (phase 1 for matrix
products). When it is merged, replace the body of this file with an import of its function of the
same signature, e.g. `from numdev.<its module> import quantize`, and delete the code below; the
tests in tests/test_optimizations.py (MX block rules) then run against that module.

Until then a small implementation of the two scalings the optimizations use:
  tensor  one scale per tensor: max(fmt) / amax (torchao's tensorwise recipe)
  mx      OCP Microscaling v1.0: blocks of `block` consecutive elements along `axis`, each with a
          power-of-two (E8M0) scale 2^(floor(log2 amax_block) - emax(fmt)); elements x / scale
          saturated to fmt's largest finite value and rounded to nearest even; a ragged last block
          is a block of its own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
EMAX = {"e4m3": 8, "e5m2": 15}  # exponent of the largest power of two in the element format (OCP MX table 1)
E8M0_MIN, E8M0_MAX = -127, 127
EPS = 1e-12
SCALINGS = ("tensor", "mx")


def quantize(x: torch.Tensor, fmt: str, scaling: str, block: int = 32, axis: int = -1) -> torch.Tensor:
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}: use one of {', '.join(FORMATS)}")
    if scaling not in SCALINGS:
        raise ValueError(f"scaling {scaling!r}: use one of {', '.join(SCALINGS)}")
    dtype, top = FORMATS[fmt], torch.finfo(FORMATS[fmt]).max
    x = x.float()
    if scaling == "tensor":
        scale = (top / torch.clamp(x.abs().amax().to(torch.float64), min=EPS)).to(torch.float32)
        return (x * scale).clamp(-top, top).to(dtype).float() / scale
    moved = x.movedim(axis, -1)
    n = moved.shape[-1]
    blocks = F.pad(moved, (0, (-n) % block)).reshape(*moved.shape[:-1], -1, block)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    _, exponent = torch.frexp(amax)  # amax = m 2^e, m in [0.5, 1): floor(log2 amax) = e - 1 (exact)
    shared = torch.where(amax > 0, exponent - 1 - EMAX[fmt], torch.full_like(exponent, E8M0_MIN))
    scale = torch.exp2(shared.clamp(E8M0_MIN, E8M0_MAX).float())
    q = (blocks / scale).clamp(-top, top).to(dtype).float() * scale
    return q.reshape(*moved.shape[:-1], -1)[..., :n].movedim(-1, axis)
