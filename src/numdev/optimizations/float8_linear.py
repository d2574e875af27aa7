"""fp8_linear: every nn.Linear computes its three GEMMs in float8 with tensor-wise dynamic scaling,
as torchao's Float8Linear (recipe "tensorwise") does.

Forward: input and weight are each scaled by max(e4m3) / amax(tensor) (computed in fp64, stored in
fp32), saturated, cast to float8_e4m3fn, and multiplied by torch._scaled_mm with the inverse
scales, output in fp32; the bias is added in high precision. Backward: the output gradient is cast
to float8_e5m2 the same way; grad_input = grad_e5m2 @ weight_e4m3 and grad_weight = grad_e5m2ᵀ @
input_e4m3, both by torch._scaled_mm. The fp32 master weights are what the optimizer updates.

torch._scaled_mm runs on this CPU (the real kernel call a user makes; on CPU its GEMM is not an
FP8 tensor core: fp8 products are exact in fp32 and accumulated in fp32).
"""

from __future__ import annotations

import torch
from torch import nn

from numdev.optimizations.base import Optimization
from numdev.optimizations.linears import adopt, flat, linear_count, swap_linears

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
EPS = 1e-12  # torchao's floor on amax (float8_utils.EPS)


def to_float8(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(x in float8 `dtype`, the inverse scale as torch._scaled_mm takes it): tensor-wise dynamic scaling."""
    amax = x.detach().abs().amax().to(torch.float64)
    scale = (torch.finfo(dtype).max / torch.clamp(amax, min=EPS)).to(torch.float32)
    top = torch.finfo(dtype).max
    return (x.float() * scale).clamp(-top, top).to(dtype), scale.reciprocal()


def scaled_mm(a: torch.Tensor, a_inv: torch.Tensor, b: torch.Tensor, b_inv: torch.Tensor) -> torch.Tensor:
    """a @ b of two float8 matrices with their inverse scales, fp32 out (b column-major, as cuBLASLt needs)."""
    return torch._scaled_mm(a.contiguous(), b.t().contiguous().t(), scale_a=a_inv, scale_b=b_inv, out_dtype=torch.float32)


class _Float8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xq, x_inv = to_float8(x, E4M3)
        wq, w_inv = to_float8(weight, E4M3)
        ctx.save_for_backward(xq, x_inv, wq, w_inv)
        return scaled_mm(xq, x_inv, wq.t(), w_inv)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        xq, x_inv, wq, w_inv = ctx.saved_tensors
        gq, g_inv = to_float8(grad, E5M2)
        grad_x = scaled_mm(gq, g_inv, wq, w_inv)  # (M, N) @ (N, K)
        grad_w = scaled_mm(gq.t(), g_inv, xq, x_inv)  # (N, M) @ (M, K)
        return grad_x, grad_w


class Float8Linear(nn.Linear):
    """nn.Linear whose forward and backward GEMMs run in float8 (see the module's docstring)."""

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Float8Linear:
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        return adopt(new, linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _Float8Matmul.apply(flat(x), self.weight).reshape(*x.shape[:-1], self.out_features)
        if self.bias is not None:
            out = out + self.bias.float()
        return out.to(x.dtype)


class Float8Training(Optimization):
    kernel = "real"

    def model(self, model):
        self.swapped = swap_linears(model, Float8Linear.from_linear)
        if not self.swapped:
            raise ValueError(f"optimization={self.name}: the model has no nn.Linear to compute in float8")
        return model

    def describe(self, model=None, optimizer=None) -> dict:
        out = {**super().describe(), "forward": "e4m3", "gradients": "e5m2", "scaling": "tensorwise dynamic", "gemm": "torch._scaled_mm"}
        return {**out, **linear_count(model, Float8Linear)} if model is not None else out
