"""Shadow attention: the per-call deviation equals a direct computation, and training is unchanged."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import compose_train

from numdev.attention import build_backend
from numdev.models.attention import Attention
from numdev.models.shadow import AttentionShadow
from numdev.numerics.stages import stage_formats
from numdev.runs.layout import read_shadow_csv
from numdev.train.run import train


def _layer(primary, kv_dim=None):
    torch.manual_seed(0)
    layer = Attention(32, 4, primary, kv_dim=kv_dim)
    layer.layer_name = "layer"
    return layer.to(torch.bfloat16)


@pytest.mark.parametrize("kv_dim", [None, 24])
def test_forward_and_backward_deviation_equal_a_direct_computation(kv_dim):
    primary, other = build_backend("sdpa_flash"), build_backend("baseline", formats=stage_formats("paper", "bf16"))
    layer = _layer(primary, kv_dim)
    x = torch.randn(2, 40, 32, dtype=torch.bfloat16)
    context = torch.randn(2, 7, kv_dim, dtype=torch.bfloat16) if kv_dim else None
    upstream = torch.randn(2, 40, 32, dtype=torch.bfloat16)

    shadow = AttentionShadow(other).attach(layer)
    shadow.recording = True
    layer(x, context).backward(upstream)
    shadow.backward_deviation()
    got = {row["quantity"]: row for row in shadow.collect()}

    # The same quantities by hand: both backends on the projections' q, k, v and the same dO.
    q, k, v = (t.detach().requires_grad_(True) for t in layer.project_qkv(x, context))
    out_primary = primary(q, k, v)
    d_out = torch.autograd.grad(layer.project_out(out_primary), out_primary, upstream)[0]
    grads_primary = torch.autograd.grad(out_primary, (q, k, v), d_out)
    out_other = other(q, k, v)
    grads_other = torch.autograd.grad(out_other, (q, k, v), d_out)
    expected = {"out": (out_primary, out_other), **{n: pair for n, pair in zip(("dq", "dk", "dv"), zip(grads_primary, grads_other))}}
    for quantity, (a, b) in expected.items():
        diff = (a.float() - b.float()).abs()
        assert got[quantity]["max_abs"] == diff.max().item(), quantity
        assert got[quantity]["mean_abs"] == pytest.approx(diff.mean().item(), rel=1e-6), quantity
        assert got[quantity]["ref_max_abs"] == a.float().abs().max().item()
    assert got["out"]["max_abs"] > 0 and got["dq"]["max_abs"] > 0  # bf16: the backends do differ


def test_a_shadow_identical_to_the_primary_reads_zero_and_does_not_record_when_off():
    layer = _layer(build_backend("sdpa_math"))
    shadow = AttentionShadow(build_backend("sdpa_math")).attach(layer)
    layer(torch.randn(1, 9, 32, dtype=torch.bfloat16)).sum().backward()
    assert shadow.collect() == []  # not recording
    shadow.recording = True
    layer(torch.randn(1, 9, 32, dtype=torch.bfloat16)).sum().backward()
    shadow.backward_deviation()
    rows = shadow.collect()
    assert {r["quantity"] for r in rows} == {"out", "dq", "dk", "dv"}
    assert all(r["max_abs"] == 0.0 for r in rows)
    shadow.detach()
    assert layer.probe is None


def test_training_with_a_shadow_follows_the_same_trajectory(tmp_path):
    common = ("attention=sdpa_flash", "precision=bf16-mixed")
    train(compose_train(*common, run_dir=tmp_path / "plain"))
    train(compose_train(*common, "attention@shadow=baseline", "callbacks.shadow.every_n_steps=1", run_dir=tmp_path / "shadowed"))
    index = lambda d: json.loads((d / "weights" / "index.json").read_text())["snapshots"]  # noqa: E731
    assert index(tmp_path / "plain") == index(tmp_path / "shadowed")  # same sha256 at every step

    rows = read_shadow_csv(tmp_path / "shadowed" / "shadow.csv")
    assert sorted({r["step"] for r in rows}) == [0, 1, 2, 3]
    layers = {r["layer"] for r in rows}
    assert layers == {"blocks.0.attn", "blocks.0.cross_attn", "text.encoder.transformer.resblocks.0.attn"}
    assert {r["quantity"] for r in rows} == {"out", "dq", "dk", "dv"}
    late = [r for r in rows if r["step"] == 3]
    assert all(r["max_abs"] > 0 for r in late if r["quantity"] == "out")  # bf16 flash vs bf16 baseline
    assert all(r["max_abs"] > 0 for r in late if r["quantity"] == "dv")
