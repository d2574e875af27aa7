"""The golden value of a matrix product: A B of the unquantised inputs in float64.

Its own error is float64 rounding (relative ~K * 2^-53 of sum |a||b|), far below every format the
figures compare; it is not assumed bit-identical across BLAS builds or machines, and nothing needs it to be."""

from __future__ import annotations

import torch


def golden_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.double() @ b.double()
