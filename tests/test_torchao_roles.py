"""torchao's own training linears as optimizations (numdev.optimizations.torchao_linears) against numdev's
emulations of the same recipes, bit for bit on one linear's forward and both gradients; the one-line
refusals when torchao is missing or a token count does not fit its blocks."""

import copy
import sys
import warnings

import pytest
import torch
from torch import nn

from numdev.optimizations.float8_linear import Float8Training
from numdev.optimizations.mx_linear import MXTraining
from numdev.optimizations.torchao_linears import TorchaoTraining


def _pair(make_numdev, torchao_name, rows=64, width=(96, 64)):
    """One Linear converted both ways, the same input: (numdev's (out, dx, dW), torchao's)."""
    pytest.importorskip("torchao", reason="torchao not installed: pip install -e '.[torchao]'")
    warnings.filterwarnings("ignore", message=".*register_constant.*")
    g = torch.Generator().manual_seed(0)
    base = nn.Sequential(nn.Linear(*width, bias=False))
    x = torch.randn(rows, width[0], generator=g) * 3
    x[5, 7] = 200.0  # an outlier: the scales matter
    grad = torch.randn(rows, width[1], generator=g)
    results = []
    for convert in (lambda m: make_numdev().model(m), lambda m: TorchaoTraining(torchao_name, RECIPE[torchao_name]).model(m)):
        model = convert(copy.deepcopy(base))
        xi = x.clone().requires_grad_(True)
        out = model(xi)
        out.backward(grad)
        results.append((out.detach(), xi.grad, model[0].weight.grad))
    return results


RECIPE = {"torchao_mxfp8": "mxfp8_emulated_rceil", "torchao_fp8": "float8_tensorwise"}


def test_torchao_mxfp8_is_numdevs_mxfp8_with_rceil_scales_bit_for_bit():
    ours, theirs = _pair(lambda: MXTraining("mxfp8_linear", block_scale="rceil"), "torchao_mxfp8")
    for a, b, what in zip(ours, theirs, ("forward", "input gradient", "weight gradient")):
        assert torch.equal(a, b), what
    floor, _ = _pair(lambda: MXTraining("mxfp8_linear"), "torchao_mxfp8")
    assert not torch.equal(floor[0], theirs[0])  # the OCP floor scale is another recipe: the test can tell


def test_torchao_float8_is_numdevs_fp8_linear_by_the_same_scaled_mm_bit_for_bit():
    ours, theirs = _pair(lambda: Float8Training("fp8_linear", gemm="native"), "torchao_fp8", rows=32, width=(64, 32))
    for a, b, what in zip(ours, theirs, ("forward", "input gradient", "weight gradient")):
        assert torch.equal(a, b), what


def test_without_torchao_the_role_is_refused_in_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)  # import torchao raises ImportError
    with pytest.raises(ValueError, match=r"optimization=torchao_fp8 calls torchao, which is not installed: pip install -e '\.\[torchao\]'"):
        TorchaoTraining("torchao_fp8")


def test_a_token_count_off_the_mx_blocks_is_refused_before_torchao_asserts():
    pytest.importorskip("torchao")
    model = TorchaoTraining("torchao_mxfp8", "mxfp8_emulated_rceil").model(nn.Sequential(nn.Linear(64, 32)))
    with pytest.raises(ValueError, match="torchao's MXFP8 training blocks the tokens by 32, and 0 got 4; use a data.batch_size"):
        model(torch.randn(4, 64))


def test_linears_torchao_cannot_take_stay_plain_and_are_counted():
    pytest.importorskip("torchao")
    model = nn.Sequential(nn.Linear(48, 64), nn.Linear(64, 64))
    opt = TorchaoTraining("torchao_mxfp8", "mxfp8_emulated_rceil")
    opt.model(model)
    assert opt.describe(model)["replaced"] == 1 and opt.describe(model)["plain_linear_left"] == 1
    with pytest.raises(ValueError, match="optimization.recipe='mx': use one of"):
        TorchaoTraining("x", "mx")


class _Wrapped(torch.Tensor):
    """A tensor subclass, as torchao wraps its MXFP8 weights: weights_only loading refuses its class."""


def test_a_checkpoint_holding_a_tensor_subclass_is_stored_plain_and_loads(tmp_path):
    from numdev.train.checkpoint_io import load_checkpoint, save_checkpoint

    weight = torch.randn(4, 8).as_subclass(_Wrapped)
    save_checkpoint({"state_dict": {"model.w": weight}, "global_step": 3}, tmp_path / "last.ckpt")
    loaded = load_checkpoint(tmp_path / "last.ckpt")
    assert type(loaded["state_dict"]["model.w"]) is torch.Tensor
    assert torch.equal(loaded["state_dict"]["model.w"], weight.as_subclass(torch.Tensor)) and loaded["global_step"] == 3
