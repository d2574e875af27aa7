"""fp8_linear: every nn.Linear computes its three GEMMs in float8 with tensor-wise dynamic scaling,
as torchao's Float8Linear (recipe "tensorwise") does.

Forward: input and weight are each scaled by max(e4m3) / amax(tensor) (computed in fp64, stored in
fp32), saturated, cast to float8_e4m3fn, and multiplied by torch._scaled_mm with the inverse
scales, output in fp32; the bias is added in high precision. Backward: the output gradient is cast
to float8_e5m2 the same way; grad_input = grad_e5m2 @ weight_e4m3 and grad_weight = grad_e5m2ᵀ @
input_e4m3, both by torch._scaled_mm. The fp32 master weights are what the optimizer updates.

`gemm` picks how the three products are computed: `native` calls torch._scaled_mm (the real kernel
call a user makes); `fp32` computes (a.float() * scale_a) @ (b.float() * scale_b) in FP32, which is
PyTorch's own CPU path of torch._scaled_mm (element times scale in FP32, then an FP32 GEMM: bit for
bit what it returns for e5m2 x e4m3 operands on the AMX Xeon); `auto` is native on a GPU and fp32 on a CPU. Why: on
a CPU with AMX, torch._scaled_mm sends e4m3 x e4m3 to oneDNN's FP8 matmul, which took 1,200-2,900x
the FP32 route's time on an AMX Xeon (1.3 s for a 640x128x128 product;
docs/results/bench_fp8_gemm.json, `scripts/bench_fp8_gemm.py`) and agrees with it to the FP32
summation order (relative 2-3e-7; there are no FP8 tensor cores on a CPU: fp8 products are exact in
fp32 and accumulated in fp32 either way). The choice depends on the device only, so sibling runs on one machine compute the
same way; run.json records it (`optimization.gemm`).
"""

from __future__ import annotations

import torch
from torch import nn

from numdev.optimizations.base import Optimization
from numdev.optimizations.linears import adopt, flat, linear_count, swap_linears

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
GEMMS = ("auto", "native", "fp32")
EPS = 1e-12  # torchao's floor on amax (float8_utils.EPS)


def to_float8(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(x in float8 `dtype`, the inverse scale as torch._scaled_mm takes it): tensor-wise dynamic scaling."""
    amax = x.detach().abs().amax().to(torch.float64)
    scale = (torch.finfo(dtype).max / torch.clamp(amax, min=EPS)).to(torch.float32)
    top = torch.finfo(dtype).max
    return (x.float() * scale).clamp(-top, top).to(dtype), scale.reciprocal()


def route(gemm: str, device: torch.device) -> str:
    """The route `gemm` (GEMMS) takes on `device`: native or fp32."""
    if gemm not in GEMMS:
        raise ValueError(f"optimization.gemm={gemm!r}: use one of {', '.join(GEMMS)}")
    return ("fp32" if device.type == "cpu" else "native") if gemm == "auto" else gemm


def scaled_mm(a: torch.Tensor, a_inv: torch.Tensor, b: torch.Tensor, b_inv: torch.Tensor, gemm: str = "native") -> torch.Tensor:
    """a @ b of two float8 matrices with their inverse scales, fp32 out: torch._scaled_mm (b column-major,
    as cuBLASLt needs), or its CPU path's arithmetic in FP32 (the module's docstring)."""
    if route(gemm, a.device) == "fp32":
        return (a.float() * a_inv) @ (b.float() * b_inv)
    return torch._scaled_mm(a.contiguous(), b.t().contiguous().t(), scale_a=a_inv, scale_b=b_inv, out_dtype=torch.float32)


class _Float8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, gemm: str) -> torch.Tensor:
        xq, x_inv = to_float8(x, E4M3)
        wq, w_inv = to_float8(weight, E4M3)
        ctx.save_for_backward(xq, x_inv, wq, w_inv)
        ctx.gemm = gemm
        return scaled_mm(xq, x_inv, wq.t(), w_inv, gemm)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        xq, x_inv, wq, w_inv = ctx.saved_tensors
        gq, g_inv = to_float8(grad, E5M2)
        grad_x = scaled_mm(gq, g_inv, wq, w_inv, ctx.gemm)  # (M, N) @ (N, K)
        grad_w = scaled_mm(gq.t(), g_inv, xq, x_inv, ctx.gemm)  # (N, M) @ (M, K)
        return grad_x, grad_w, None


class Float8Linear(nn.Linear):
    """nn.Linear whose forward and backward GEMMs run in float8 (see the module's docstring)."""

    gemm = "native"  # GEMMS: set by Float8Training

    @classmethod
    def from_linear(cls, linear: nn.Linear, gemm: str = "native") -> Float8Linear:
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.gemm = gemm
        return adopt(new, linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _Float8Matmul.apply(flat(x), self.weight, self.gemm).reshape(*x.shape[:-1], self.out_features)
        if self.bias is not None:
            out = out + self.bias.float()
        return out.to(x.dtype)


class Float8Training(Optimization):
    kernel = "real"

    def __init__(self, name: str = "fp8_linear", gemm: str = "auto"):
        super().__init__(name)
        route(gemm, torch.device("cpu"))  # refuse a bad setting at construction
        self.gemm = gemm

    def model(self, model):
        self.swapped = swap_linears(model, lambda linear: Float8Linear.from_linear(linear, self.gemm))
        if not self.swapped:
            raise ValueError(f"optimization={self.name}: the model has no nn.Linear to compute in float8")
        return model

    def describe(self, model=None, optimizer=None) -> dict:
        out = {**super().describe(), "forward": "e4m3", "gradients": "e5m2", "scaling": "tensorwise dynamic", "gemm": self.gemm}
        if model is None:
            return out
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        gemm = {"fp32": "FP32 on fp8 values times their scales (torch._scaled_mm's CPU path)", "native": "torch._scaled_mm"}
        taken = route(self.gemm, device)
        kernel = "real" if taken == "native" else "emulated"  # fp32: numdev computes the kernel's CPU arithmetic
        return {**out, "kernel": kernel, "gemm_route": gemm[taken], **linear_count(model, Float8Linear)}
