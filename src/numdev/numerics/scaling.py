"""Scaled quantisation: a tensor divided by a scale, rounded to a narrow format, multiplied back.

The one home of scaling in numdev (the GEMM emulator, numdev.gemm, and training's FP8/MX linear
layers use it). Six scalings, each over `axis` (the reduction axis of a matrix product):

  none    round_to(x, fmt): no scale; overflow as the format says (inf, NaN, or saturation)
  tensor  one scale for the tensor, dynamic from its amax, as torchao's Float8Linear (tensorwise):
          s = fp32(max_finite / max(amax, 1e-12)), computed in float64 and rounded to float32;
          elements = round_to(clamp(x * s, -max_finite, max_finite), fmt); the dequantising
          multiplier is fp32(1 / s) (what torch._scaled_mm takes as scale_a / scale_b)
  row     the same with one amax per slice along `axis` (per row of A[M, K], per column of B[K, N]:
          torchao's rowwise / axiswise recipe)
  block   OCP MX (Microscaling Formats Specification v1.0, section 6.3): `block` consecutive
          elements along `axis` share a power-of-two scale X = 2^(floor(log2(amax)) - emax_elem),
          kept in E8M0 (exponent clamped to [-127, 127]; an all-zero block gets 2^-127, as gfloat
          and the spec's reference code do); elements = round_to(V / X) to nearest even, saturated
          to the element format's largest normal; a block holding NaN or inf gets the NaN scale and
          dequantises to NaN. V / X is exact (a power of two), so small elements flush to zero only
          by the element format's own underflow relative to the block's largest element.
          The spec's floor leaves amax / X in [2^emax, 2^(emax+1)), above the largest normal of
          e4m3 (448) and e2m1 (6): a block's largest elements can saturate. block_scale="ceil"
          takes instead the smallest power of two with amax / X <= max_finite (X = 2^ceil(log2(amax /
          max_finite)), as NVIDIA's MXFP8 recipe rounds the scale up): nothing saturates, one
          binade of the small elements' range is given up. block_scale="rceil": NVIDIA's round-up
          (cuBLAS 1-D block quantisation; torchao's ScaleCalculationMode.RCEIL, TransformerEngine):
          descale = fp32(amax) / max_finite computed in float32, rounded up to a power of two
          exactly (cvt.rp.satfinite.ue8m0); a block whose scale is 2^-127 has its elements rounded
          unscaled, as TransformerEngine's exp2f_rcp and torchao do (it returns 1 there, not 2^127).
          It differs from "ceil" only where the float32 division rounds onto a power of two.
  nvfp4   NVIDIA's NVFP4 (torchao's nvfp4_quantize with a dynamic per-tensor scale): `block` (16)
          elements along `axis` share an e4m3 scale, and the tensor one float32 scale:
          t = fp32(amax) / (448 * max_finite); per block s = e4m3(clamp(fp32(fp32(block_amax /
          max_finite) / t), 2^-6, 448)); elements = round_to(clamp(x * fp32(fp32(1 / t) / s),
          +-max_finite)). Dequantised as elements * fp32(t * s) (torchao's get_hp_scales). An all-zero
          tensor gets t = 1 (torchao would divide by zero); a NaN anywhere makes t, and so the whole
          tensor, NaN (as torchao's). `block` other than 16 is a generalisation, not NVFP4.
  tile    DeepSeek-V3's FP8 recipe (torchao's blockwise_fp8_training): one torchao amax scale (as
          `row`) per tile of `block` elements along `axis` by `across` slices across it: 1 x 128 for
          activations and gradients, 128 x 128 for weights (across > 1 needs a 2-D tensor; the other
          axis is the one that is not `axis`).

Public API:
  quantize(x, fmt, scaling="tensor", block=32, axis=-1, block_scale="floor", across=1) -> dequantized x
      (x's dtype: float32/float64, or bf16/fp16 quantised from their float32 values and rounded back)
  quantize_parts(...) -> Quantized(elements, scale, outer): elements * scale (broadcast per block,
      times the nvfp4 tensor scale `outer`) == quantize(...)
  tensor_scale(x, fmt, axis=None) -> torchao's amax scale s (float32), per tensor or per slice
  mx_scale_exponent(x, fmt, block=32, axis=-1, block_scale="floor") -> each block's E8M0 exponent (float64)
  nvfp4_parts(x, fmt="fp4_e2m1", block=16, axis=-1) -> Quantized: elements, e4m3 block scales, tensor scale
  e8m0_bits(exponent) -> the E8M0 code (uint8) of scale exponents, NaN where a block was not finite

Under autograd `quantize` is a straight-through estimator: the forward pass quantises, the
backward pass is the identity (the scale is computed from detached values), as torchao's casts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from numdev.numerics.formats import FloatFormat, parse_format, round_to

_E4M3 = parse_format("fp8_e4m3")  # NVFP4's block-scale format
SCALINGS = ("none", "tensor", "row", "block", "nvfp4", "tile")
MX_BLOCK = 32  # the OCP MX block size
NVFP4_BLOCK = 16  # NVFP4's block; its scales are e4m3
NVFP4_SCALE_MIN = 2.0 ** -6  # the smallest normal e4m3 number: no block scale is subnormal (torchao's E4M3_EPS)
AMAX_EPS = 1e-12  # torchao's floor on amax (float8_utils.EPS)
E8M0_MIN, E8M0_MAX = -127, 127  # the E8M0 exponent range; code 255 is NaN
MX_ELEMENTS = ("fp8_e4m3", "fp8_e5m2", "fp6_e2m3", "fp6_e3m2", "fp4_e2m1")
BLOCK_SCALES = ("floor", "ceil", "rceil")  # floor: OCP MX v1.0; ceil: rounded up so nothing saturates; rceil: NVIDIA's, in float32


@dataclass(frozen=True)
class Quantized:
    """Elements (values of `fmt`, held in x's dtype, x's shape) and the dequantising multiplier.

    scale: a 0-d tensor (tensor), x's shape with `axis` of length 1 (row), or x's shape with
    `axis` of length ceil(n / block) (block: one power of two per block; nvfp4: the e4m3 block
    scales; tile: also the other axis of length ceil(m / across)).
    outer: nvfp4's float32 tensor scale (0-d), None otherwise."""

    elements: torch.Tensor
    scale: torch.Tensor
    fmt: FloatFormat
    scaling: str
    block: int
    axis: int
    across: int = 1
    outer: torch.Tensor | None = None

    def expanded_scale(self, outer: bool = True) -> torch.Tensor:
        """The scale broadcast to the elements' shape (each block's scale repeated over its block),
        times nvfp4's tensor scale in float32 unless outer=False."""
        if self.scaling in ("none", "tensor", "row"):
            return self.scale.expand_as(self.elements)
        scale = self.scale
        if self.outer is not None and outer:
            scale = (self.outer.float() * scale.float()).to(scale.dtype)  # torchao's get_hp_scales
        return _spread(scale, self.elements.shape, self.block, self.axis, self.across)

    def chunk_scale(self) -> torch.Tensor:
        """The block scales with one entry per block along `axis` (a GEMM's chunk of K) and repeated
        over the other axis's `across` (tile scaling's 128 x 128 blocks): (M, chunks) or (chunks, N)."""
        return _spread(self.scale, self.elements.shape, 1, self.axis, self.across)

    def dequantize(self) -> torch.Tensor:
        if self.scaling == "none":
            return self.elements
        return self.elements * self.expanded_scale()


def quantize(x: torch.Tensor, fmt: FloatFormat | str, scaling: str = "tensor", block: int = MX_BLOCK,
             axis: int = -1, block_scale: str = "floor", across: int = 1) -> torch.Tensor:
    """x quantised to fmt with the given scaling and dequantised, as a tensor of x's dtype.

    bf16/fp16 x is quantised from its float32 values and the dequantised result rounded back to x's
    dtype (elements times scale need not be a bf16 number)."""
    if x.dtype in (torch.bfloat16, torch.float16):
        return quantize(x.float(), fmt, scaling, block, axis, block_scale, across).to(x.dtype)
    if scaling == "none":
        return round_to(x, fmt)
    with torch.no_grad():
        out = quantize_parts(x.detach(), fmt, scaling, block, axis, block_scale, across).dequantize()
    if x.requires_grad:
        return x + (out - x).detach()  # straight through
    return out


def quantize_parts(x: torch.Tensor, fmt: FloatFormat | str, scaling: str = "tensor", block: int = MX_BLOCK,
                   axis: int = -1, block_scale: str = "floor", across: int = 1) -> Quantized:
    """The elements and scales of x quantised to fmt (see the module doc for each scaling)."""
    fmt = parse_format(fmt)
    _check(x, fmt, scaling, block, block_scale, across)
    axis = axis % x.dim() if x.dim() else 0
    if scaling == "none":
        return Quantized(round_to(x, fmt), torch.ones((), dtype=x.dtype), fmt, scaling, block, axis)
    if scaling in ("tensor", "row", "tile"):
        if scaling == "tile":
            s = _tile_scale(x, fmt, block, across, axis)
            multiplier = _spread(s, x.shape, block, axis, across)
        else:
            s = multiplier = tensor_scale(x, fmt, axis=None if scaling == "tensor" else axis)
        elements = round_to(_saturate(x * multiplier.to(x.dtype), fmt), fmt)
        return Quantized(elements, torch.reciprocal(s).to(x.dtype), fmt, scaling, block, axis, across)
    if scaling == "nvfp4":
        return nvfp4_parts(x, fmt, block, axis)
    exponent = mx_scale_exponent(x, fmt, block, axis, block_scale)
    wide = x.double()  # V / X and its rounding in float64: the division by a power of two is exact
    shift = _expand(exponent, block, axis, x.shape[axis]).double()
    if block_scale == "rceil":  # a 2^-127 scale is not applied to the elements (TransformerEngine's exp2f_rcp)
        shift = torch.where(shift == E8M0_MIN, 0.0, shift)
    elements = round_to(_saturate(wide * _pow2(-shift), fmt), fmt).to(x.dtype)
    return Quantized(elements, _pow2(exponent).to(x.dtype), fmt, scaling, block, axis)


def nvfp4_parts(x: torch.Tensor, fmt: FloatFormat | str = "fp4_e2m1", block: int = NVFP4_BLOCK, axis: int = -1) -> Quantized:
    """NVFP4's two-level quantisation in torchao's float32 arithmetic (module doc): elements, the
    e4m3 block scales (as float values) and the float32 tensor scale in `outer`."""
    fmt = parse_format(fmt)
    axis = axis % x.dim()
    x32 = x.float()
    amax = x32.detach().abs().amax()
    outer = amax / (_E4M3.max_finite * fmt.max_finite)
    outer = torch.where(amax == 0, torch.ones_like(outer), outer)  # all zeros: any scale does; torchao's would be 0
    block_amax = _block_view(x32.detach().abs(), block, axis).amax(dim=-1).movedim(-1, axis)
    scales = round_to(torch.clamp((block_amax / fmt.max_finite) / outer, NVFP4_SCALE_MIN, _E4M3.max_finite), _E4M3)
    reciprocal = torch.reciprocal(outer) / scales  # (1 / t) / s in float32, as torchao multiplies
    elements = round_to(_saturate(x32 * _expand(reciprocal, block, axis, x.shape[axis]), fmt), fmt)
    return Quantized(elements.to(x.dtype), scales.to(x.dtype), fmt, "nvfp4", block, axis, outer=outer)


def tensor_scale(x: torch.Tensor, fmt: FloatFormat | str, axis: int | None = None) -> torch.Tensor:
    """torchao's dynamic amax scale s = max_finite / max(amax, 1e-12), in float64 then float32.

    axis None: one scale for the tensor (a 0-d tensor); else one per slice along `axis` (keepdim).
    x * s fills the format's range; 1 / s dequantises."""
    fmt = parse_format(fmt)
    magnitude = x.detach().abs().double()
    amax = magnitude.amax() if axis is None else magnitude.amax(dim=axis, keepdim=True)
    return (fmt.max_finite / torch.clamp(amax, min=AMAX_EPS)).float()


def mx_scale_exponent(x: torch.Tensor, fmt: FloatFormat | str, block: int = MX_BLOCK, axis: int = -1,
                      block_scale: str = "floor") -> torch.Tensor:
    """floor(log2(amax of each block)) - emax_elem (block_scale="ceil": ceil(log2(amax / max_finite));
    "rceil": the same of the float32 quotient), clamped to E8M0's [-127, 127] (float64; NaN for a
    block holding NaN or inf). x's shape with `axis` of length ceil(n / block)."""
    fmt = parse_format(fmt)
    axis = axis % x.dim()
    blocks = _block_view(x.detach().abs().double(), block, axis)
    amax = blocks.amax(dim=-1)
    finite = torch.isfinite(blocks).all(dim=-1)
    if block_scale in ("ceil", "rceil"):
        ratio = amax / fmt.max_finite if block_scale == "ceil" else amax.float() / fmt.max_finite
        mantissa, exponent = torch.frexp(ratio)  # ceil(log2(ratio)) = exponent - 1 when ratio is a power of two
        shared = (exponent - (mantissa.abs() == 0.5).to(exponent.dtype)).double()
    else:
        _, exponent = torch.frexp(amax)  # amax = m * 2**exponent, 0.5 <= m < 1: floor(log2(amax)) = exponent - 1
        shared = (exponent - 1 - fmt.emax).double()
    shared = shared.clamp(E8M0_MIN, E8M0_MAX)
    shared = torch.where(amax == 0, float(E8M0_MIN), shared)
    shared = torch.where(finite, shared, float("nan"))
    return shared.movedim(-1, axis)


def _block_view(magnitude: torch.Tensor, block: int, axis: int) -> torch.Tensor:
    """|x| with `axis` moved last and split into blocks: (..., n_blocks, block), the last block
    padded with zeros (zeros do not change a block's amax)."""
    magnitude = magnitude.movedim(axis, -1)
    padded = torch.nn.functional.pad(magnitude, (0, -magnitude.shape[-1] % block))
    return padded.unflatten(-1, (-1, block))


def _tile_scale(x: torch.Tensor, fmt: FloatFormat, block: int, across: int, axis: int) -> torch.Tensor:
    """torchao's amax scale (tensor_scale's arithmetic) of each `block` x `across` tile: x's shape
    with `axis` of length ceil(n / block) and (across > 1) the other axis of length ceil(m / across)."""
    amax = _block_view(x.detach().abs().double(), block, axis).amax(dim=-1).movedim(-1, axis)
    if across > 1:
        amax = _block_view(amax, across, 1 - axis).amax(dim=-1).movedim(-1, 1 - axis)
    return (fmt.max_finite / torch.clamp(amax, min=AMAX_EPS)).float()


def e8m0_bits(exponent: torch.Tensor) -> torch.Tensor:
    """The E8M0 codes of scale exponents: exponent + 127, NaN -> 255."""
    code = torch.nan_to_num(exponent.double(), nan=255.0 - 127) + 127
    if ((code < 0) | (code > 255)).any():
        raise ValueError(f"E8M0 holds exponents in [{E8M0_MIN}, {E8M0_MAX}]")
    return code.to(torch.uint8)


def _expand(per_block: torch.Tensor, block: int, axis: int, n: int) -> torch.Tensor:
    return per_block.repeat_interleave(block, dim=axis).narrow(axis, 0, n)


def _spread(scale: torch.Tensor, shape, block: int, axis: int, across: int = 1) -> torch.Tensor:
    """A 2-d per-block scale broadcast to `shape`: each entry over `block` elements along `axis` (block=1:
    kept per block) and over `across` along the other axis (1: one scale per row or column)."""
    if across > 1:
        other = 1 - axis
        scale = _expand(scale, across, other, shape[other])
    return scale if block == 1 else _expand(scale, block, axis, shape[axis])


def _pow2(exponent: torch.Tensor) -> torch.Tensor:
    """2**exponent exactly, in float64, built from its exponent bits (NaN stays NaN)."""
    nan = torch.isnan(exponent)
    bits = (torch.where(nan, 0.0, exponent).to(torch.int64) + 1023) << 52
    return torch.where(nan, float("nan"), bits.view(torch.float64))


def _saturate(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Clamp to the format's largest finite number (NaN stays NaN), as a saturating cast does."""
    return torch.clamp(x, -fmt.max_finite, fmt.max_finite)


def _check(x: torch.Tensor, fmt: FloatFormat, scaling: str, block: int, block_scale: str = "floor", across: int = 1) -> None:
    if scaling not in SCALINGS:
        raise ValueError(f"unknown scaling {scaling!r}: use one of {', '.join(SCALINGS)}")
    if block_scale not in BLOCK_SCALES:
        raise ValueError(f"unknown block_scale {block_scale!r}: use one of {', '.join(BLOCK_SCALES)}")
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"quantize works in float32 or float64, got {x.dtype}; upcast first")
    if scaling in ("block", "nvfp4", "tile"):
        for name, value in (("block", block), ("across", across)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer (OCP MX: block 32; NVFP4: 16; DeepSeek-V3's tiles: 128)")
        if x.dim() == 0:
            raise ValueError(f"{scaling} scaling needs a tensor with at least one dimension")
        if across > 1 and (scaling != "tile" or x.dim() != 2):
            raise ValueError(f"across={across} (tiles spanning several slices) needs tile scaling of a 2-D tensor, got {scaling} of {x.dim()}-D")
