"""The `flash_attn` backend: which real kernel it finds, what it records, how it calls it.

On a CPU machine the kernels' modules are stand-ins placed in sys.modules (their flash_attn_func
computes attention with torch's math SDPA in the kernels' (batch, seq, heads, dim) layout), so
what is tested here is the detection, the record and the call's layout, not the kernels' numbers;
the GPU tests at the end run every installed kernel against an fp32 reference (`pytest -m gpu`).
"""

from __future__ import annotations

import math
import sys
import types
from importlib.machinery import ModuleSpec

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from numdev.attention import build_backend
from numdev.attention import flash_attn_backend as fab
from numdev.attention.registry import BackendUnavailable
from numdev.train.run import _check_attention

CUDA = torch.cuda.is_available()


def _sdpa_in_kernel_layout(q, k, v, softmax_scale=None, causal=False, **_):
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         scale=softmax_scale, is_causal=causal)
    return out.transpose(1, 2)


def _module(name, function=None, version=None):
    module = types.ModuleType(name)
    module.__spec__ = ModuleSpec(name, loader=None)
    if function is not None:
        module.flash_attn_func = function
    if version is not None:
        module.__version__ = version
    return module


@pytest.fixture
def kernels(monkeypatch):
    """Installs stand-in kernel modules: kernels({"fa4": module, ...}); the others are absent."""
    def install(modules: dict):
        for name, kernel in fab.KERNELS.items():
            monkeypatch.setitem(sys.modules, kernel.module, modules.get(name))  # None: import fails
        if "fa4" in modules and "fa2" not in modules:
            monkeypatch.setitem(sys.modules, "flash_attn", _module("flash_attn"))  # FA4's namespace parent
        fab.load.cache_clear()
        fab.version.cache_clear()

    yield install
    fab.load.cache_clear()
    fab.version.cache_clear()


def test_nothing_installed_names_every_install(kernels):
    kernels({})
    backend = build_backend("flash_attn")
    assert backend.describe() == {"backend": "flash_attn", "kernel": "none installed", "asked": "auto"}
    q = torch.zeros(1, 1, 8, 16, dtype=torch.bfloat16)
    with pytest.raises(BackendUnavailable) as raised:
        backend(q, q, q)
    message = str(raised.value)
    assert "\n" not in message and "no FlashAttention kernel is installed" in message
    for kernel in fab.KERNELS.values():
        assert f"{kernel.name} ({kernel.module})" in message
    assert "pip install flash-attn-4" in message and ".venv/bin/pip install -e '.[cuda]'" in message


def test_auto_takes_the_first_installed_kernel_and_records_it(kernels):
    fa4 = _module("flash_attn.cute", _sdpa_in_kernel_layout, version="4.0.0b36")
    fa3_fwd = _module("fa3_fwd_interface", _sdpa_in_kernel_layout, version="0.0.3")
    kernels({"fa4": fa4, "fa3_fwd": fa3_fwd})
    assert fab.installed() == ["fa4", "fa3_fwd"]  # forward-only fa3_fwd last: auto must be able to train
    assert build_backend("flash_attn").describe() == {
        "backend": "flash_attn", "kernel": "fa4", "asked": "auto", "module": "flash_attn.cute", "version": "4.0.0b36"}
    assert build_backend("flash_attn", kernel="fa3_fwd").describe()["module"] == "fa3_fwd_interface"
    kernels({"fa2": _module("flash_attn", _sdpa_in_kernel_layout, version="2.8.3"), "fa4": fa4})
    assert build_backend("flash_attn").describe()["kernel"] == "fa2"


def test_runnable_lists_the_installed_kernels_that_take_the_inputs(kernels):
    kernels({"fa4": _module("flash_attn.cute", _sdpa_in_kernel_layout)})
    assert fab.runnable("cpu", torch.bfloat16) == {}  # installed, but CUDA only
    backend = build_backend("flash_attn")
    assert backend.resolved() == "fa4"
    kernels({"fa2": _module("flash_attn", _sdpa_in_kernel_layout)})
    assert backend.resolved() == "fa4"  # auto resolves once, not on every attention call


def test_a_namespace_without_flash_attn_func_is_not_flash_attn_2(kernels):
    """FlashAttention-4's wheel leaves `flash_attn` a namespace: fa2 must not be found in it."""
    kernels({"fa4": _module("flash_attn.cute", _sdpa_in_kernel_layout)})
    assert fab.load("fa2")[0] is None and "has no flash_attn_func" in fab.load("fa2")[1]
    q = torch.zeros(1, 1, 8, 16, dtype=torch.bfloat16)
    with pytest.raises(BackendUnavailable, match=r"attention.kernel=fa2: flash_attn has no flash_attn_func.*installed: attention.kernel=fa4"):
        build_backend("flash_attn", kernel="fa2")(q, q, q)


def test_cpu_tensors_are_refused_with_the_kernel_named(kernels):
    kernels({"fa4": _module("flash_attn.cute", _sdpa_in_kernel_layout)})
    q = torch.zeros(1, 1, 8, 16, dtype=torch.bfloat16)
    with pytest.raises(BackendUnavailable, match=r"fa4 \(flash_attn.cute\) runs on CUDA only, not cpu"):
        build_backend("flash_attn")(q, q, q)


@pytest.mark.parametrize("returns_lse", [False, True])
def test_the_call_transposes_passes_the_scale_and_takes_the_output(kernels, returns_lse):
    calls = []

    def kernel(q, k, v, softmax_scale=None, causal=False):
        calls.append((tuple(q.shape), softmax_scale, causal))
        out = _sdpa_in_kernel_layout(q, k, v, softmax_scale=softmax_scale, causal=causal)
        return (out, torch.zeros(1)) if returns_lse else out

    kernels({"fa4": _module("flash_attn.cute", kernel)})
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 40, 16, generator=g) for _ in range(3))
    out = build_backend("flash_attn").forward(q, k, v, 0.3, True)
    assert calls == [((2, 40, 3, 16), 0.3, True)]
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, scale=0.3, is_causal=True))


def test_a_forward_only_kernel_refuses_to_train_and_names_the_ones_that_can(kernels):
    kernels({"fa3_fwd": _module("fa3_fwd_interface", _sdpa_in_kernel_layout),
             "fa4": _module("flash_attn.cute", _sdpa_in_kernel_layout)})
    backend = build_backend("flash_attn", kernel="fa3_fwd")
    q, k, v = (torch.randn(1, 2, 8, 16, requires_grad=True) for _ in range(3))
    with pytest.raises(BackendUnavailable, match=r"fa3_fwd \(fa3_fwd_interface\) has no backward pass: train with attention.kernel=fa4"):
        backend.forward(q, k, v, 0.25, False)
    with torch.no_grad():
        assert backend.forward(q, k, v, 0.25, False).shape == q.shape
    # training's config check refuses it before a run starts, naming the key it was given under
    assert "shadow.kernel=fa3_fwd (fa3_fwd_interface) has no backward pass: train with shadow.kernel=fa4" in backend.forward_only("shadow")
    with pytest.raises(ValueError, match=r"attention=flash_attn: attention.kernel=fa3_fwd \(fa3_fwd_interface\) has no backward"):
        _check_attention(OmegaConf.create({"attention": {"_target_": "numdev.attention.FlashAttn", "kernel": "fa3_fwd"}}))
    _check_attention(OmegaConf.create({"attention": {"_target_": "numdev.attention.FlashAttn", "kernel": "fa4"}}))


def test_kernel_limits_are_checked_before_the_call(kernels, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    q = torch.zeros(1, 1, 8, 16, dtype=torch.bfloat16)
    assert "compute capability 9.0-9.9, this GPU is 8.0" in fab.KERNELS["fa3"].supports(q)
    assert fab.KERNELS["fa4"].supports(q) is None
    assert "takes bfloat16, not float16" in fab.KERNELS["fa3_fwd"].supports(q.half())
    assert "multiples of 8, not 12" in fab.KERNELS["fa2"].supports(torch.zeros(1, 1, 8, 12, dtype=torch.bfloat16))


def test_unknown_kernel_names_the_choices():
    with pytest.raises(ValueError, match=r"attention.kernel='fa5': use one of auto, fa2, fa3, fa4, fa3_fwd"):
        build_backend("flash_attn", kernel="fa5")


# -- on a GPU: every installed kernel against an fp32 reference, by flash-attn's own test rule -----
def _installed():
    return fab.installed() if CUDA else []


@pytest.mark.gpu
@pytest.mark.skipif(not _installed(), reason="needs a CUDA GPU and an installed FlashAttention kernel")
@pytest.mark.parametrize("kernel", _installed() or ["none"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_installed_kernel_meets_the_flash_attn_rule(kernel, dtype, causal, head_dim):
    """|out - ref| <= 2 |low - ref| (flash-attn's tests), ref in fp32, low the same math in dtype;
    dQ, dK, dV too where the kernel has a backward pass."""
    backend = build_backend("flash_attn", kernel=kernel)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, 1000, head_dim, device="cuda", dtype=dtype, generator=g) for _ in range(3))
    probe = backend.unsupported_reason(q)
    if probe is not None:
        pytest.skip(probe)
    trains = fab.KERNELS[kernel].backward
    leaves = [t.clone().requires_grad_(trains) for t in (q, k, v)]
    ref_leaves = [t.float().requires_grad_(trains) for t in (q, k, v)]
    low_leaves = [t.clone().requires_grad_(trains) for t in (q, k, v)]
    with torch.set_grad_enabled(trains):
        out = backend(*leaves, causal=causal)
        ref = F.scaled_dot_product_attention(*ref_leaves, is_causal=causal)
        scores = (low_leaves[0] * (1 / math.sqrt(head_dim))) @ low_leaves[1].transpose(-1, -2)
        if causal:
            scores = scores.masked_fill(torch.ones(1000, 1000, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
        low = torch.softmax(scores, dim=-1).to(dtype) @ low_leaves[2]
    assert (out.float() - ref).abs().max() <= 2 * (low.float() - ref).abs().max()
    if trains:
        grad = torch.randn_like(out)
        out.backward(grad)
        ref.backward(grad.float())
        low.backward(grad)
        for leaf, r, lo in zip(leaves, ref_leaves, low_leaves):
            assert (leaf.grad.float() - r.grad).abs().max() <= 3 * (lo.grad.float() - r.grad).abs().max()
