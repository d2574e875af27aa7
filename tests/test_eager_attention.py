"""Eager attention (the study's reference) is exactly eager PyTorch under the run's autocast,
and what that means on CPU is pinned down here."""

import pytest
import torch

from numdev.attention import Baseline, Eager, golden_attention
from numdev.models.attention import Attention
from numdev.numerics.stages import stage_formats


def _qkv(n=96, dim=32, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 3, n, dim, generator=g).to(dtype) for _ in range(3))


def test_cpu_autocast_runs_matmul_and_softmax_in_bf16():
    q, k, v = _qkv()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        scores = q @ k.transpose(-1, -2) * 0.25
        probs = torch.softmax(scores, dim=-1)
        out = probs @ v
        assert torch.softmax(scores.float(), dim=-1).dtype == torch.float32  # no upcast of its own
    # Unlike CUDA autocast, CPU autocast does not put softmax on its fp32 list:
    assert (scores.dtype, probs.dtype, out.dtype) == (torch.bfloat16,) * 3


def test_cpu_bf16_softmax_is_fp32_softmax_rounded_once():
    """max, exp and sum run in fp32 inside the kernel; only P is rounded (unlike the paper Baseline)."""
    scores = torch.randn(4, 3, 64, 257, generator=torch.Generator().manual_seed(1)).bfloat16() * 4
    eager = torch.softmax(scores, dim=-1).view(torch.int16).int()
    once = torch.softmax(scores.float(), dim=-1).bfloat16().view(torch.int16).int()
    # Bit patterns of positive bf16 numbers are ordered: |difference| is the distance in ulps.
    # The kernel's fast fp32 exp moves a handful of values (5 in 10^6 here) across a rounding boundary.
    assert (eager - once).abs().max() <= 1 and (eager != once).float().mean() < 1e-4


@pytest.mark.parametrize("causal", [False, True])
def test_eager_equals_the_literal_expression_under_autocast(causal):
    q, k, v = _qkv()
    scale = 32**-0.5
    with torch.autocast("cpu", dtype=torch.bfloat16):
        scores = q @ k.transpose(-1, -2) * scale
        if causal:
            scores = scores.masked_fill(torch.ones(96, 96, dtype=torch.bool).triu(1), float("-inf"))
        expected = torch.softmax(scores, dim=-1) @ v
    # The model switches autocast off around every backend; Eager switches the run's back on.
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        got = Eager(precision="bf16-mixed")(q, k, v, scale=scale, causal=causal)
    assert got.dtype == torch.bfloat16 and torch.equal(got, expected)


def test_eager_inside_the_model_equals_plain_pytorch_attention_under_autocast():
    torch.manual_seed(0)
    layer = Attention(64, 2, Eager(precision="bf16-mixed"))
    x = torch.randn(2, 40, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = layer(x)
        q, k, v = layer.project_qkv(x)
        expected = layer.project_out(torch.softmax(q @ k.transpose(-1, -2) * 32**-0.5, dim=-1) @ v)
    assert torch.equal(got, expected)


def test_eager_is_not_the_paper_baseline_and_is_closer_to_fp64():
    q, k, v = _qkv(n=256, dim=64)
    golden = golden_attention(q.double(), k.double(), v.double())
    eager = Eager(precision="bf16-mixed")(q, k, v)
    paper = Baseline(stage_formats("paper", "bf16"))(q, k, v)
    assert not torch.equal(eager, paper)
    error = {name: (out.double() - golden).abs().mean().item() for name, out in (("eager", eager), ("paper", paper))}
    assert error["eager"] < error["paper"], error


def test_the_fp32_truth_computes_in_fp32_and_hands_back_the_input_dtype():
    q, k, v = _qkv()
    got = Eager(precision="bf16-mixed", dtype="fp32")(q, k, v, scale=0.2)
    expected = (torch.softmax(q.float() @ k.float().transpose(-1, -2) * 0.2, dim=-1) @ v.float()).bfloat16()
    assert got.dtype == torch.bfloat16 and torch.equal(got, expected)


def test_without_autocast_eager_is_plain_fp32_and_bad_dtypes_are_refused():
    q, k, v = _qkv(dtype=torch.float32)
    expected = torch.softmax(q @ k.transpose(-1, -2) * 0.1, dim=-1) @ v
    assert torch.equal(Eager(precision="fp32")(q, k, v, scale=0.1), expected)
    with pytest.raises(ValueError, match="eager attention: dtype='bf16'"):
        Eager(dtype="bf16")
