"""The Triton FlashAttention kernel (kernels/flash_attention.py, backend `triton`).

CPU tests run the kernels in Triton's interpreter (interpret=True: no environment variable needed)
and compile them for H100/A100 without a GPU; GPU tests are marked `gpu` and skip without CUDA.
Bounds are in units of eps(dtype) * max|reference|; docs/triton.md records what they measured.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import tempfile

import pytest
import torch
import triton

from numdev.attention import BackendUnavailable, FlashEmulated, available_backends, build_backend, golden_attention
from numdev.kernels import flash_attention as fa
from numdev.numerics.stages import stage_formats

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _qkv(n_q, n_k, dim=32, dtype=torch.float32, batch=1, heads=2, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    shapes = ((batch, heads, n_q, dim), (batch, heads, n_k, dim), (batch, heads, n_k, dim))
    return tuple(torch.randn(s, generator=g).to(device=device, dtype=dtype) for s in shapes)


def _emulator(dtype, block_r, block_c, variant="fa2", stats="fp32", accum="fp32"):
    """flash_emulated with the formats the kernel's knobs stand for."""
    run = _NAMES[dtype]
    formats = stage_formats(
        "fa2", run, stats=run if stats == "input" else "fp32", accum=run if accum == "input" else "fp32"
    )
    return FlashEmulated(formats, block_r=block_r, block_c=block_c, variant=variant)


def _in_eps(diff: torch.Tensor, ref: torch.Tensor, dtype) -> float:
    """max|diff| in units of eps(dtype) * max|ref|."""
    return diff.abs().max().item() / (torch.finfo(dtype).eps * ref.abs().max().item())


# --- forward vs the emulator and the golden value (interpreter) ---------------------------------

# (dtype, variant, stats, accum, causal, n_q, n_k, block_r, block_c)
EMULATOR_CASES = [
    (torch.float32, "fa2", "fp32", "fp32", False, 100, 100, 32, 16),
    (torch.float32, "fa2", "input", "input", True, 70, 150, 16, 64),
    (torch.float32, "fa1", "fp32", "fp32", True, 150, 40, 32, 16),
    (torch.float16, "fa2", "fp32", "fp32", False, 70, 150, 32, 16),
    (torch.float16, "fa2", "fp32", "fp32", True, 100, 100, 16, 64),
    (torch.float16, "fa2", "input", "fp32", True, 150, 40, 32, 16),
    (torch.float16, "fa2", "input", "input", False, 100, 100, 32, 16),
    (torch.float16, "fa1", "fp32", "fp32", True, 70, 150, 32, 16),
    (torch.float16, "fa1", "input", "input", True, 100, 100, 16, 64),
]


@pytest.mark.parametrize("dtype,variant,stats,accum,causal,n_q,n_k,block_r,block_c", EMULATOR_CASES)
def test_forward_matches_emulator(dtype, variant, stats, accum, causal, n_q, n_k, block_r, block_c):
    """Same tiles, formats and formula (exp2=False): only the interpreter's own fp32 rounding
    (numpy's exp and matmul against torch's) separates the two."""
    q, k, v = _qkv(n_q, n_k, dtype=dtype, seed=n_q + n_k)
    knobs = fa.Knobs(block_m=block_r, block_n=block_c, variant=variant, stats=stats, accum=accum, exp2=False)
    out, lse = fa.forward(q, k, v, causal=causal, knobs=knobs, interpret=True)
    emulated = _emulator(dtype, block_r, block_c, variant, stats, accum)(q, k, v, causal=causal)
    assert out.dtype == dtype and out.shape == q.shape and lse.shape == q.shape[:3]
    diff = out.double() - emulated.double()
    if dtype == torch.float32:
        assert _in_eps(diff, emulated, dtype) <= 16  # measured <= 7.7 over 96 configurations
    else:
        # fp16: a rare one-ulp flip of a rounded P or output (measured <= 0.4 eps * max, < 0.5 %).
        assert _in_eps(diff, emulated, dtype) <= 1
        assert (diff != 0).double().mean().item() <= 0.02


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_default_knobs_as_accurate_as_emulated_fa2(dtype, causal):
    """Defaults (FA2 numerics: exp2, fp32 stats/accum, default tiles) vs the golden value."""
    q, k, v = _qkv(150, 130, dim=64, dtype=dtype, seed=3)
    out, _ = fa.forward(q, k, v, causal=causal, interpret=True)
    golden = golden_attention(q, k, v, causal=causal)
    block_r, block_c = fa.default_blocks(64)
    emulated = _emulator(dtype, block_r, block_c)(q, k, v, causal=causal)
    error = _in_eps(out.double() - golden, golden, dtype)
    assert error <= _in_eps(emulated.double() - golden, golden, dtype) + 1
    assert error <= (8 if dtype == torch.float32 else 1)


def test_lse_is_the_log_sum_exp():
    q, k, v = _qkv(40, 70, dtype=torch.float32)
    scores = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    expected = torch.logsumexp(scores, dim=-1)
    _, lse_e = fa.forward(q, k, v, knobs=fa.Knobs(block_m=16, block_n=16, exp2=False), interpret=True)
    _, lse_2 = fa.forward(q, k, v, knobs=fa.Knobs(block_m=16, block_n=16, exp2=True), interpret=True)
    torch.testing.assert_close(lse_e.double(), expected, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(lse_2.double(), expected / math.log(2), rtol=1e-6, atol=1e-5)  # log2 units


def test_strided_inputs_and_explicit_scale():
    """A (B, N, H, D) layout viewed as (B, H, N, D), as attention modules produce it."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 50, 3, 32, generator=g).transpose(1, 2) for _ in range(3))
    assert not q.is_contiguous()
    out, _ = fa.forward(q, k, v, scale=0.3, causal=True, knobs=fa.Knobs(block_m=16, block_n=32), interpret=True)
    golden = golden_attention(q, k, v, scale=0.3, causal=True)
    assert _in_eps(out.double() - golden, golden, torch.float32) <= 8


# --- backward (interpreter) ---------------------------------------------------------------------


def _reference_attention(q, k, v, causal):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _reference_grads(q, k, v, grad_out, causal, dtype):
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    _reference_attention(*leaves, causal).backward(grad_out.to(dtype))
    return [t.grad.double() for t in leaves]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("causal,n_q,n_k", [(False, 100, 60), (True, 70, 150), (True, 150, 40)])
def test_backward_matches_autograd(dtype, causal, n_q, n_k):
    """Against autograd in fp64; fp16 with flash-attention's rule: error <= 3x that of the same
    math done by torch in fp16 (fp32: relative error <= 1e-5)."""
    q, k, v = _qkv(n_q, n_k, dtype=dtype, seed=7)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(8)).to(dtype)
    backend = build_backend("triton", block_r=32, block_c=16, interpret=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    backend(*leaves, causal=causal).backward(grad_out)
    exact = _reference_grads(q, k, v, grad_out, causal, torch.float64)
    low = _reference_grads(q, k, v, grad_out, causal, dtype)
    for name, leaf, ref, ref_low in zip("qkv", leaves, exact, low):
        assert leaf.grad.dtype == dtype
        error = (leaf.grad.double() - ref).abs().max().item()
        if dtype == torch.float32:
            assert error <= 1e-5 * ref.abs().max().item(), name
        else:
            assert error <= 3 * (ref_low - ref).abs().max().item(), name


# --- the backend: registry, interpreter switch, bad input ----------------------------------------


def test_backend_is_registered_and_describes_its_knobs():
    backend = build_backend("triton", block_r=32, block_c=16, stats="input", variant="fa1", interpret=True)
    q, k, v = _qkv(20, 20)
    backend(q, k, v)
    record = backend.describe()
    assert record["backend"] == "triton"
    assert (record["tiles.block_r"], record["tiles.block_c"]) == (32, 16)
    assert (record["stats"], record["accum"], record["variant"], record["exp2"]) == ("input", "fp32", "fa1", True)


def test_defaults_are_fa2():
    knobs = fa.Knobs()
    assert (knobs.stats, knobs.accum, knobs.variant, knobs.exp2) == ("fp32", "fp32", "fa2", True)
    assert knobs.blocks(64) == (128, 128) and knobs.blocks(128) == (128, 64)


def test_interpreter_is_chosen_per_call_not_per_process(monkeypatch):
    """TRITON_INTERPRET only counts when interpret=None, and is read at the call."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    before = dict(os.environ)
    q, k, v = _qkv(20, 20)
    assert fa.kernels(True) is not fa.kernels(False)
    assert dict(os.environ) == before  # loading the interpreted copy leaves the environment alone
    follow_env = build_backend("triton", block_r=16, block_c=16)
    with pytest.raises(BackendUnavailable, match="interpret=True or TRITON_INTERPRET=1"):
        follow_env(q, k, v)
    assert "triton" not in available_backends("cpu", torch.float32)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "triton" in available_backends("cpu", torch.float32)
    explicit = build_backend("triton", block_r=16, block_c=16, interpret=True)
    torch.testing.assert_close(follow_env(q, k, v), explicit(q, k, v), rtol=0, atol=0)


@pytest.mark.parametrize(
    "dim,dtype,interpret,message",
    [
        (48, torch.float32, True, "head dims 16, 32, 64, 128"),
        (256, torch.float16, True, "head dims 16, 32, 64, 128"),
        (32, torch.bfloat16, True, "interpreter cannot run bfloat16"),
        (32, torch.float64, True, "takes float32 or float16"),
        (32, torch.float16, False, "runs on CUDA GPUs"),
    ],
)
def test_unsupported_inputs_name_what_is_supported(dim, dtype, interpret, message):
    q = torch.zeros(1, 1, 8, dim, dtype=dtype)
    with pytest.raises(BackendUnavailable, match=message):
        build_backend("triton", interpret=interpret)(q, q, q)
    with pytest.raises(ValueError, match=message):
        fa.forward(q, q, q, interpret=interpret)


@pytest.mark.parametrize(
    "options,message",
    [
        ({"block_r": 48}, "block_m=48 is not supported"),
        ({"block_c": 8}, "block_n=8 is not supported"),
        ({"stats": "bf16"}, "stats='bf16' is not supported"),
        ({"accum": "fp16"}, "accum='fp16' is not supported"),
        ({"variant": "fa3"}, "unknown variant"),
    ],
)
def test_bad_knobs_fail_at_construction(options, message):
    with pytest.raises(ValueError, match=message):
        build_backend("triton", **options)


# --- the GPU compiler, without a GPU ------------------------------------------------------------


def test_forward_compiles_for_h100_with_knobs_compiled_out():
    """The interpreter never runs Triton's compiler; this does (for sm_90, no GPU needed). A knob
    at its default is a compile-time constant, so the perturbed kernel has extra conversions and
    the default one has none."""
    default = fa.compile_for_gpu(90, 64, "bf16")["_fwd_kernel"].asm["ptx"]
    perturbed = fa.compile_for_gpu(90, 64, "bf16", knobs=fa.Knobs(stats="input", accum="input"))
    perturbed = perturbed["_fwd_kernel"].asm["ptx"]
    assert "wgmma" in default  # Hopper tensor cores
    assert perturbed.count("cvt.rn.bf16") > default.count("cvt.rn.bf16")


def _stack_bytes(compiled) -> int:
    """Per-thread stack frame of a compiled kernel (where registers spill), from cuobjdump."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"STACK:(\d+)", usage)[1])


@pytest.mark.slow
@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_all_kernels_compile_for_gpus_without_spilling(arch, head_dim, causal):
    """A100 (sm_80) and H100 (sm_90), default knobs: the tiles and warps keep every
    accumulator in registers (a spill would cost far more than any knob)."""
    for dtype in ("bf16", "fp16"):
        compiled = fa.compile_for_gpu(arch, head_dim, dtype, causal)
        assert set(compiled) == {"_fwd_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel"}
        assert {name: _stack_bytes(k) for name, k in compiled.items()} == dict.fromkeys(compiled, 0)


# --- on the GPU ---------------------------------------------------------------------------------

GPU_DTYPES = [torch.float16, torch.bfloat16]


def _flash_rule_refs(q, k, v, causal):
    """flash-attention's references: fp32 math from the low-precision inputs, and the same math
    in the low precision itself ("PyTorch low precision")."""
    ref = _reference_attention(q.float(), k.float(), v.float(), causal)
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q * scale) @ k.transpose(-1, -2)  # reordered as in flash-attention's attention_ref
    if causal:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    low = torch.softmax(scores, dim=-1).to(v.dtype) @ v
    return ref, low


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_flash_rule_forward_and_backward(dtype, causal, head_dim):
    q, k, v = _qkv(1000, 1000, dim=head_dim, dtype=dtype, batch=4, heads=6, device="cuda")
    grad_out = torch.randn_like(q)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = build_backend("triton")(*leaves, causal=causal)
    out.backward(grad_out)
    ref_leaves = [t.float().requires_grad_() for t in (q, k, v)]
    low_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = _reference_attention(*ref_leaves, causal)
    _, low = _flash_rule_refs(*low_leaves, causal)
    assert (out.float() - ref).abs().max() <= 2 * (low.float() - ref).abs().max()
    ref.backward(grad_out.float())
    low.backward(grad_out)
    for leaf, r, lo in zip(leaves, ref_leaves, low_leaves):
        assert (leaf.grad.float() - r.grad).abs().max() <= 3 * (lo.grad.float() - r.grad).abs().max()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("causal,n_q,n_k", [(False, 1000, 1000), (True, 1000, 1000), (False, 700, 1300)])
def test_gpu_close_to_sdpa_flash(dtype, causal, n_q, n_k):
    q, k, v = _qkv(n_q, n_k, dim=128, dtype=dtype, batch=2, heads=4, device="cuda")
    out = build_backend("triton")(q, k, v, causal=causal)
    sdpa = build_backend("sdpa_flash")(q, k, v, causal=causal)
    ref, low = _flash_rule_refs(q, k, v, causal)
    assert (out.float() - ref).abs().max() <= 2 * (low.float() - ref).abs().max()
    assert (out.float() - sdpa.float()).abs().max() <= 2 * (low.float() - ref).abs().max()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.skipif(not CUDA or "flash_attn" not in available_backends("cuda", torch.float16), reason="flash-attn not installed")
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_close_to_flash_attn(dtype, causal):
    q, k, v = _qkv(1000, 1000, dim=128, dtype=dtype, batch=4, heads=6, device="cuda")
    out = build_backend("triton")(q, k, v, causal=causal)
    theirs = build_backend("flash_attn")(q, k, v, causal=causal)
    ref, low = _flash_rule_refs(q, k, v, causal)
    assert (out.float() - ref).abs().max() <= 2 * (low.float() - ref).abs().max()
    assert (out.float() - theirs.float()).abs().max() <= 2 * (low.float() - ref).abs().max()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize(
    "variant,stats,accum,causal", [("fa2", "fp32", "fp32", True), ("fa2", "input", "input", False), ("fa1", "input", "fp32", True)]
)
def test_gpu_matches_emulator(dtype, variant, stats, accum, causal):
    """On the GPU the kernel's fp32 rounding is the hardware's (FMA contraction, ex2.approx), so
    allow a few output ulps where the interpreter needs one."""
    q, k, v = _qkv(300, 260, dim=64, dtype=dtype, batch=2, heads=2, device="cuda")
    knobs = {"block_r": 64, "block_c": 32, "variant": variant, "stats": stats, "accum": accum, "exp2": False}
    out = build_backend("triton", **knobs)(q, k, v, causal=causal)
    emulated = _emulator(dtype, 64, 32, variant, stats, accum)(q, k, v, causal=causal)
    assert _in_eps(out.double() - emulated.double(), emulated, dtype) <= 4
