"""Stage formats of a matrix product C = A B (A: M x K activations, B: K x N weights).

  input    A's elements, after scaling (numdev.numerics.scaling)
  weight   B's elements, after scaling
  scaling  none, tensor (one amax scale per operand), row (one per row of A and per column of B),
           block (OCP MX: `block` consecutive elements along K share an E8M0 scale; block_scale
           floor as the OCP MX v1.0 spec, ceil: rounded up so no element saturates, or rceil:
           NVIDIA's round-up of the float32 quotient), nvfp4 (`block` = 16 elements along K share an
           e4m3 scale, each operand one float32 tensor scale) or tile (DeepSeek-V3's FP8 recipe: A in
           1 x `block` tiles along K, B in `block` x `block_n` blocks, one amax scale each)
  product  each a_ik * b_kj, rounded to this format (order=sequential only; products of 8/16-bit
           operands are exact in fp32)
  accum    the running sum inside a chunk of `chunk` consecutive products (N_c)
  chunk    N_c: after this many products the chunk's sum is promoted (0: the whole of K, no promotion;
           null in gemm_formats' overrides: the preset's)
  promote  the format the chunks' sums are added in (FP32 on every GPU: Hopper's FP8 recipe adds
           each N_c = 128 chunk's tensor-core sum into FP32 registers)
  output   C

Every format may carry its rounding (numdev.numerics.formats): input: fp8_e4m3:sr rounds the operands
stochastically, accum: e8m13:rtz truncates the accumulator. Stochastic formats draw their random
integers from one torch.Generator per GemmFormats, seeded by `seed` (gemm.seed).

and three arithmetic choices:
  accum_rounding  nearest (ties to even) or toward_zero (truncation: the bits below the accumulator's
            quantum dropped, as tensor cores align and truncate; the truncation is what biases a long
            low-precision accumulation). The accumulator format's rounding: toward_zero is accum: <fmt>:rtz,
            and an accum format written with :rtz sets it; stochastic is written on the format (:sr)
  order     sequential: products added one at a time in k order, each sum computed in float64 and
            rounded once to `accum` (an accumulator model: ~14 bits for Hopper's FP8 tensor cores is
            accum=e8m13); matmul: each chunk's sum by ATen's matmul in the working precision, rounded
            once to `accum` (a BLAS / tensor core with an FP32 accumulator; the order is BLAS's)
  scale_at  output: tensor/row scales multiply the promoted sum (cuBLASLt's FP8 GEMM: D = a_s b_s (A B));
            operands: they multiply the operands before the product (torch._scaled_mm's CPU path).
            Block scales are powers of two applied to the operands per block (exact), as MX hardware
            applies them per block before the FP32 accumulation. nvfp4 at output: the e4m3 block
            scales multiply the elements (exact: 2 x 4 significant bits) and the two tensor scales
            multiply the promoted sum (as cuBLASLt's alpha); at operands: the operands dequantised
            in float32 as torchao's emulated NVFP4 matmul. tile at output: each chunk of `block`
            products (chunk = block) is summed, multiplied by fp32(a_s b_s) of its tiles and added in
            the promote format (DeepSeek-V3's promotion on CUDA cores; DeepGEMM); at operands:
            dequantised in float32.

Presets (`gemm_formats(preset, ...)`, the Hydra target; any field given overrides the preset):
  fp32        everything FP32, matmul order (an FP32 BLAS GEMM)
  bf16        bf16 operands, FP32 accumulation and output (a bf16 GEMM with FP32 accumulator)
  fp8_tensor  e4m3 operands with per-tensor dynamic scales, FP32 accumulation (torchao Float8Linear)
  fp8_hopper  the same, accumulated sequentially in e8m13 (14 significant bits), truncating, and
              promoted to FP32 every 128 products (DeepSeek-V3's account of Hopper's FP8 GEMM: "around
              14 bits" of accumulation, promotion every N_c = 128)
  mxfp8, mxfp6, mxfp4   MX block scaling (32 along K) with e4m3 / e2m3 / e2m1 elements, FP32 accumulation
  nvfp4       e2m1 elements in 16-element blocks with e4m3 scales and a float32 tensor scale per operand
  fp8_block   DeepSeek-V3's FP8 GEMM: e4m3 operands, A in 1 x 128 tiles and B in 128 x 128 blocks,
              accumulated in e8m13 truncating, each 128-product chunk dequantised and promoted to FP32
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from numdev.numerics.formats import FloatFormat, Rounding, parse_format, seeded
from numdev.numerics.scaling import BLOCK_SCALES, SCALINGS

ORDERS = ("sequential", "matmul")
ACCUM_ROUNDING = ("nearest", "toward_zero", "stochastic")
_ACCUM_MODES = {"nearest": "nearest", "toward_zero": "zero", "stochastic": "stochastic"}
SCALE_AT = ("output", "operands")
FORMAT_FIELDS = ("input", "weight", "product", "accum", "promote", "output")


@dataclass(frozen=True)
class GemmFormats:
    input: FloatFormat
    weight: FloatFormat
    product: FloatFormat
    accum: FloatFormat
    promote: FloatFormat
    output: FloatFormat
    scaling: str = "none"
    block: int = 32
    block_scale: str = "floor"
    block_n: int = 128  # tile scaling: the columns of B one weight block spans (DeepSeek-V3: 128)
    chunk: int | None = None
    order: str = "matmul"
    scale_at: str = "output"
    accum_rounding: str = "nearest"
    preset: str = "custom"
    seed: int = 0  # of the random integers of every stochastic format here

    def __post_init__(self):
        if self.accum_rounding not in ACCUM_ROUNDING:
            raise ValueError(f"gemm.accum_rounding={self.accum_rounding!r}: use one of {', '.join(ACCUM_ROUNDING)}")
        _accum_rounding(self)
        for name, fmt in seeded({f: getattr(self, f) for f in FORMAT_FIELDS}, self.seed, "gemm.seed").items():
            object.__setattr__(self, name, fmt)
        if self.chunk == 0:
            object.__setattr__(self, "chunk", None)  # 0: the whole of K
        if self.scaling not in SCALINGS:
            raise ValueError(f"gemm.scaling={self.scaling!r}: use one of {', '.join(SCALINGS)}")
        if self.block_scale not in BLOCK_SCALES:
            raise ValueError(f"gemm.block_scale={self.block_scale!r}: use one of {', '.join(BLOCK_SCALES)}")
        if self.order not in ORDERS:
            raise ValueError(f"gemm.order={self.order!r}: use one of {', '.join(ORDERS)}")
        if self.scale_at not in SCALE_AT:
            raise ValueError(f"gemm.scale_at={self.scale_at!r}: use one of {', '.join(SCALE_AT)}")
        for name, value in (("chunk", self.chunk), ("block", self.block), ("block_n", self.block_n)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"gemm.{name}={value!r} must be a positive integer" + (" (or 0: the whole of K)" if name == "chunk" else ""))
        if self.scaling == "tile" and self.scale_at == "output":
            if self.chunk is None:
                object.__setattr__(self, "chunk", self.block)
            elif self.chunk != self.block:
                raise ValueError(f"gemm.chunk={self.chunk} with tile scaling at the output: each chunk's sum is dequantised by its "
                                 f"tiles' scales, so chunk must equal gemm.block={self.block} (or set gemm.scale_at=operands)")

    @property
    def working_dtype(self) -> torch.dtype:
        """float32 when every format fits in it (matmul order), else float64; sequential order
        always adds in float64 and rounds each sum once."""
        if self.order == "sequential" or not all(getattr(self, f).fits_in(torch.float32) for f in FORMAT_FIELDS):
            return torch.float64
        return torch.float32

    def describe(self) -> dict:
        out = {f: getattr(self, f).spec for f in FORMAT_FIELDS}
        out.update(scaling=self.scaling, block=self.block, block_scale=self.block_scale, chunk=self.chunk, order=self.order,
                   scale_at=self.scale_at, accum_rounding=self.accum_rounding, preset=self.preset)
        if self.scaling == "tile":
            out["block_n"] = self.block_n
        if any(getattr(self, f).rounding.mode == "stochastic" for f in FORMAT_FIELDS):
            out["seed"] = self.seed
        return out


def _accum_rounding(f: GemmFormats) -> None:
    """Make accum_rounding and the accumulator format's own rounding one choice (frozen: set in place)."""
    written = f.accum.rounding.mode
    if written == "nearest" and f.accum_rounding != "nearest":
        bits = 16 if f.accum_rounding == "stochastic" else 0
        object.__setattr__(f, "accum", replace(f.accum, rounding=Rounding(_ACCUM_MODES[f.accum_rounding], bits)))
    elif written != "nearest" and f.accum_rounding == "nearest":
        object.__setattr__(f, "accum_rounding", {v: k for k, v in _ACCUM_MODES.items()}[written])
    elif _ACCUM_MODES[f.accum_rounding] != written:
        raise ValueError(f"gemm.accum={f.accum.spec} and gemm.accum_rounding={f.accum_rounding} disagree: write the rounding once")


_FP32 = dict.fromkeys(FORMAT_FIELDS, "fp32")
PRESETS = {
    "fp32": {**_FP32},
    "bf16": {**_FP32, "input": "bf16", "weight": "bf16"},
    "fp8_tensor": {**_FP32, "input": "fp8_e4m3", "weight": "fp8_e4m3", "scaling": "tensor"},
    "fp8_hopper": {**_FP32, "input": "fp8_e4m3", "weight": "fp8_e4m3", "scaling": "tensor", "accum": "e8m13",
                   "accum_rounding": "toward_zero", "chunk": 128, "order": "sequential"},
    "mxfp8": {**_FP32, "input": "fp8_e4m3", "weight": "fp8_e4m3", "scaling": "block"},
    "mxfp6": {**_FP32, "input": "fp6_e2m3", "weight": "fp6_e2m3", "scaling": "block"},
    "mxfp4": {**_FP32, "input": "fp4_e2m1", "weight": "fp4_e2m1", "scaling": "block"},
    "nvfp4": {**_FP32, "input": "fp4_e2m1", "weight": "fp4_e2m1", "scaling": "nvfp4", "block": 16},
    "fp8_block": {**_FP32, "input": "fp8_e4m3", "weight": "fp8_e4m3", "scaling": "tile", "block": 128, "block_n": 128,
                  "accum": "e8m13", "accum_rounding": "toward_zero", "chunk": 128, "order": "sequential"},
}


def gemm_formats(preset: str = "fp32", **overrides) -> GemmFormats:
    """Formats from a preset; every override that is not None wins (the Hydra target)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown gemm preset {preset!r}: use one of {', '.join(PRESETS)}")
    allowed = set(FORMAT_FIELDS) | {"scaling", "block", "block_scale", "block_n", "chunk", "order", "scale_at", "accum_rounding", "seed"}
    unknown = set(overrides) - allowed
    if unknown:
        raise ValueError(f"unknown gemm field(s) {', '.join(sorted(unknown))}: use {', '.join(sorted(allowed))}")
    chosen = {**PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None}}
    custom = any(v is not None and PRESETS[preset].get(k) != v for k, v in overrides.items())
    formats = {}
    for f in FORMAT_FIELDS:
        try:
            formats[f] = parse_format(chosen.pop(f))
        except ValueError as error:
            raise ValueError(f"gemm.{f}: {error}") from None
    return GemmFormats(**formats, **chosen, preset=f"{preset}+custom" if custom else preset)


def with_fields(formats: GemmFormats, **changes) -> GemmFormats:
    """A copy with some fields changed (format names parsed), labelled custom."""
    parsed = {k: parse_format(v) if k in FORMAT_FIELDS else v for k, v in changes.items()}
    preset = formats.preset if formats.preset.endswith("+custom") else f"{formats.preset}+custom"
    return replace(formats, **parsed, preset=preset)
