"""FlashAttention-3's two FP8 techniques as options of the emulated attention (numdev.numerics.stages):
incoherent processing (Q and K times a random-sign Hadamard matrix) and block quantisation (one scale
per block of rows), against exact arithmetic and against what each is for."""

import pytest
import torch

from numdev.attention import FlashEmulated
from numdev.attention.golden import golden_attention
from numdev.bench.inputs import OutlierInputs, Shape
from numdev.numerics.stages import incoherence, prepared_inputs, round_input, stage_formats


@pytest.mark.parametrize("dim", [1, 2, 16, 64, 128])
def test_incoherence_is_orthogonal_and_seeded(dim):
    m = incoherence(dim, seed=3)
    torch.testing.assert_close(m @ m.T, torch.eye(dim, dtype=torch.float64), rtol=0, atol=1e-14)
    assert torch.equal(m, incoherence(dim, seed=3))
    assert dim < 4 or not torch.equal(m, incoherence(dim, seed=4))
    torch.testing.assert_close(m.abs(), torch.full((dim, dim), dim ** -0.5, dtype=torch.float64), rtol=1e-15, atol=0)  # every entry +-1/sqrt(d)


def test_incoherence_needs_a_power_of_two():
    with pytest.raises(ValueError, match="numerics.incoherent=true needs a power-of-two head dim.*got 48"):
        incoherence(48, 0)


def test_incoherent_processing_keeps_the_scores_and_spreads_an_outlier():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 32, 64, generator=g, dtype=torch.float64) for _ in range(3))
    q[0, 0, 5, 7] = 1000.0  # one outlier feature
    f = stage_formats("fa2", "fp64", incoherent=True)
    q2, k2, v2 = prepared_inputs(q, k, v, f)
    torch.testing.assert_close(q2 @ k2.transpose(-1, -2), q @ k.transpose(-1, -2), rtol=1e-12, atol=1e-9)
    assert torch.equal(v2, v)  # V is not rotated
    assert q2[0, 0, 5].abs().max() < 1000.0 / 64 ** 0.5 + 5  # spread over all 64 coordinates


def test_block_scaling_scales_each_block_of_rows_on_its_own():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 2, 300, 32, generator=g)
    x[0, 0, 10, 3] = 1e5  # an outlier in the first block of head 0: under one scale the rest falls into e4m3's subnormals
    f = stage_formats("fa2", "fp8_e4m3", input_scaling="block", input_block=128)
    rounded = round_input(x, f)
    for head in range(2):
        for start in range(0, 300, 128):
            block = x[:, head:head + 1, start:start + 128]
            alone = round_input(block, stage_formats("fa2", "fp8_e4m3", input_scaling="tensor"))
            assert torch.equal(rounded[:, head:head + 1, start:start + 128], alone)  # the last block has 44 rows
    tensor = round_input(x, stage_formats("fa2", "fp8_e4m3", input_scaling="tensor"))
    rms = lambda y: float((y - x)[0, 1].pow(2).mean().sqrt())  # noqa: E731
    assert rms(rounded) < rms(tensor) / 4  # head 1 no longer pays for head 0's outlier


def test_fa3_techniques_lower_the_fp8_error_on_outlier_inputs():
    """On FA3's outlier inputs (N(0,1) + N(0,100)·Bernoulli(0.001)) each technique lowers the RMSE
    against FP64, incoherent processing most (the paper's reading of Table 3)."""
    shape = Shape(batch=1, heads=2, seq_q=512, dim=64)
    kinds = {"neither": {"input_scaling": "tensor"}, "block": {"input_scaling": "block", "input_block": 64},
             "incoherent": {"input_scaling": "tensor", "incoherent": True}, "both": {"input_scaling": "block", "input_block": 64, "incoherent": True}}
    rmse = {name: 0.0 for name in kinds}
    for seed in range(3):
        q, k, v = OutlierInputs()(shape, seed)
        golden = golden_attention(q, k, v)
        for name, extra in kinds.items():
            out = FlashEmulated(stage_formats("fa2", "fp8_e4m3", output="fp16", **extra), block_r=64, block_c=64)(q.float(), k.float(), v.float())
            rmse[name] += float(((out.double() - golden) ** 2).mean().sqrt()) / 3
    assert rmse["both"] < rmse["block"] < rmse["neither"], rmse
    assert rmse["incoherent"] < 0.8 * rmse["neither"], rmse


@pytest.mark.parametrize("bad, message", [
    ({"input_block": 0}, "numerics.input_block=0 must be a positive integer"),
    ({"input_block": True}, "numerics.input_block=True must be a positive integer"),
    ({"incoherent": "yes"}, "numerics.incoherent='yes' must be true or false"),
    ({"input_scaling": "tile"}, "unknown input_scaling 'tile': use one of none, tensor, block"),
])
def test_bad_settings_say_which_key(bad, message):
    with pytest.raises(ValueError, match=message):
        stage_formats("fa2", "fp8_e4m3", **bad)


def test_the_kernel_model_and_native_paths_step_aside():
    """Incoherent processing changes the inputs before any path runs: the emulator's result with it is
    the same as feeding it pre-rotated inputs without it."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 1, 40, 16, generator=g) for _ in range(3))
    m = incoherence(16, 0, torch.float32)
    with_it = FlashEmulated(stage_formats("fa2", "bf16", incoherent=True), block_r=16, block_c=16)(q, k, v)
    by_hand = FlashEmulated(stage_formats("fa2", "bf16"), block_r=16, block_c=16)(q @ m, k @ m, v)
    assert torch.equal(with_it, by_hand)
