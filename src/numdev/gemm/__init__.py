"""Matrix products, phase 1: an emulator with every stage's format explicit (stages, emulated),
the FP64 golden product (golden) and the real kernels that run on this CPU (kernels)."""

from numdev.gemm.emulated import emulated_matmul
from numdev.gemm.golden import golden_matmul
from numdev.gemm.stages import GemmFormats, gemm_formats

__all__ = ["GemmFormats", "emulated_matmul", "gemm_formats", "golden_matmul"]
