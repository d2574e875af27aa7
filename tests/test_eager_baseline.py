"""The `eager` Baseline preset is what eager PyTorch computes: held to PyTorch's own kernels.

`softmax(q @ k^T * scale) @ v` on bf16/fp16 CPU tensors rounds the matmul, then the scaled product,
computes the softmax's max, exp and row sum in FP32 and rounds P once, and accumulates P.V in FP32
before one rounding. The Baseline backend with `stage_formats("eager", p)` does the same; the only
bits it may not share come from PyTorch's softmax kernel, whose fast exp rounds some P elements the
other way, and from a BLAS that sums a bf16/fp16 GEMM in another order: no output may differ by more
than one ulp plus what the differing P elements move, and the paper's Baseline differs from PyTorch
in many times more outputs.
"""

import pytest
import torch

from numdev.attention import Baseline
from numdev.numerics.stages import stage_formats

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _inputs(dist, nq, nk, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    draw = torch.rand if dist == "uniform" else torch.randn
    return draw(1, 2, nq, d, generator=g).to(dtype), draw(1, 2, nk, d, generator=g).to(dtype), draw(1, 2, nk, d, generator=g).to(dtype)


def _ulp(x: torch.Tensor) -> torch.Tensor:
    """One unit in the last place of each element of a bf16/fp16 tensor (as float64)."""
    mantissa = {torch.bfloat16: 7, torch.float16: 10}[x.dtype]
    tiny = {torch.bfloat16: 2.0**-133, torch.float16: 2.0**-24}[x.dtype]
    _, exponent = torch.frexp(x.double().abs().clamp_min(tiny))
    return torch.ldexp(torch.ones_like(x, dtype=torch.float64), exponent - 1 - mantissa).clamp_min(tiny)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("dist,nq,nk,d,causal", [
    ("uniform", 256, 256, 64, False),
    ("normal", 256, 256, 64, False),
    ("normal", 160, 333, 128, False),  # cross attention, a scale that is not a power of two
    ("uniform", 200, 200, 128, True),
    ("normal", 300, 300, 64, True),
])
def test_eager_preset_is_pytorchs_eager_attention(precision, dist, nq, nk, d, causal):
    dtype = DTYPES[precision]
    q, k, v = _inputs(dist, nq, nk, d, dtype)
    scale = d**-0.5
    scores = q @ k.transpose(-1, -2) * scale  # PyTorch itself, on bf16/fp16 tensors
    if causal:
        scores = scores.masked_fill(torch.ones(nq, nk, dtype=torch.bool).triu(1), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    expected = probs @ v
    got = Baseline(stage_formats("eager", precision))(q, k, v, scale=scale, causal=causal)
    paper = Baseline(stage_formats("paper", precision))(q, k, v, scale=scale, causal=causal)
    assert got.dtype == dtype
    # P as the preset computes it (S from an FP32 GEMM rounded, scaled and rounded; FP32 exp, max and
    # row sum; P rounded once). Where PyTorch's softmax rounds a P element the other way (its fast
    # exp), or its bf16/fp16 GEMM sums in another order than the FP32 GEMM the preset models (a BLAS
    # may), the outputs can differ: by one output ulp, plus what the differing P elements move, plus
    # twice the classical bound on an FP32 sum's error, n * u * sum|P||v| (u = 2^-24).
    s32 = ((q.float() @ k.float().transpose(-1, -2)).to(dtype).float() * scale).to(dtype).float()
    if causal:
        s32 = s32.masked_fill(torch.ones(nq, nk, dtype=torch.bool).triu(1), float("-inf"))
    exps = torch.exp(s32 - s32.amax(dim=-1, keepdim=True))
    once = (exps / exps.sum(dim=-1, keepdim=True)).to(dtype)
    moved = (probs.double() - once.double()).abs() @ v.double().abs()
    summation = 2 * nk * 2.0**-24 * (probs.double().abs() @ v.double().abs())
    assert ((got.double() - expected.double()).abs() <= _ulp(expected) + moved + summation).all()
    # The paper's Baseline (exp and row sum rounded to the run precision) is another computation.
    differ = {name: (out != expected).float().mean().item() for name, out in (("eager", got), ("paper", paper))}
    assert differ["paper"] > 10 * differ["eager"], differ


def test_eager_preset_formats():
    f = stage_formats("eager", "bf16")
    assert (f.input.name, f.score.name, f.stats.name, f.prob.name, f.accum.name, f.output.name) == (
        "bf16", "bf16", "fp32", "bf16", "bf16", "bf16")
    assert stage_formats("eager", "fp64").stats.name == "fp64"  # never below the run precision
    # In fp32 and fp64 the eager and paper Baselines are one computation.
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, 64, 32, generator=g, dtype=torch.float64) for _ in range(3))
    for p in ("fp32", "fp64"):
        assert torch.equal(Baseline(stage_formats("eager", p))(q, k, v), Baseline(stage_formats("paper", p))(q, k, v))
