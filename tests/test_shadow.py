"""Shadow attention: the per-call deviation (absolute, signed, relative) equals a direct computation, and training is unchanged."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import compose_train
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from numdev.attention import Eager, OutputNoise, build_backend
from numdev.models.attention import Attention
from numdev.models.shadow import AttentionShadow, pooled
from numdev.numerics.stages import stage_formats
from numdev.runs.layout import RunDir, read_shadow_csv
from numdev.train.callbacks.shadow import tensorboard_metrics
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
        signed = a.double() - b.double()
        assert got[quantity]["bias"] == pytest.approx(signed.mean().item(), rel=1e-12, abs=1e-300), quantity
        rms = lambda t: t.square().mean().sqrt().item()  # noqa: E731
        assert got[quantity]["rel_rms"] == pytest.approx(rms(signed) / rms(b.double()), rel=1e-12), quantity
        assert got[quantity]["count"] == a.numel()
    assert got["out"]["max_abs"] > 0 and got["dq"]["max_abs"] > 0  # bf16: the backends do differ


class _Call:  # what the shadow reads of the Attention module it observes
    layer_name, causal = "layer", False


def _observed(primary: list[float], shadow: list[float], layer: str = "layer", quantity: str = "out") -> dict:
    """One call through AttentionShadow with known outputs: the primary's `out` and a shadow backend returning `shadow`."""
    probe = AttentionShadow(lambda q, k, v, causal: torch.tensor(shadow), backward=False)
    probe.recording = True
    call = _Call()
    call.layer_name = layer
    q = torch.zeros(1, 1, 1, 1)  # unread: the shadow backend above returns its known output
    probe(call, q, q, q, torch.tensor(primary))
    return probe.collect()[0]


def test_the_signed_and_relative_deviation_of_known_tensors():
    """out - shadow = [0, 1, -2, 2]: bias 1/4; rms 3/2 against the shadow's rms sqrt(31/4)."""
    row = _observed([1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 5.0, 2.0])
    assert row["bias"] == 0.25 and row["diff_rms"] == 1.5 and row["shadow_rms"] == math.sqrt(31 / 4)
    assert row["rel_rms"] == 1.5 / math.sqrt(31 / 4) and row["count"] == 4
    assert (row["max_abs"], row["mean_abs"], row["ref_max_abs"]) == (2.0, 1.25, 4.0)
    assert _observed([3.0, -1.0], [3.0, -1.0])["rel_rms"] == 0.0  # no deviation (and 0/0 reads 0)
    assert _observed([1.0, -1.0], [0.0, 0.0])["rel_rms"] == math.inf


def test_all_layers_pool_every_element():
    """shadow/all: bias and rel_rms of the two calls' elements as one tensor; max_abs the larger layer's."""
    rows = [_observed([1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 5.0, 2.0], "a"), _observed([2.0, 2.0], [1.0, 4.0], "b")]
    metrics = tensorboard_metrics(rows)
    # all six elements: out - shadow = [0, 1, -2, 2, 1, -2], shadow = [1, 1, 5, 2, 1, 4]
    assert metrics["shadow/all/out_bias"] == pytest.approx(0 / 6, abs=1e-15)
    assert metrics["shadow/all/out_rel_rms"] == pytest.approx(math.sqrt(14 / 48), rel=1e-15)
    assert metrics["shadow/all/out_max_abs"] == 2.0 and metrics["shadow/b/out_bias"] == -0.5
    assert metrics["shadow/a/out_rel_rms"] == rows[0]["rel_rms"]


@pytest.mark.parametrize("mode", ["unbiased", "biased"])
def test_rel_rms_reads_output_noises_delta(mode):
    """Output noise of known size delta, shadowed by its own inner backend: out_rel_rms is delta (exactly,
    up to fp32 rounding, when biased; within sampling error of the n elements' z^2 when unbiased), and the
    biased bias is delta times the shadow's mean magnitude (biased noise is out + delta |out|)."""
    layer = Attention(32, 4, OutputNoise(Eager(), delta=0.3, seed=1, mode=mode))
    layer.layer_name = "layer"
    shadow = AttentionShadow(Eager(), backward=False).attach(layer)
    shadow.recording = True
    x = torch.randn(4, 64, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        q, k, v = layer.project_qkv(x)
        clean = Eager()(q, k, v)
        layer(x)
    (row,) = shadow.collect()
    if mode == "biased":
        assert row["rel_rms"] == pytest.approx(0.3, rel=1e-6)
        assert row["bias"] == pytest.approx(0.3 * clean.double().abs().mean().item(), rel=1e-5)
    else:
        weight = clean.double().square().flatten()  # rel_rms^2 / delta^2 is the mean of z^2 weighted by out^2
        sd = math.sqrt(2 * float(weight.square().sum())) / float(weight.sum())
        assert abs(row["rel_rms"] ** 2 / 0.3**2 - 1) < 5 * sd
        assert abs(row["bias"]) < 5 * 0.3 * row["shadow_rms"] / math.sqrt(clean.numel())


def test_a_shadow_csv_from_before_the_signed_columns_still_reads(tmp_path):
    path = tmp_path / "shadow.csv"
    path.write_text("step,layer,quantity,max_abs,mean_abs,ref_max_abs\n0,blocks.0.attn,out,0.5,0.25,2.0\n")
    (row,) = read_shadow_csv(path)
    assert row["max_abs"] == 0.5 and row["bias"] is None and row["rel_rms"] is None and row["count"] is None
    path.write_text("step,layer,quantity,max_abs,mean_abs\n0,blocks.0.attn,out,0.5,0.25\n")  # an old column missing: refused
    with pytest.raises(ValueError, match="not a table with the columns"):
        read_shadow_csv(path)


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
    assert all(0 < r["rel_rms"] < 0.1 and abs(r["bias"]) < r["diff_rms"] for r in late if r["quantity"] == "out")
    events = EventAccumulator(str(RunDir(tmp_path / "shadowed").events()))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"shadow/all/out_bias", "shadow/all/out_rel_rms", "shadow/blocks.0.attn/out_bias", "shadow/blocks.0.attn/out_rel_rms"} <= tags
    logged = {p.step: p.value for p in events.Scalars("shadow/all/out_rel_rms")}
    out_rows = [r for r in late if r["quantity"] == "out"]
    assert logged[3] == pytest.approx(pooled(out_rows)["rel_rms"], rel=1e-6)  # TensorBoard keeps float32
