"""Block-scaled linears: every nn.Linear computes its three GEMMs on block-scaled operands.

  mxfp8_linear      scaling=block: OCP Microscaling, 32-element blocks along the contraction, E8M0
                    power-of-two scales (block_scale floor, ceil or NVIDIA's rceil), e4m3 elements for
                    input, weight and output gradient (torchao's MXLinear recipe by default)
  nvfp4_linear      scaling=nvfp4: e2m1 elements in 16-element blocks with e4m3 scales and one float32
                    scale per tensor, on all three GEMMs (round to nearest; NVIDIA's full training
                    recipe adds 16 x 16 weight blocks, a random Hadamard transform on the weight
                    gradient's operands and stochastic rounding of gradients, not modelled here)
  fp8_block_linear  scaling=tile: DeepSeek-V3's FP8 recipe: activations and gradients in 1 x 128 tiles,
                    weights in 128 x 128 blocks, e4m3 everywhere, one amax scale per tile

Emulated: each operand is quantised and dequantised (numdev.numerics.scaling, the one place numdev's
FP8/MX/NVFP4 quantisation comes from, phase 1's too), then multiplied by an fp32 matmul. The
accumulation is fp32 in BLAS order, not a particular tensor core's (DeepSeek-V3's per-chunk
promotion is phase 1's fp8_block GEMM preset). Forward: q(x) @ q(W)ᵀ with blocks along K; backward:
grad_x = q(g) @ q(W) with blocks along N, grad_W = q(g)ᵀ @ q(x) with blocks along the rows M. A
weight's tiles are square (tile scaling), so the backward reads the forward's blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from numdev.numerics.scaling import BLOCK_SCALES
from numdev.numerics.scaling import quantize as quantize_to
from numdev.optimizations.base import Optimization
from numdev.optimizations.linears import adopt, flat, linear_count, swap_linears

ELEMENTS = {"e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2", "e2m1": "fp4_e2m1"}  # the config's element names -> numdev.numerics.formats' OCP formats
SCALINGS = {"block": "OCP MX (e8m0 scales)", "nvfp4": "NVFP4 (e4m3 block scales, a float32 tensor scale)",
            "tile": "DeepSeek-V3's FP8 tiles (1 x block activations, block x block weights)"}


@dataclass(frozen=True)
class Recipe:
    """How each operand of the three GEMMs is quantised."""

    fmt: str = "e4m3"
    grad_fmt: str = "e4m3"
    block: int = 32
    scaling: str = "block"
    block_scale: str = "floor"

    def quantize(self, x: torch.Tensor, fmt: str, axis: int, weight: bool = False) -> torch.Tensor:
        """x in blocks of `block` along `axis`, dequantised (a weight's tiles span `block` columns too)."""
        across = self.block if weight and self.scaling == "tile" else 1
        return quantize_to(x, ELEMENTS[fmt], self.scaling, self.block, axis, self.block_scale, across)


class _MXMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, recipe: Recipe) -> torch.Tensor:
        # The emulation computes in float32 whatever the weights' dtype (precision=bf16-true keeps bf16
        # weights, fp64 float64 ones): the weight is read as float32, its gradient returned in its own dtype.
        ctx.save_for_backward(x, weight)
        ctx.recipe = recipe
        r = recipe
        return r.quantize(x, r.fmt, -1) @ r.quantize(weight.float(), r.fmt, -1, weight=True).t()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        r = ctx.recipe
        grad = grad.float()
        grad_x = r.quantize(grad, r.grad_fmt, -1) @ r.quantize(weight.float(), r.fmt, 0, weight=True)
        grad_w = r.quantize(grad, r.grad_fmt, 0).t() @ r.quantize(x, r.fmt, 0)
        return grad_x, grad_w.to(weight.dtype), None


class MXLinear(nn.Linear):
    recipe = Recipe()

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: Recipe = Recipe()) -> MXLinear:
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.recipe = recipe
        return adopt(new, linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _MXMatmul.apply(flat(x).float(), self.weight, self.recipe)
        out = out.reshape(*x.shape[:-1], self.out_features)
        if self.bias is not None:
            out = out + self.bias.float()
        return out.to(x.dtype)


class MXTraining(Optimization):
    kernel = "emulated"

    def __init__(self, name: str, fmt: str = "e4m3", grad_fmt: str = "e4m3", block: int = 32, scaling: str = "block",
                 block_scale: str = "floor"):
        super().__init__(name)
        for key, value in (("fmt", fmt), ("grad_fmt", grad_fmt)):
            if value not in ELEMENTS:
                raise ValueError(f"optimization.{key}={value!r}: use one of {', '.join(ELEMENTS)}")
        if isinstance(block, bool) or not isinstance(block, int) or block <= 0:
            raise ValueError(f"optimization.block={block!r} must be a positive integer (MX: 32; NVFP4: 16; DeepSeek-V3's tiles: 128)")
        if scaling not in SCALINGS:
            raise ValueError(f"optimization.scaling={scaling!r}: use one of {', '.join(SCALINGS)}")
        if block_scale not in BLOCK_SCALES or (block_scale != "floor" and scaling != "block"):
            raise ValueError(f"optimization.block_scale={block_scale!r}: use one of {', '.join(BLOCK_SCALES)}, and only with scaling=block "
                             "(nvfp4's scales are e4m3, tile's torchao's amax scales)")
        self.recipe = Recipe(fmt, grad_fmt, block, scaling, block_scale)

    def model(self, model):
        self.swapped = swap_linears(model, lambda lin: MXLinear.from_linear(lin, self.recipe))
        if not self.swapped:
            raise ValueError(f"optimization={self.name}: the model has no nn.Linear to compute in block-scaled formats")
        return model

    def describe(self, model=None, optimizer=None) -> dict:
        r = self.recipe
        scales = {"block": f"e8m0 ({r.block_scale})", "nvfp4": "e4m3 per block, fp32 per tensor", "tile": "fp32 per tile"}[r.scaling]
        out = {**super().describe(), "elements": r.fmt, "gradients": r.grad_fmt, "block": r.block, "scaling": r.scaling, "scales": scales}
        return {**out, **linear_count(model, MXLinear)} if model is not None else out
