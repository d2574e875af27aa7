"""numdev.attention.ScoreScale: softmax(factor q k^T / sqrt(D)) v by its inner backend, forward and backward,
against the FP64 golden value; wrappers pass on what their inner backend cannot do."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import compose_train
from hydra.utils import instantiate

from numdev.attention import Eager, FlashEmulated, OutputNoise, ScoreScale, SdpaFlash, golden_attention
from numdev.numerics.stages import stage_formats


def _qkv(dtype=torch.float64, seed=0, n=96, d=32):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, n, d, generator=generator, dtype=torch.float64).to(dtype) for _ in range(3)]


@pytest.mark.parametrize("factor", [0.25, 1.0, 4.0, 16.0])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("inner", [Eager, SdpaFlash])
def test_the_logits_are_factor_times_larger_forward_and_backward(inner, causal, factor):
    q, k, v = (t.requires_grad_() for t in _qkv())
    out = ScoreScale(inner(), factor)(q, k, v, causal=causal)
    golden = golden_attention(q, k, v, scale=factor / math.sqrt(q.shape[-1]), causal=causal)
    assert torch.allclose(out, golden, rtol=0, atol=1e-12)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    grads = torch.autograd.grad((out * weights).sum(), (q, k, v))
    expected = torch.autograd.grad((golden * weights).sum(), (q, k, v))
    for got, want in zip(grads, expected):
        assert torch.allclose(got, want, rtol=0, atol=1e-10)
    assert factor == 1.0 or not torch.allclose(out, golden_attention(q, k, v, causal=causal), atol=1e-3)


def test_factor_one_is_the_inner_backend_bit_for_bit_in_bf16():
    q, k, v = _qkv(torch.bfloat16, n=600)  # two key/value blocks of PyTorch's CPU flash kernel (512)
    assert torch.equal(ScoreScale(SdpaFlash(), 1.0)(q, k, v, causal=True), SdpaFlash()(q, k, v, causal=True))


def test_a_larger_factor_sharpens_the_softmax():
    """The mechanism the control leans on: larger logits, lower attention entropy, at the same q and k."""
    q, k, _ = _qkv()
    def entropy(factor):
        p = torch.softmax(factor * q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
        return float(-(p * p.clamp_min(1e-300).log()).sum(-1).mean())
    entropies = [entropy(f) for f in (1.0, 4.0, 16.0)]
    assert entropies[0] > entropies[1] > entropies[2]
    assert entropies[0] > 0.5 * math.log(q.shape[2]) and entropies[2] < 0.25 * entropies[0]


def test_it_describes_and_tiles_as_its_inner():
    backend = ScoreScale(SdpaFlash(), 4)
    assert backend.describe() == {"backend": "score_scale", "factor": 4.0, "inner": SdpaFlash().describe()}
    assert backend.kv_tiling(1024, 1024, 32) == SdpaFlash().kv_tiling(1024, 1024, 32)


@pytest.mark.parametrize("wrapper", [lambda inner: ScoreScale(inner, 4.0), lambda inner: OutputNoise(inner, 0.1)])
def test_a_wrapper_of_a_forward_only_kernel_is_forward_only_and_names_the_inner_key(wrapper):
    cuda_model = FlashEmulated(formats=stage_formats(preset="fa2_cuda", precision="bf16"))
    reason = wrapper(cuda_model).forward_only()
    assert reason is not None and "attention.inner.formats.preset=fa2" in reason
    assert wrapper(Eager()).forward_only() is None


def test_the_bound_is_inclusive():
    assert ScoreScale(Eager(), factor=64).factor == 64.0


@pytest.mark.parametrize("factor", [0, -1, 64.5, float("nan"), float("inf"), True, "4"])
def test_bad_factors_name_the_key(factor):
    with pytest.raises(ValueError, match=r"attention\.factor=.* must be a number in \(0, 64\]"):
        ScoreScale(Eager(), factor=factor)


@pytest.mark.parametrize("wrapper", [ScoreScale, OutputNoise])
def test_an_inner_that_is_not_a_backend_is_refused(wrapper):
    with pytest.raises(ValueError, match="attention.inner must be an attention backend"):
        wrapper(inner={"backend": "eager"})
    with pytest.raises(ValueError, match=f"attention.inner is null: attention={wrapper.name} computes attention with an inner"):
        wrapper(inner=None)
    with pytest.raises(TypeError):  # no default inner in code: the config names it
        wrapper()


def test_the_config_composes_with_the_flash_kernel_inside():
    backend = instantiate(compose_train("attention=score_scale").attention)
    assert (backend.factor, backend.inner.name) == (4.0, "eager")
    backend = instantiate(compose_train("attention=score_scale", "~attention.inner.precision", "attention.factor=8",
                                        "attention.inner._target_=numdev.attention.SdpaFlash").attention)
    assert (backend.factor, backend.inner.name) == (8.0, "sdpa_flash")
