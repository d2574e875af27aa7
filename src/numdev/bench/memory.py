"""How much memory a microbenchmark method will need, estimated before it runs.

A method that would not fit is skipped (a `skipped` record says why) instead of running the
machine out of memory after minutes of work on the others. The estimates are upper bounds built
from the tensors each algorithm keeps alive at once, in float64 where the emulators compute
(numdev.numerics.stages works in float64 and rounds to each stage's format):

- inputs and golden: q, k, v (float64), the golden output and one golden chunk of at most 2^24
  scores with its softmax;
- baseline: the full n_q x n_k score matrix and ~5 same-sized temporaries (scores, shifted, exp,
  rounded copies, probabilities);
- flash_emulated: one n_q x B_c block of scores with ~6 temporaries, plus the accumulator;
- sdpa_math: the score matrix in float32 with ~3 temporaries; the fused SDPA kernels
  (sdpa_flash, sdpa_efficient, sdpa_cudnn, flash_attn, triton): O(n) beyond the inputs;
- any other method: treated like baseline (the safe side).
"""

from __future__ import annotations

from numdev.bench.inputs import Shape
from numdev.runs.provenance import available_bytes

F64 = 8
FUSED = ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "flash_attn", "triton")


def inputs_and_golden_bytes(shape: Shape) -> int:
    rows = shape.batch * shape.heads
    inputs = rows * (shape.seq_q + 2 * shape.n_k) * shape.dim * F64
    output = rows * shape.seq_q * shape.dim * F64
    chunk = min(2**24, rows * shape.seq_q * shape.n_k)
    return inputs + 2 * output + 3 * chunk * F64


def method_bytes(method, shape: Shape) -> int:
    """Peak bytes `method` allocates beyond the inputs (an upper bound, see the module doc)."""
    rows = shape.batch * shape.heads
    scores = rows * shape.seq_q * shape.n_k
    outputs = 3 * rows * shape.seq_q * shape.dim * F64
    name = getattr(method, "name", "?")
    if name in FUSED:
        return outputs + 4 * rows * (shape.seq_q + 2 * shape.n_k) * shape.dim * 4
    if name == "sdpa_math":
        return outputs + 4 * scores * 4
    if name == "flash_emulated":
        block_c = min(getattr(method, "block_c", None) or 512, shape.n_k)  # 512: the largest default tile
        return outputs + 7 * rows * shape.seq_q * block_c * F64
    return outputs + 6 * scores * F64


def limit_bytes(limit_gb) -> int | None:
    """memory_limit_gb (a positive number) in bytes, or what is available now when it is null."""
    if limit_gb is None:
        return available_bytes()
    return int(float(limit_gb) * 2**30)


