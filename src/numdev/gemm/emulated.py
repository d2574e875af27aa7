"""A numeric re-implementation of a matrix product C = A B, every stage's format explicit
(numdev.gemm.stages: input, weight, scaling, product, accum with its chunk length, promote, output).

    quantized operands -> products -> chunk sums in `accum` -> (tile scales per chunk) -> chunk sums
    added in `promote` -> tensor/row/nvfp4-tensor scales (scale_at=output) -> C rounded to `output`

Order `sequential` is vectorised over the M x N outputs and over the K / N_c chunks at once: one
step per position inside a chunk (N_c steps, or K without promotion), each a product, its rounding
and one rounded add for every output and chunk. No M x N x K tensor is ever built. Order `matmul`
computes every chunk's sum with one (batched) ATen matmul.
"""

from __future__ import annotations

import torch

from numdev.gemm.stages import GemmFormats
from numdev.numerics.formats import round_to
from numdev.numerics.scaling import quantize_parts


def emulated_matmul(a: torch.Tensor, b: torch.Tensor, formats: GemmFormats) -> torch.Tensor:
    """C = A B with the given stage formats, as a tensor of the working precision (float32/64)."""
    _check_shapes(a, b)
    f = formats
    work = f.working_dtype
    across = f.block_n if f.scaling == "tile" else 1
    qa = quantize_parts(_wide(a), f.input, f.scaling, f.block, axis=-1, block_scale=f.block_scale)
    qb = quantize_parts(_wide(b), f.weight, f.scaling, f.block, axis=0, block_scale=f.block_scale, across=across)
    at_output = f.scale_at == "output"
    chunk_scale = None
    if at_output and f.scaling in ("tensor", "row", "tile"):
        left, right = qa.elements.to(work), qb.elements.to(work)
        if f.scaling == "tile":
            chunk_scale = _tile_scales(qa, qb, work)
    elif at_output and f.scaling == "nvfp4":  # e2m1 x e4m3: exact; the tensor scales wait for the sum
        left, right = ((q.elements * q.expanded_scale(outer=False)).to(work) for q in (qa, qb))
    elif f.scaling in ("tensor", "row", "tile", "nvfp4"):  # scale_at=operands: element x scale in FP32, as _scaled_mm's CPU path
        left, right = qa.dequantize().float().to(work), qb.dequantize().float().to(work)
    else:  # none, or block scales (powers of two: the dequantised operands are exact)
        left, right = qa.dequantize().to(work), qb.dequantize().to(work)
    summed = _sequential(left, right, f, chunk_scale) if f.order == "sequential" else _matmul(left, right, f, chunk_scale)
    if at_output and f.scaling in ("tensor", "row"):
        summed = _apply_scales(summed, qa.scale.to(work), qb.scale.to(work), f)
    elif at_output and f.scaling == "nvfp4":
        summed = _apply_scales(summed, qa.outer.to(work), qb.outer.to(work), f)
    return round_to(summed, f.output)


def _tile_scales(qa, qb, work):
    """The dequantising multiplier of chunk i of output (m, n): fp32(a_s[m, i] b_s[i, n]), as a function
    of i returning an (M, N) tensor (A's tiles are rows; B's blocks span block_n columns)."""
    sa, sb = qa.chunk_scale().float(), qb.chunk_scale().float()  # (M, chunks), (chunks, N)
    return lambda i: (sa[:, i, None] * sb[None, i, :]).to(work)


def _wide(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _chunks(left: torch.Tensor, right: torch.Tensor, chunk: int | None):
    """A (M, K) -> (M, n, c) and B (K, N) -> (n, c, N): K split into n chunks of c, the last padded
    with zero products (adding +0 changes no sum)."""
    k = left.shape[1]
    c = k if chunk is None else min(chunk, k)
    pad = -k % c
    left = torch.nn.functional.pad(left, (0, pad))
    right = torch.nn.functional.pad(right, (0, 0, 0, pad))
    n = (k + pad) // c
    return left.view(left.shape[0], n, c), right.view(n, c, right.shape[1]), c


def _sequential(left, right, f: GemmFormats, chunk_scale=None) -> torch.Tensor:
    """Products added one at a time in k order within each chunk (each add rounded to accum), then
    the chunks' sums added in order in the promote format."""
    a, b, c = _chunks(left.double(), right.double(), f.chunk)
    m, n = a.shape[0], b.shape[2]
    a, b = a.permute(2, 0, 1).contiguous(), b.permute(1, 0, 2).contiguous()  # (c, M, chunks), (c, chunks, N)
    acc = torch.zeros(m, a.shape[2], n, dtype=torch.float64)
    exact = _products_exact(f)
    accumulate = _accumulator(f)
    for j in range(c):
        products = a[j, :, :, None] * b[j, None, :, :]  # (M, chunks, N)
        acc = accumulate(acc + (products if exact else round_to(products, f.product)))
    return _promote(acc, f, chunk_scale)


def _accumulator(f: GemmFormats):
    return lambda x: round_to(x, f.accum)  # by the accumulator format's rounding (accum_rounding sets it)


def _products_exact(f: GemmFormats) -> bool:
    """Whether every product of the operands is already a value of the product format (its rounding
    would change nothing): unscaled narrow elements whose significands multiply into the product's
    (block-scaled operands can reach any exponent: their products are rounded unless it is fp64)."""
    if f.product.name == "fp64":
        return True
    narrow = f.scaling == "none" or (f.scaling in ("tensor", "row", "tile") and f.scale_at == "output")
    fits = f.input.mantissa_bits + f.weight.mantissa_bits + 1 <= f.product.mantissa_bits
    wide_enough = f.product.exponent_bits >= 8 and max(f.input.exponent_bits, f.weight.exponent_bits) <= 5
    return narrow and fits and wide_enough


def _matmul(left, right, f: GemmFormats, chunk_scale=None) -> torch.Tensor:
    accumulate = _accumulator(f)
    if f.chunk is None or f.chunk >= left.shape[1]:  # one GEMM: the BLAS call a kernel makes
        return _promote(accumulate(left @ right).unsqueeze(1), f, chunk_scale)
    a, b, _ = _chunks(left, right, f.chunk)
    partial = torch.matmul(a.transpose(0, 1), b)  # (chunks, M, N)
    return _promote(accumulate(partial).transpose(0, 1), f, chunk_scale)


def _promote(acc: torch.Tensor, f: GemmFormats, chunk_scale=None) -> torch.Tensor:
    """acc (M, chunks, N): the chunks' sums added in order, each sum rounded to the promote format
    (tile scaling: first multiplied by its chunk's scales, the product rounded to promote)."""
    def part(i):
        summed = round_to(acc[:, i], f.promote)
        return summed if chunk_scale is None else round_to(summed * round_to(chunk_scale(i), f.promote), f.promote)
    total = part(0)
    for i in range(1, acc.shape[1]):
        total = round_to(total + part(i), f.promote)
    return total


def _apply_scales(summed, scale_a, scale_b, f: GemmFormats) -> torch.Tensor:
    """D = (a_s b_s) C for one scale per tensor (cuBLASLt's alpha; nvfp4's tensor scales), a_s[m] b_s[n] C
    per row/column, each product rounded to the promote format."""
    if f.scaling in ("tensor", "nvfp4"):
        return round_to(summed * round_to(scale_a * scale_b, f.promote), f.promote)
    return round_to(round_to(summed * scale_a, f.promote) * scale_b, f.promote)


def _check_shapes(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"emulated_matmul takes A (M, K) and B (K, N), got {tuple(a.shape)} and {tuple(b.shape)}")
