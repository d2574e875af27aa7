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


@pytest.mark.parametrize("causal", [False, True])
def test_fp32_scores_are_the_softmax_of_fp32_scores_rounded_once_then_p_v_under_autocast(causal):
    q, k, v = _qkv()
    scale = 32**-0.5
    scores = q.float() @ k.float().transpose(-1, -2) * scale
    if causal:
        scores = scores.masked_fill(torch.ones(96, 96, dtype=torch.bool).triu(1), float("-inf"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = torch.softmax(scores, dim=-1).bfloat16() @ v
    got = Eager(precision="bf16-mixed", scores="fp32")(q, k, v, scale=scale, causal=causal)
    assert got.dtype == torch.bfloat16 and torch.equal(got, expected)


def test_fp32_scores_are_closer_to_fp64_than_bf16_scores():
    """What the option removes: the bf16 rounding of q k^T and of the scaled scores (large logits make it matter)."""
    for seed in range(3):
        q, k, v = _qkv(n=256, dim=64, seed=seed)
        q = (q.float() * 3).bfloat16()  # logits of a few units: the scores' rounding error is ~2^-9 of them
        golden = golden_attention(q.double(), k.double(), v.double())
        error = {name: (backend(q, k, v).double() - golden).abs().mean().item() for name, backend in
                 (("bf16 scores", Eager(precision="bf16-mixed")), ("fp32 scores", Eager(precision="bf16-mixed", scores="fp32")))}
        assert error["fp32 scores"] < error["bf16 scores"], error


def test_fp32_scores_without_autocast():
    q, k, v = (t.float() for t in _qkv())
    assert torch.equal(Eager(precision="32-true", scores="fp32")(q, k, v), Eager(precision="32-true")(q, k, v))
    qb, kb, vb = _qkv()  # bf16-true: bf16 tensors, no autocast; P rounded to bf16 before P V
    got = Eager(precision="bf16-true", scores="fp32")(qb, kb, vb)
    expected = torch.softmax(qb.float() @ kb.float().transpose(-1, -2) * 32**-0.5, dim=-1).bfloat16() @ vb
    assert got.dtype == torch.bfloat16 and torch.equal(got, expected)


def test_fp32_scores_train():
    q, k, v = (t.float().requires_grad_() for t in _qkv())
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        out = Eager(precision="bf16-mixed", scores="fp32")(q.bfloat16(), k.bfloat16(), v.bfloat16(), causal=True)
    out.float().square().sum().backward()
    assert all(t.grad is not None and bool(torch.isfinite(t.grad).all()) and t.grad.abs().sum() > 0 for t in (q, k, v))


@pytest.mark.parametrize("scores", ["bf16", "fp64", 32])
def test_other_score_formats_are_refused(scores):
    with pytest.raises(ValueError, match="scores=.*use null"):
        Eager(scores=scores)
