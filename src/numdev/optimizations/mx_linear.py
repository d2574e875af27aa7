"""mxfp8_linear: every nn.Linear computes its three GEMMs on MXFP8 operands (OCP Microscaling:
32-element blocks along the contraction dimension, E8M0 power-of-two scales, e4m3 elements for
input, weight and output gradient, as torchao's MXLinear recipe by default).

Emulated: each operand is quantised to MXFP8 and dequantised (numdev.numerics.scaling, the one
place numdev's FP8/MX quantisation comes from, phase 1's too), then multiplied by an fp32 matmul. Products of two
MXFP8 values are exact in fp32; the accumulation is fp32 in BLAS order, not a particular tensor
core's. Forward: q(x) @ q(W)ᵀ with blocks along K; backward: grad_x = q(g) @ q(W) with blocks along
N, grad_W = q(g)ᵀ @ q(x) with blocks along the rows M.
"""

from __future__ import annotations

import torch
from torch import nn

from numdev.numerics.scaling import quantize as quantize_to
from numdev.optimizations.base import Optimization
from numdev.optimizations.linears import adopt, flat, linear_count, swap_linears

ELEMENTS = {"e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2"}  # the config's element names -> numdev.numerics.formats' OCP formats


def quantize(x: torch.Tensor, fmt: str, block: int, axis: int) -> torch.Tensor:
    """x in MX blocks of `block` along `axis` (OCP MX v1.0: e8m0 scales, floor rule), dequantised."""
    return quantize_to(x, ELEMENTS[fmt], "block", block, axis)


class _MXMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, fmt: str, grad_fmt: str, block: int) -> torch.Tensor:
        # The emulation computes in float32 whatever the weights' dtype (precision=bf16-true keeps bf16
        # weights, fp64 float64 ones): the weight is read as float32, its gradient returned in its own dtype.
        ctx.save_for_backward(x, weight)
        ctx.formats = (grad_fmt, fmt, block)
        return quantize(x, fmt, block, -1) @ quantize(weight.float(), fmt, block, -1).t()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_fmt, fmt, block = ctx.formats
        grad = grad.float()
        grad_x = quantize(grad, grad_fmt, block, -1) @ quantize(weight.float(), fmt, block, 0)
        grad_w = quantize(grad, grad_fmt, block, 0).t() @ quantize(x, fmt, block, 0)
        return grad_x, grad_w.to(weight.dtype), None, None, None


class MXLinear(nn.Linear):
    fmt, grad_fmt, block = "e4m3", "e4m3", 32

    @classmethod
    def from_linear(cls, linear: nn.Linear, fmt: str = "e4m3", grad_fmt: str = "e4m3", block: int = 32) -> MXLinear:
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.fmt, new.grad_fmt, new.block = fmt, grad_fmt, block
        return adopt(new, linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _MXMatmul.apply(flat(x).float(), self.weight, self.fmt, self.grad_fmt, self.block)
        out = out.reshape(*x.shape[:-1], self.out_features)
        if self.bias is not None:
            out = out + self.bias.float()
        return out.to(x.dtype)


class MXTraining(Optimization):
    kernel = "emulated"

    def __init__(self, name: str, fmt: str = "e4m3", grad_fmt: str = "e4m3", block: int = 32):
        super().__init__(name)
        for key, value in (("fmt", fmt), ("grad_fmt", grad_fmt)):
            if value not in ELEMENTS:
                raise ValueError(f"optimization.{key}={value!r}: use one of {', '.join(ELEMENTS)}")
        if isinstance(block, bool) or not isinstance(block, int) or block <= 0:
            raise ValueError(f"optimization.block={block!r} must be a positive integer (MX: 32)")
        self.fmt, self.grad_fmt, self.block = fmt, grad_fmt, block

    def model(self, model):
        self.swapped = swap_linears(model, lambda lin: MXLinear.from_linear(lin, self.fmt, self.grad_fmt, self.block))
        if not self.swapped:
            raise ValueError(f"optimization={self.name}: the model has no nn.Linear to compute in MX formats")
        return model

    def describe(self, model=None, optimizer=None) -> dict:
        out = {**super().describe(), "elements": self.fmt, "gradients": self.grad_fmt, "block": self.block, "scales": "e8m0"}
        return {**out, **linear_count(model, MXLinear)} if model is not None else out
