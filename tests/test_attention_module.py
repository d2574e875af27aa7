"""The one Attention module: nn.MultiheadAttention's parameters and results, any backend behind it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from numdev.attention import Baseline, FlashEmulated, SdpaFlash, SdpaMath, available_backends, build_backend
from numdev.models.attention import Attention, name_attention_layers, set_attention_backend

CPU_BACKENDS = {
    "baseline": Baseline,
    "flash_emulated": lambda: FlashEmulated(block_r=4, block_c=4),  # several tiles: the online softmax rescales
    "sdpa_math": SdpaMath,
    "sdpa_flash": SdpaFlash,
}


def _mha_pair(dim=32, heads=4, kv_dim=None, causal=False, backend=None):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(dim, heads, batch_first=True, kdim=kv_dim, vdim=kv_dim)
    ours = Attention(dim, heads, backend or Baseline(), kv_dim=kv_dim, causal=causal)
    assert list(ours.state_dict()) == list(mha.state_dict())  # same names, same order
    ours.load_state_dict(mha.state_dict())
    return mha, ours


@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_matches_multihead_attention(causal):
    mha, ours = _mha_pair(causal=causal)
    x = torch.randn(3, 10, 32)
    mask = nn.Transformer.generate_square_subsequent_mask(10) if causal else None
    expected = mha(x, x, x, attn_mask=mask, need_weights=False)[0]
    torch.testing.assert_close(ours(x), expected, rtol=1e-5, atol=1e-6)


def test_cross_attention_matches_multihead_attention_with_kdim():
    mha, ours = _mha_pair(kv_dim=16)
    x, context = torch.randn(2, 9, 32), torch.randn(2, 5, 16)
    expected = mha(x, context, context, need_weights=False)[0]
    torch.testing.assert_close(ours(x, context), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(CPU_BACKENDS))
@pytest.mark.parametrize("causal", [False, True])
def test_every_cpu_backend_gives_the_same_attention_and_gradients(name, causal):
    _, reference = _mha_pair(causal=causal)
    _, ours = _mha_pair(causal=causal, backend=CPU_BACKENDS[name]())
    x = torch.randn(2, 12, 32, requires_grad=True)
    out_ref, out = reference(x), ours(x)
    torch.testing.assert_close(out, out_ref, rtol=1e-4, atol=1e-5)
    out_ref.square().sum().backward()
    grad_ref = x.grad.clone()
    x.grad = None
    out.square().sum().backward()
    torch.testing.assert_close(x.grad, grad_ref, rtol=1e-4, atol=1e-5)
    for (n, p), (_, p_ref) in zip(ours.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-4, atol=1e-5, msg=n)


def test_cpu_backends_are_the_ones_available():
    assert set(CPU_BACKENDS) <= set(available_backends("cpu", torch.float32))


class Recorder:
    """A backend that records what it is called with (and delegates to the baseline)."""

    name = "recorder"

    def __init__(self):
        self.calls = []

    def __call__(self, q, k, v, scale=None, causal=False):
        self.calls.append({"dtype": q.dtype, "autocast": torch.is_autocast_enabled("cpu"), "shape": tuple(q.shape), "causal": causal})
        return Baseline()(q, k, v, scale=scale, causal=causal)


def test_autocast_stops_at_the_backend_and_qkv_arrive_in_the_compute_dtype():
    recorder = Recorder()
    attention = Attention(32, 4, recorder)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attention(torch.randn(2, 6, 32))
    assert recorder.calls == [{"dtype": torch.bfloat16, "autocast": False, "shape": (2, 4, 6, 8), "causal": False}]
    assert out.dtype == torch.bfloat16  # out_proj ran under autocast again


def test_backend_switch_and_layer_names_leave_parameters_alone():
    model = nn.ModuleDict({"a": Attention(16, 2, Baseline()), "b": nn.ModuleList([Attention(16, 2, Baseline(), kv_dim=8)])})
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert name_attention_layers(model) == ["a", "b.0"]
    assert model["b"][0].layer_name == "b.0"
    flash = build_backend("sdpa_flash")
    set_attention_backend(model, flash)
    assert all(m.backend is flash for m in model.modules() if isinstance(m, Attention))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_bad_uses_are_clear_errors():
    with pytest.raises(ValueError, match="not divisible by 3 heads"):
        Attention(32, 3, Baseline())
    with pytest.raises(ValueError, match="needs an attention backend"):
        Attention(32, 4, None)
    attention = Attention(32, 4, Baseline(), kv_dim=8)
    with pytest.raises(ValueError, match="cross-attention needs a context"):
        attention(torch.randn(1, 3, 32))
