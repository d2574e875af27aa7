"""precision.gemm=fp32: bf16/fp16 products as FP32 GEMMs on rounded operands (numdev.train.precision).

Held to what it claims: the same arithmetic as PyTorch's low-precision kernels up to the FP32
summation order. Where every sum is exact in FP32 (small integers), order cannot matter and the
route must equal the native kernels bit for bit, forward and backward, on any CPU; on random data
it must be the correctly rounded FP64 product of the rounded operands to within one unit in the
last place of the low-precision output.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from helpers import compose_train
from hydra.utils import instantiate

from numdev.train import precision as route
from numdev.train.precision import FP32Gemm, resolve
from numdev.train.run import train

LOW = [torch.bfloat16, torch.float16]


def _ops(a, b, bias, images, kernel):
    """One call of each routed product: (name, a function of its inputs)."""
    return {
        "linear": lambda: F.linear(a, b, bias),
        "matmul": lambda: torch.matmul(a, b.t()),
        "@": lambda: a @ b.t(),
        "rmatmul": lambda: b.t().__rmatmul__(a),
        "mm": lambda: torch.mm(a, b.t()),
        "addmm": lambda: torch.addmm(bias, a, b.t()),
        "bmm": lambda: torch.bmm(a.view(2, -1, a.shape[-1]), b.t().expand(2, -1, -1)),
        "baddbmm": lambda: torch.baddbmm(bias.expand(2, a.shape[0] // 2, -1), a.view(2, -1, a.shape[-1]), b.t().expand(2, -1, -1)),
        "conv2d": lambda: F.conv2d(images, kernel, bias[: kernel.shape[0]], stride=2),
    }


def _inputs(integer: bool, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)

    def draw(*shape):
        t = torch.randint(-4, 5, shape, generator=g).float() if integer else torch.randn(*shape, generator=g)
        return t.to(dtype).requires_grad_()

    return draw(64, 96), draw(48, 96), draw(48), draw(2, 3, 8, 8), draw(6, 3, 2, 2)


@pytest.mark.parametrize("low", LOW, ids=["bf16", "fp16"])
@pytest.mark.parametrize("autocast", [True, False], ids=["autocast", "low-precision-tensors"])
def test_exact_sums_give_the_native_kernels_bits_forward_and_backward(low, autocast):
    """Small integers: every product and sum is exact in FP32, so the order of summation cannot
    matter: the route must give the native kernels' bits, outputs and gradients."""
    results = {}
    for routed in (False, True):
        tensors = _inputs(integer=True, dtype=torch.float32 if autocast else low)
        with torch.autocast("cpu", dtype=low, enabled=autocast), (FP32Gemm() if routed else contextlib.nullcontext()):
            outs = {name: op() for name, op in _ops(*tensors).items()}
        grads = {}
        for name, out in outs.items():
            for t in tensors:
                t.grad = None
            out.float().square().sum().backward()
            grads[name] = [None if t.grad is None else t.grad.clone() for t in tensors]
        results[routed] = outs, grads
    (native_out, native_grad), (route_out, route_grad) = results[False], results[True]
    for name in native_out:
        assert route_out[name].dtype == native_out[name].dtype == low, name
        assert torch.equal(route_out[name], native_out[name]), name
        for mine, theirs in zip(route_grad[name], native_grad[name]):
            assert (mine is None) == (theirs is None), name
            if mine is not None:
                assert mine.dtype == theirs.dtype and torch.equal(mine, theirs), name


@pytest.mark.parametrize("low", LOW, ids=["bf16", "fp16"])
def test_random_operands_give_the_correctly_rounded_product_within_one_ulp(low):
    a, b, bias, images, kernel = _inputs(integer=False)
    with torch.autocast("cpu", dtype=low), FP32Gemm():
        out = F.linear(a, b, bias)
        conv = F.conv2d(images, kernel, stride=2)
    exact = F.linear(a.to(low).double(), b.to(low).double(), bias.to(low).double()).to(low)
    exact_conv = F.conv2d(images.to(low).double(), kernel.to(low).double(), stride=2).to(low)
    for mine, ref in ((out, exact), (conv, exact_conv)):
        assert mine.dtype == low
        ulp = torch.finfo(low).eps * ref.float().abs().clamp_min(torch.finfo(low).tiny)
        assert ((mine.float() - ref.float()).abs() <= ulp).all()
        assert (mine == ref).float().mean() > 0.9  # FP32 accumulation error is far below half a bf16/fp16 ulp


def test_the_route_leaves_other_calls_alone():
    """fp32 products outside autocast, fp64 operands, SDPA (the kernel under study), out= calls."""
    a = torch.randn(8, 16)
    with FP32Gemm():
        assert (a @ a.t()).dtype == torch.float32
        assert torch.equal(a.double() @ a.double().t(), (a.double() @ a.double().t()))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            q = torch.randn(1, 2, 8, 16)
            assert F.scaled_dot_product_attention(q, q, q).dtype == torch.bfloat16  # autocast's own kernel
            out = torch.empty(8, 8)
            torch.mm(a, a.t(), out=out)  # autocast refuses or computes natively: not rerouted
    calls = []

    class Counting(FP32Gemm):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in route.ROUTED:
                calls.append(route.compute_dtype([x for x in args if isinstance(x, torch.Tensor)]))
            return super().__torch_function__(func, types, args, kwargs)

    with Counting():
        _ = a @ a.t()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _ = a @ a.t()
    assert calls == [None, torch.bfloat16]


def test_auto_is_native_only_where_the_cpu_has_the_instructions(monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(route, "cpu_flags", lambda: frozenset({"avx2", "fma"}))  # AMD EPYC Zen 3
    assert resolve("auto", torch.bfloat16, "cpu")[0] == "fp32"
    assert resolve("auto", torch.float16, "cpu")[0] == "fp32"
    assert resolve("native", torch.bfloat16, "cpu") == ("native", "precision.gemm=native")
    monkeypatch.setattr(route, "cpu_flags", lambda: frozenset({"avx2", "avx512f", "avx512_bf16"}))  # Zen 5
    assert resolve("auto", torch.bfloat16, "cpu")[0] == "native"
    assert resolve("auto", torch.float16, "cpu")[0] == "fp32"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")  # oneDNN capped below its bf16 instructions
    route_, why = resolve("auto", torch.bfloat16, "cpu")
    assert route_ == "fp32" and "ONEDNN_MAX_CPU_ISA=AVX2" in why
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")  # a cap above them
    assert resolve("auto", torch.bfloat16, "cpu")[0] == "native"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "NONSENSE")  # a value oneDNN does not know: it ignores it, so no cap
    assert resolve("auto", torch.bfloat16, "cpu")[0] == "native"
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX512_CORE")  # the older name, read where the new one is unset
    assert resolve("auto", torch.bfloat16, "cpu")[0] == "fp32"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "ALL")  # the new name wins
    assert resolve("auto", torch.bfloat16, "cpu")[0] == "native"
    assert resolve("auto", torch.bfloat16, "cuda")[0] == "native"
    assert resolve("fp32", torch.float32, "cpu")[0] == "native"  # nothing in bf16/fp16 to reroute
    with pytest.raises(ValueError, match="precision.gemm='fastest': use one of auto, native, fp32"):
        resolve("fastest", torch.bfloat16, "cpu")


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true", "fp16-mixed"])
def test_a_run_records_its_route_and_trains_alike_either_way(precision, tmp_path):
    """Both routes from the same weights and data: the same dtypes everywhere, a loss equal to
    within the rounding of a handful of bf16/fp16 steps, and run.json saying which ran and why."""
    records = {}
    for gemm in ("native", "fp32"):
        records[gemm] = train(compose_train(f"precision={precision}", f"precision.gemm={gemm}", "attention=sdpa_flash",
                                            run_dir=tmp_path / gemm))
    assert records["fp32"]["precision_gemm"] == {"setting": "fp32", "route": "fp32", "why": "precision.gemm=fp32"}
    assert records["native"]["precision_gemm"]["route"] == "native"
    losses = [records[g]["final_loss"] for g in ("native", "fp32")]
    assert abs(losses[0] - losses[1]) <= 0.05 * abs(losses[0])
    plugin = instantiate(compose_train(f"precision={precision}").precision.plugin)
    assert plugin.describe_route()["setting"] == "auto"


def test_under_torch_compile_the_roundings_stay():
    """Inductor drops a cast pair x.to(bf16).float() unless it cannot see into it: compiled, the route
    must still give the rounded-operand product, bf16-valued gradients, and the gradients of the
    compiled native kernels to within the rounding of their bf16 outputs."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 32)

    def f(x):
        return torch.nn.functional.gelu(layer(x * 1.5)).float().square().sum()

    x = torch.randn(16, 64)
    exact = F.linear((x * 1.5).bfloat16().double(), layer.weight.bfloat16().double(), layer.bias.bfloat16().double())
    grads = {}
    for routed in (False, True):
        torch._dynamo.reset()
        compiled = torch.compile(f)
        layer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16), (FP32Gemm() if routed else contextlib.nullcontext()):
            compiled(x).backward()
            out = torch.compile(lambda x: layer(x * 1.5))(x)
        assert torch.equal(out, exact.bfloat16()) or not routed
        grads[routed] = layer.weight.grad.clone()
    assert torch.equal(grads[True], grads[True].bfloat16().float())  # the gradient GEMM's output rounded to bf16
    scale = grads[False].abs().max()
    assert ((grads[True] - grads[False]).abs() <= 2**-7 * scale).all()
