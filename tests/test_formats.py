"""Rounding into float formats: bit for bit against ml_dtypes, and exact against rationals."""

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch

from numdev.numerics.formats import FORMATS, _round_generic, parse_format, round_to

ML_DTYPES = {
    "bf16": ml_dtypes.bfloat16,
    "fp16": np.float16,
    "fp8_e4m3": ml_dtypes.float8_e4m3fn,
    "fp8_e5m2": ml_dtypes.float8_e5m2,
}


def _sample() -> np.ndarray:
    """Random float32 bit patterns (every exponent, subnormals, inf, NaN), plus exact ties
    and the boundaries of each format."""
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, size=400_000, dtype=np.uint64).astype(np.uint32)
    ties = []
    for mantissa_bits in (7, 10, 3, 2):  # halfway between two neighbours of each format
        drop = 23 - mantissa_bits
        ties.append((bits & ~np.uint32((1 << drop) - 1)) | np.uint32(1 << (drop - 1)))
    # Subnormal range of the narrow formats, densely.
    small = rng.uniform(-2.0**-13, 2.0**-13, size=50_000).astype(np.float32)
    edges = np.array(
        [np.inf, -np.inf, np.nan, 0.0, -0.0, 448, 464, 464.0001, 480, -500, 57344, 61440, 61441, 65504, 65519.99, 65520,
         3.3895314e38, 3.4e38, 2.0**-24, 2.0**-25, 2.0**-25 * 1.0001, 2.0**-133, 2.0**-134, 2.0**-9, 2.0**-10, 2.0**-17],
        dtype=np.float32,
    )
    return np.concatenate([bits.view(np.float32), *(t.view(np.float32) for t in ties), small, edges, -edges])


SAMPLE = _sample()


@pytest.mark.parametrize("name", sorted(ML_DTYPES))
@pytest.mark.parametrize("working", [torch.float32, torch.float64])
def test_round_matches_ml_dtypes_bit_for_bit(name, working):
    with np.errstate(all="ignore"):
        expected = SAMPLE.astype(ML_DTYPES[name])
    ours = round_to(torch.from_numpy(SAMPLE).to(working), name).float().numpy()
    with np.errstate(all="ignore"):
        ours_in_format = ours.astype(ML_DTYPES[name])  # exact: ours holds values of the format
    bits_int = np.uint8 if expected.itemsize == 1 else np.uint16
    both_nan = np.isnan(expected.astype(np.float32)) & np.isnan(ours)
    mismatch = (ours_in_format.view(bits_int) != expected.view(bits_int)) & ~both_nan
    assert mismatch.sum() == 0, f"{name}: {mismatch.sum()} mismatches, e.g. {SAMPLE[mismatch][:5]}"
    # Our values are exactly the format's values: converting back loses nothing.
    finite = np.isfinite(ours)
    assert np.array_equal(ours_in_format.astype(np.float32)[finite], ours[finite])


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "tf32"])
def test_generic_path_agrees_with_fast_paths(name):
    x = torch.from_numpy(SAMPLE)
    fmt = FORMATS[name]
    fast = round_to(x, fmt)
    generic = _round_generic(x.clone(), fmt)
    same = (fast == generic) | (fast.isnan() & generic.isnan())
    assert bool(same.all())
    assert torch.equal(torch.signbit(fast[fast == 0]), torch.signbit(generic[generic == 0]))


def _exact_round(value: float, e_bits: int, m_bits: int) -> float:
    """Round-to-nearest-even into an IEEE-like format with rational arithmetic (the reference)."""
    if value == 0 or value != value or abs(value) == float("inf"):
        return value
    bias = 2 ** (e_bits - 1) - 1
    x = Fraction(value)
    exponent = max(abs(x).numerator.bit_length() - abs(x).denominator.bit_length(), 1 - bias)
    while Fraction(2) ** exponent > abs(x):
        exponent -= 1
    exponent = max(exponent, 1 - bias)
    quantum = Fraction(2) ** (exponent - m_bits)
    scaled = x / quantum
    floor = scaled.numerator // scaled.denominator
    remainder = scaled - floor
    n = floor + (1 if remainder > Fraction(1, 2) or (remainder == Fraction(1, 2) and floor % 2) else 0)
    result = n * quantum
    max_finite = (2 - Fraction(2) ** -m_bits) * Fraction(2) ** bias
    if abs(result) > max_finite:
        return float("inf") if value > 0 else float("-inf")
    return float(result)


@pytest.mark.parametrize("spec", ["bf16", "fp16", "tf32", "e6m9", "e3m4", [9, 20], "fp8_e5m2"])
def test_float64_inputs_round_once(spec):
    """From float64, rounding is one correct rounding (no double rounding through float32):
    checked against exact rational arithmetic, including values just off a tie."""
    fmt = parse_format(spec)
    rng = np.random.default_rng(1)
    values = rng.standard_normal(3000) * np.exp2(rng.integers(-30, 30, 3000))
    # Values one float64 ulp away from ties of the format: double rounding gets these wrong.
    ties = torch.from_numpy(values).double()
    ties = round_to(ties, fmt) + torch.ldexp(torch.ones_like(ties), torch.frexp(ties)[1] - 2 - fmt.mantissa_bits)
    values = np.concatenate([values, np.nextafter(ties.numpy(), np.inf), np.nextafter(ties.numpy(), -np.inf)])
    ours = round_to(torch.from_numpy(values), fmt).numpy()
    expected = np.array([_exact_round(float(v), fmt.exponent_bits, fmt.mantissa_bits) for v in values])
    np.testing.assert_array_equal(ours, expected)


def test_format_properties_match_ml_dtypes():
    for name, dtype in ML_DTYPES.items():
        info = ml_dtypes.finfo(dtype)
        fmt = FORMATS[name]
        assert fmt.max_finite == float(info.max)
        assert fmt.smallest_subnormal == float(info.smallest_subnormal)


def test_parse_format_specs_and_errors():
    assert parse_format("e5m10") is FORMATS["fp16"]
    assert parse_format([8, 7]) is FORMATS["bf16"]
    assert parse_format("e6m9").max_finite == (2 - 2**-9) * 2.0**31
    for bad in ("bf17", "e1m3", [4], "fp8"):
        with pytest.raises(ValueError, match="format"):
            parse_format(bad)


def test_rounding_is_straight_through_under_autograd():
    x = torch.linspace(-3, 3, 101, dtype=torch.float64, requires_grad=True)
    y = round_to(x, "bf16")
    assert not torch.equal(y.detach(), x.detach())
    (y * torch.arange(101.0, dtype=torch.float64)).sum().backward()
    assert torch.equal(x.grad, torch.arange(101.0, dtype=torch.float64))


def test_float32_ulps_counts_representable_steps_across_zero_and_signs():
    from numdev.numerics.formats import float32_ulps

    one = torch.tensor([1.0])
    up = torch.nextafter(one, torch.tensor([2.0]))
    tiny = torch.tensor([2.0 ** -149])
    assert float32_ulps(up, one).tolist() == [1] and float32_ulps(one, up).tolist() == [-1]
    assert float32_ulps(torch.tensor([-0.0]), torch.tensor([0.0])).tolist() == [0]
    assert float32_ulps(tiny, -tiny).tolist() == [2]  # the smallest subnormals, one step each side of zero
    assert float32_ulps(torch.tensor([2.0]), one).tolist() == [1 << 23]  # a binade is 2^23 steps
