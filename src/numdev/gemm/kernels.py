"""The methods a GEMM figure measures: the emulator at given stage formats, and the real kernels
that run on this CPU, each with the emulation that models it (`model`, for bit-for-bit checks).

  emulated   numdev.gemm.emulated_matmul at a GemmFormats
  scaled_mm  torch._scaled_mm with float8 operands and float32 scales (tensor or row scales from
             numdev.numerics.scaling, as torchao's Float8Linear makes them); on CPU ATen multiplies
             each operand by its scale in FP32 and calls an FP32 GEMM: modelled by scale_at=operands,
             order=matmul, FP32 accumulation
  matmul_precision  an FP32 matmul under torch.set_float32_matmul_precision(p): "medium" lets oneDNN
             compute it with bf16 arithmetic on CPUs with avx512_bf16 (TF32 or bf16 on GPUs); its
             algorithm (how oneDNN splits FP32 into bf16 parts) is not modelled bit for bit: the
             nearest model, bf16 operands with FP32 accumulation, is recorded and compared
  compiled   torch.compile(torch.matmul) in FP32 (inductor's CPU code for a lone matmul)
"""

from __future__ import annotations

import functools

import torch

from numdev.gemm.emulated import emulated_matmul
from numdev.gemm.stages import GemmFormats, gemm_formats
from numdev.numerics.formats import parse_format
from numdev.numerics.scaling import quantize_parts

_FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
_OUT = {"fp32": torch.float32, "bf16": torch.bfloat16}


class Emulated:
    kind = "emulated"

    def __init__(self, formats: GemmFormats):
        self.formats = formats
        self.model = formats

    def __call__(self, a, b):
        return emulated_matmul(a, b, self.formats)

    def describe(self) -> dict:
        return {"method": self.kind, **{f"formats.{k}": v for k, v in self.formats.describe().items()}}


class ScaledMM:
    kind = "scaled_mm"

    def __init__(self, input: str = "fp8_e4m3", weight: str = "fp8_e4m3", scaling: str = "tensor", output: str = "fp32"):
        if input not in _FP8 or weight not in _FP8:
            raise ValueError(f"scaled_mm takes {' or '.join(_FP8)} operands, got {input} and {weight}")
        if scaling not in ("tensor", "row") or output not in _OUT:
            raise ValueError(f"scaled_mm: scaling tensor or row and output {' or '.join(_OUT)}, got {scaling}, {output}")
        self.input, self.weight, self.scaling, self.output = input, weight, scaling, output
        self.model = gemm_formats("fp32", input=input, weight=weight, scaling=scaling, scale_at="operands", output=output)

    def __call__(self, a, b):
        qa = quantize_parts(a.float(), self.input, self.scaling, axis=-1)
        qb = quantize_parts(b.float(), self.weight, self.scaling, axis=0)
        a8 = qa.elements.to(_FP8[self.input])
        b8 = qb.elements.to(_FP8[self.weight]).t().contiguous().t()  # the second operand column-major
        out = torch._scaled_mm(a8, b8, scale_a=qa.scale.float(), scale_b=qb.scale.float(), out_dtype=_OUT[self.output])
        return out.float()

    def describe(self) -> dict:
        return {"method": self.kind, "input": self.input, "weight": self.weight, "scaling": self.scaling, "output": self.output}


class MatmulPrecision:
    kind = "matmul_precision"

    def __init__(self, precision: str = "medium"):
        if precision not in ("highest", "high", "medium"):
            raise ValueError(f"matmul precision {precision!r}: use highest, high or medium")
        self.precision = precision
        self.model = gemm_formats("fp32" if precision == "highest" else "bf16")

    def __call__(self, a, b):
        before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(self.precision)
        try:
            return a.float() @ b.float()
        finally:
            torch.set_float32_matmul_precision(before)

    def describe(self) -> dict:
        return {"method": self.kind, "precision": self.precision}


class Compiled:
    kind = "compiled"

    def __init__(self):
        self.model = gemm_formats("fp32")

    def __call__(self, a, b):
        return _compiled_matmul()(a.float(), b.float())

    def describe(self) -> dict:
        return {"method": self.kind, "backend": "inductor"}


@functools.cache
def _compiled_matmul():
    return torch.compile(torch.matmul, dynamic=False)


def method(kind: str, **knobs):
    """A method by kind (the bench configs' `_target_`): emulated takes gemm_formats' arguments."""
    if kind == "emulated":
        return Emulated(gemm_formats(**knobs))
    classes = {c.kind: c for c in (ScaledMM, MatmulPrecision, Compiled)}
    if kind not in classes:
        raise ValueError(f"unknown gemm method {kind!r}: use emulated, {', '.join(classes)}")
    return classes[kind](**knobs)


def output_format(m) -> str:
    """The format the method's output holds (for records)."""
    return parse_format(m.model.output).name
