"""Scaled quantisation (numdev.numerics.scaling): MX blocks against the OCP MX v1.0 rules and against
gfloat (Graphcore's reference implementation of the OCP formats), E8M0 scales against ml_dtypes and
torch, tensor and row scales against the torchao recipe's arithmetic."""

import math

import gfloat
import ml_dtypes
import numpy as np
import pytest
import torch
from gfloat.formats import (
    format_info_mxfp4_e2m1,
    format_info_mxfp6_e2m3,
    format_info_mxfp6_e3m2,
    format_info_mxfp8_e4m3,
    format_info_mxfp8_e5m2,
)

from numdev.numerics.formats import FORMATS, round_to
from numdev.numerics.scaling import MX_ELEMENTS, e8m0_bits, mx_scale_exponent, quantize, quantize_parts, tensor_scale

GFLOAT = {
    "fp8_e4m3": format_info_mxfp8_e4m3,
    "fp8_e5m2": format_info_mxfp8_e5m2,
    "fp6_e2m3": format_info_mxfp6_e2m3,
    "fp6_e3m2": format_info_mxfp6_e3m2,
    "fp4_e2m1": format_info_mxfp4_e2m1,
}


def _blocks(seed: int = 0) -> torch.Tensor:
    """16 blocks of 32: normal values at many scales, an outlier block, an all-zero block, a block
    of tiny values (the E8M0 scale clamps at 2^-127) and a block of huge ones."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 32, generator=g, dtype=torch.float64) * torch.exp2(torch.randint(-20, 20, (16, 1), generator=g))
    x[3, 5] = 3.0e4  # outlier
    x[4] = 0.0
    x[5] = torch.randn(32, generator=g, dtype=torch.float64) * 2.0**-135
    x[6] = torch.randn(32, generator=g, dtype=torch.float64) * 2.0**120
    return x.float()


@pytest.mark.parametrize("name", MX_ELEMENTS)
def test_mx_blocks_match_gfloat(name):
    x = _blocks()
    ours = quantize(x, name, "block", block=32, axis=-1).double().numpy()
    for row, block in zip(ours, x.double().numpy()):
        theirs = gfloat.quantize_block(GFLOAT[name], block, gfloat.compute_scale_amax)
        np.testing.assert_array_equal(row, theirs)


@pytest.mark.parametrize("name", MX_ELEMENTS)
def test_mx_outlier_block_scales_as_the_spec_says(name):
    """OCP MX v1.0 section 6.3: X = 2^(floor(log2(amax)) - emax_elem); V/X rounded (ties to even) and
    saturated; elements below half the element format's smallest subnormal times X flush to zero;
    a block without the outlier keeps its own, finer scale."""
    fmt = FORMATS[name]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 32, generator=g, dtype=torch.float64)
    x[0, 7] = 1000.0
    parts = quantize_parts(x, name, "block")
    exponent = mx_scale_exponent(x, name)
    assert exponent[0, 0] == math.floor(math.log2(1000.0)) - fmt.emax
    assert exponent[1, 0] == math.floor(math.log2(float(x[1].abs().max()))) - fmt.emax
    scale = 2.0 ** exponent[0, 0]
    assert parts.scale[0, 0] == scale
    scaled = x[0] / scale
    saturated = torch.where(scaled.abs() >= fmt.max_finite, torch.sign(scaled) * fmt.max_finite, round_to(scaled, fmt))
    expected = saturated * scale
    assert torch.equal(parts.dequantize()[0], expected)
    flushed = x[0].abs() < fmt.smallest_subnormal * scale / 2
    assert torch.all(parts.dequantize()[0][flushed] == 0)
    if name != "fp8_e5m2":  # 1000/2^(9-15) fits e5m2 without saturating; the others' amax / X needs 2^emax..2^(emax+1)
        assert abs(float(parts.elements[0, 7])) <= fmt.max_finite
    # Per-tensor scaling lets an outlier set every block's scale: with a narrow exponent range the
    # outlier-free block falls into subnormals or flushes to zero (e5m2's 32 binades hold both).
    x[0, 7] = 1.0e6
    block_error = (quantize(x, name, "block") - x)[1].abs().max()
    tensor_error = (quantize(x, name, "tensor") - x)[1].abs().max()
    if name != "fp8_e5m2":
        assert block_error < tensor_error / 4


def test_mx_nonfinite_block_is_nan_and_others_are_kept():
    x = torch.randn(3, 64)
    x[1, 40] = float("nan")
    q = quantize(x, "fp8_e4m3", "block")
    assert torch.isnan(q[1, 32:]).all() and not torch.isnan(q[1, :32]).any() and not torch.isnan(q[[0, 2]]).any()
    assert e8m0_bits(mx_scale_exponent(x, "fp8_e4m3"))[1, 1] == 255


def test_e8m0_codes_match_ml_dtypes_and_torch():
    exponents = torch.arange(-127, 128, dtype=torch.float64)
    codes = e8m0_bits(torch.cat([exponents, torch.tensor([float("nan")], dtype=torch.float64)]))
    assert torch.equal(codes.long(), torch.arange(256))  # every code: 0..254 the powers of two, 255 NaN
    theirs = codes.numpy().view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    assert np.array_equal(theirs[:-1], np.exp2(exponents.numpy())) and np.isnan(theirs[-1])
    torch_values = codes.view(torch.float8_e8m0fnu).double()
    assert torch.equal(torch_values[:-1], torch.exp2(exponents)) and torch.isnan(torch_values[-1])


def test_block_scaling_along_an_axis_with_a_ragged_tail():
    x = torch.randn(70, 5, dtype=torch.float64)
    q = quantize_parts(x, "fp4_e2m1", "block", block=32, axis=0)
    assert q.scale.shape == (3, 5)
    column = quantize(x[:, 2].contiguous(), "fp4_e2m1", "block", block=32, axis=0)
    assert torch.equal(q.dequantize()[:, 2], column)


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2"])
def test_tensor_and_row_scales_follow_the_amax_recipe(name):
    fmt = FORMATS[name]
    x = torch.randn(8, 100) * 3
    s = tensor_scale(x, name)
    assert s.dtype == torch.float32 and s == torch.tensor(fmt.max_finite / float(x.abs().max()), dtype=torch.float64).float()
    parts = quantize_parts(x, name, "tensor")
    fp8 = torch.clamp(x * s, -fmt.max_finite, fmt.max_finite).to(fmt.torch_dtype)  # the saturating cast of torchao
    assert torch.equal(parts.elements, fp8.float())
    assert parts.elements.abs().max() == fmt.max_finite  # the amax element lands on the format's max
    assert torch.equal(parts.scale, torch.reciprocal(s))
    rows = quantize_parts(x, name, "row", axis=-1)
    for i in range(8):
        assert torch.equal(rows.elements[i], quantize_parts(x[i], name, "tensor").elements)


def test_quantize_is_straight_through_under_autograd():
    x = torch.randn(4, 64, dtype=torch.float64, requires_grad=True)
    for scaling in ("tensor", "row", "block"):
        y = quantize(x, "fp4_e2m1", scaling)
        assert not torch.equal(y.detach(), x.detach())
        (grad,) = torch.autograd.grad((y * 3).sum(), x)
        assert torch.equal(grad, torch.full_like(x, 3.0))


def test_bad_arguments_name_what_to_do():
    with pytest.raises(ValueError, match="unknown scaling"):
        quantize(torch.ones(4), "fp8_e4m3", "channel")
    with pytest.raises(ValueError, match="block"):
        quantize(torch.ones(4), "fp8_e4m3", "block", block=0)
    with pytest.raises(TypeError, match="upcast"):
        quantize_parts(torch.ones(4, dtype=torch.bfloat16), "fp8_e4m3")


def test_bf16_inputs_quantise_from_their_float32_values_under_autograd():
    x = (torch.randn(4, 64) * 3).bfloat16().requires_grad_()
    y = quantize(x, "fp8_e4m3", "block")
    assert y.dtype == torch.bfloat16
    assert torch.equal(y.detach(), quantize(x.detach().float(), "fp8_e4m3", "block").bfloat16())
    (grad,) = torch.autograd.grad(y.float().sum(), x)
    assert torch.equal(grad, torch.ones_like(x))


@pytest.mark.parametrize("name", MX_ELEMENTS)
def test_mx_ceil_scale_is_the_smallest_power_of_two_without_saturation(name):
    fmt = FORMATS[name]
    x = _blocks(seed=2).double()
    x[4] = 0.5
    x[4, 0] = fmt.max_finite * 2.0**-3  # amax / X lands exactly on max_finite
    exponent = mx_scale_exponent(x, name, block_scale="ceil")
    amax = x.abs().amax(dim=-1, keepdim=True)
    assert bool((amax / torch.exp2(exponent) <= fmt.max_finite).all())  # nothing saturates
    free = exponent > -127  # not clamped at E8M0's smallest scale (the block of tiny values is)
    assert int(free.sum()) == 15 and bool((amax / torch.exp2(exponent - 1) > fmt.max_finite)[free].all())  # minimal
    assert float(amax[4] / torch.exp2(exponent[4])) == fmt.max_finite
    floor = mx_scale_exponent(x, name)
    assert bool(((exponent - floor >= 0) & (exponent - floor <= 1)).all())
    parts = quantize_parts(x, name, "block", block_scale="ceil")
    assert bool((parts.elements.abs() <= fmt.max_finite).all())
    with pytest.raises(ValueError, match="block_scale"):
        quantize(x, name, "block", block_scale="round")
