"""matmul_bf16: torch.set_float32_matmul_precision("medium") for the run.

fp32 matrix products may then use a faster, lower internal precision: on CPU oneDNN's bf16 path
(bf16 products of fp32 inputs split into bf16 parts, fp32 accumulation), on NVIDIA GPUs TF32 or
bf16. Only fp32 matmuls are affected: under bf16-mixed autocast the Linears already run in bf16.
The setting is process-wide, so it is set when the run starts and the previous value restored when
it ends (a joblib worker runs other roles next).
"""

from __future__ import annotations

import contextlib

import torch

from numdev.optimizations.base import Optimization

PRECISIONS = ("highest", "high", "medium")


class MatmulPrecision(Optimization):
    kernel = "real"

    def __init__(self, name: str, precision: str = "medium"):
        super().__init__(name)
        if precision not in PRECISIONS:
            raise ValueError(f"optimization.precision={precision!r}: use one of {', '.join(PRECISIONS)}")
        self.precision = precision

    @contextlib.contextmanager
    def active(self):
        previous = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(self.precision)
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(previous)

    def describe(self, model=None, optimizer=None) -> dict:
        return {**super().describe(), "float32_matmul_precision": torch.get_float32_matmul_precision()}
