"""Rounding modes as part of a format (numdev.numerics.formats): toward zero and stochastic rounding
held to gfloat (Graphcore's reference implementation) element by element, fed the same random bits,
on every named format (the MX element formats at their top binade included), in float32 and float64
working precision; nearest even to ml_dtypes; the random source seeded and reproducible; the stage
and GEMM formats carrying the mode to the emulators."""

import math

import gfloat
import ml_dtypes
import numpy as np
import pytest
import torch
from gfloat import RoundMode
from gfloat.formats import (
    format_info_bfloat16,
    format_info_binary16,
    format_info_ocp_e2m1,
    format_info_ocp_e2m3,
    format_info_ocp_e3m2,
    format_info_ocp_e4m3,
    format_info_ocp_e5m2,
)

from numdev.numerics.formats import FORMATS, parse_format, round_stochastic, round_to, with_random_source

GFLOAT = {
    "bf16": format_info_bfloat16,
    "fp16": format_info_binary16,
    "fp8_e4m3": format_info_ocp_e4m3,
    "fp8_e5m2": format_info_ocp_e5m2,
    "fp6_e2m3": format_info_ocp_e2m3,
    "fp6_e3m2": format_info_ocp_e3m2,
    "fp4_e2m1": format_info_ocp_e2m1,
}
ML_DTYPES = {"bf16": ml_dtypes.bfloat16, "fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2,
             "fp6_e2m3": ml_dtypes.float6_e2m3fn, "fp6_e3m2": ml_dtypes.float6_e3m2fn, "fp4_e2m1": ml_dtypes.float4_e2m1fn}


def _values(name: str, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Every binade from below the smallest subnormal to past overflow, the top binade densely, and the specials."""
    fmt = FORMATS[name]
    g = torch.Generator().manual_seed(seed)
    low, high = math.log2(fmt.smallest_subnormal) - 3, min(math.log2(fmt.max_finite) + 3, 125)
    spread = torch.exp2(torch.empty(1500, dtype=torch.float64).uniform_(low, high, generator=g))
    top = torch.empty(600, dtype=torch.float64).uniform_(fmt.max_finite / 2, fmt.overflow_threshold * 1.5, generator=g)
    sign = torch.where(torch.rand(2100, generator=g) < 0.5, -1.0, 1.0).double()
    specials = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, fmt.max_finite, -fmt.max_finite, fmt.overflow_threshold,
                             fmt.smallest_subnormal, fmt.smallest_subnormal / 2, 2.0**fmt.emin], dtype=torch.float64)
    return torch.cat([torch.cat([spread, top]) * sign, specials]).to(dtype)


def _gfloat(name: str, x: torch.Tensor, mode: RoundMode, bits=None, n: int = 0) -> np.ndarray:
    fi, saturate = GFLOAT[name], FORMATS[name].saturates
    out = []
    for i, v in enumerate(x.double().tolist()):
        try:
            out.append(gfloat.round_float(fi, v, mode, sat=saturate, srbits=-1 if bits is None else int(bits[i]), srnumbits=n))
        except ValueError:  # a NaN into a format without NaN: numdev keeps the NaN in the tensor
            out.append(math.nan)
    return np.array(out)


def _same(ours: torch.Tensor, theirs: np.ndarray) -> bool:
    ours = ours.double().numpy()
    equal = (ours == theirs) & (np.signbit(ours) == np.signbit(theirs))
    return bool(np.all(equal | (np.isnan(ours) & np.isnan(theirs))))


@pytest.mark.parametrize("name", sorted(GFLOAT))
@pytest.mark.parametrize("n", [1, 4, 11, 16, 24])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_stochastic_rounding_is_gfloats_bit_for_bit_given_the_same_bits(name, n, dtype):
    x = _values(name, dtype, seed=n)
    bits = torch.randint(0, 1 << n, x.shape, generator=torch.Generator().manual_seed(100 + n))
    ours = round_stochastic(x, parse_format(f"{name}:sr{n}"), bits)
    assert ours.dtype == dtype
    assert _same(ours, _gfloat(name, x, RoundMode.Stochastic, bits.tolist(), n))


@pytest.mark.parametrize("name", sorted(GFLOAT))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_toward_zero_is_gfloats_and_nearest_is_gfloats_and_ml_dtypes(name, dtype):
    x = _values(name, dtype, seed=7)
    assert _same(round_to(x, f"{name}:rtz"), _gfloat(name, x, RoundMode.TowardZero))
    assert _same(round_to(x, f"{name}:rne"), _gfloat(name, x, RoundMode.TiesToEven))
    if name in ML_DTYPES and dtype == torch.float32:  # ml_dtypes converts from float32 in one rounding
        finite = torch.isfinite(x)
        theirs = x[finite].numpy().astype(ML_DTYPES[name]).astype(np.float64)
        assert _same(round_to(x[finite], name), theirs)


def test_stochastic_bits_that_cover_the_dropped_bits_give_the_same_bits_by_either_path():
    """bf16:sr16 from float32 adds the bits to the 16 dropped bits of the pattern (the fast path); the
    generic path (from float64) gives the same values."""
    x = _values("bf16", torch.float32, seed=3)
    bits = torch.randint(0, 1 << 16, x.shape, generator=torch.Generator().manual_seed(4))
    fmt = parse_format("bf16:sr16")
    assert _same(round_stochastic(x, fmt, bits), round_stochastic(x.double(), fmt, bits).numpy())


@pytest.mark.parametrize("spec, values", [
    ("fp8_e4m3:sr23", (1.0 + 2**-5, -2.7182818, 0.3, 300.0)),  # float32 fractions: at most 20 bits
    ("bf16:sr16", (1.0 + 2**-10, -2.7182818, 0.3, 3.3e-39)),  # float32: 16 dropped bits, subnormal too
    ("fp4_e2m1:sr1", (1.25, -0.75, 5.0, -2.5)),  # fractions of half a quantum
])
def test_stochastic_rounding_is_unbiased_when_the_bits_cover_the_fraction(spec, values):
    """E[round(x)] = x: the mean of many roundings of one value lies within 5 standard errors of it, and
    only its two neighbours occur."""
    fmt = parse_format(spec)
    for value in values:
        x = torch.full((1 << 15,), value, dtype=torch.float32)
        got = round_to(x, with_random_source(fmt, torch.Generator().manual_seed(9))).double()
        below = float(round_to(x[:1], f"{fmt.name}:rtz"))
        assert set(got.unique().tolist()) <= {below, float(got.abs().max()) * math.copysign(1, value)}
        spacing = float(got.max() - got.min())
        p = abs(float(x[0]) - below) / spacing
        assert 0 < p < 1
        assert abs(float(got.mean()) - float(x[0])) <= 5 * spacing * math.sqrt(p * (1 - p) / x.numel())


def test_too_few_random_bits_round_a_small_fraction_toward_zero():
    """With n bits the fraction is first rounded to n bits: 1 + 1/16 in fp4_e2m1 is 2 + 1/8 quanta, whose
    fraction rounds to 0 on 1 bit, so sr1 never rounds it up (the bias the docstring states)."""
    x = torch.full((4096,), 1.0625)
    got = round_to(x, with_random_source(parse_format("fp4_e2m1:sr1"), torch.Generator().manual_seed(0)))
    assert torch.equal(got, torch.ones_like(x))
    got = round_to(x, with_random_source(parse_format("fp4_e2m1:sr4"), torch.Generator().manual_seed(0)))
    assert 0.05 < float((got > 1).double().mean()) < 0.2  # 1/8 of the time, with 4 bits


def test_the_random_source_is_seeded_and_reproducible():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    fmt = parse_format("bf16:sr8")

    def rounded(seed):
        return round_to(x, with_random_source(fmt, torch.Generator().manual_seed(seed)))

    assert torch.equal(rounded(1), rounded(1))
    assert not torch.equal(rounded(1), rounded(2))
    with pytest.raises(ValueError, match="no source of random bits"):
        round_to(x, fmt)


@pytest.mark.parametrize("spec, words", [
    ("bf16:sr0", "1-32"), ("bf16:sr33", "1-32"), ("bf16:rtz3", "unknown rounding"), ("bf16:up", "unknown rounding"),
    ("bf16:", "unknown rounding"), ("bf17:sr", "unknown float format"), (":sr", "unknown float format"),
])
def test_bad_rounding_specs_say_what_to_write(spec, words):
    with pytest.raises(ValueError, match=words):
        parse_format(spec)


def test_specs_read_back():
    assert parse_format("bf16:sr").spec == "bf16:sr16" and parse_format("bf16:sr").rounding.random_bits == 16
    assert parse_format("e5m10:rtz").spec == "fp16:rtz" and parse_format("bf16:rne") == FORMATS["bf16"]
    assert str(parse_format("fp8_e4m3:sr8")) == "fp8_e4m3:sr8"


def test_a_stochastic_stage_changes_flash_and_stays_reproducible():
    """numerics.prob=bf16:sr: the emulator rounds P stochastically (not the fused kernels, which round to
    nearest only), the same seed gives the same bits and another seed other bits; the deviation from the
    FP64 golden value stays of bf16's size."""
    from numdev.attention import FlashEmulated
    from numdev.attention.golden import golden_attention
    from numdev.numerics.stages import stage_formats

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 96, 32, generator=g) for _ in range(3))

    def run(prob, seed=0):
        return FlashEmulated(formats=stage_formats("fa2", "bf16", prob=prob, seed=seed), block_r=16, block_c=16)(q, k, v).double()

    nearest, sr, again, other = run(None), run("bf16:sr"), run("bf16:sr"), run("bf16:sr", seed=1)
    assert torch.equal(sr, again) and not torch.equal(sr, other) and not torch.equal(sr, nearest)
    golden = golden_attention(q.double(), k.double(), v.double())
    for out in (nearest, sr):
        assert 0 < float((out - golden).abs().max()) < 2**-6
    assert stage_formats("fa2", "bf16", prob="bf16:sr", seed=3).describe()["prob"] == "bf16:sr16"
    assert stage_formats("fa2", "bf16", prob="bf16:sr", seed=3).describe()["seed"] == 3


def test_gemm_accumulator_rounding_is_one_choice():
    from numdev.gemm import emulated_matmul, gemm_formats

    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(8, 512, generator=g), torch.randn(512, 4, generator=g)
    by_key = gemm_formats("bf16", accum="e8m13", order="sequential", accum_rounding="toward_zero")
    by_spec = gemm_formats("bf16", accum="e8m13:rtz", order="sequential")
    assert by_key.accum == by_spec.accum and by_spec.accum_rounding == "toward_zero"
    assert torch.equal(emulated_matmul(a, b, by_key), emulated_matmul(a, b, by_spec))
    with pytest.raises(ValueError, match="disagree"):
        gemm_formats("bf16", accum="e8m13:sr", accum_rounding="toward_zero")
    sr = [emulated_matmul(a, b, gemm_formats("bf16", accum="e8m7:sr", order="sequential", seed=s)) for s in (0, 0, 1)]
    assert torch.equal(sr[0], sr[1]) and not torch.equal(sr[0], sr[2])


def test_training_takes_a_stage_rounding_from_the_shell_seeded_by_seed_rounding():
    """attention.formats.prob=bf16:sr is a key of the training config (not a '+' key nothing reads), and
    its random integers are seeded by seed.rounding: the attention module built from the config rounds P
    stochastically, the same seed the same bits, another seed other bits."""
    from helpers import compose_train
    from hydra.utils import instantiate

    def attention(*overrides):
        return instantiate(compose_train("attention=flash_emulated", "attention.formats.prob=bf16:sr", *overrides).attention)

    first = attention("seed.rounding=4")
    assert first.formats.prob.spec == "bf16:sr16" and first.formats.seed == 4 and first.formats.score.nearest
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 40, 16, generator=g) for _ in range(3))
    with torch.no_grad():
        out = [a(q, k, v) for a in (first, attention("seed.rounding=4"), attention("seed.rounding=5"))]
    assert torch.equal(out[0], out[1]) and not torch.equal(out[0], out[2])


def test_a_bench_seeds_measurement_draws_the_same_random_integers_alone_or_after_others(tmp_path):
    """numdev-bench with a stochastic stage: seed 1's records are the same whether seed 0 ran before it in
    the same process or not (each input seed restarts the stream: numerics.seed and the input seed)."""
    from hydra import compose, initialize_config_module

    from numdev.bench.runner import run_bench

    def metrics(seeds):
        with initialize_config_module(config_module="numdev.conf.bench", version_base="1.3"):
            cfg = compose(config_name="bench", overrides=["numerics.prob=bf16:sr", "numerics.accum=bf16:sr4", "shape.seq_q=96",
                                                          "shape.dim=16", f"seeds={seeds}"])
        return {(r["method"], r["seed"]): r["metrics"] for r in run_bench(cfg, log=lambda *_: None) if r["kind"] == "vs_golden"}

    both, alone = metrics("[0,1]"), metrics("[1]")
    assert both[("flash", 1)] == alone[("flash", 1)] and both[("baseline", 1)] == alone[("baseline", 1)]
    assert both[("flash", 0)] != both[("flash", 1)]
