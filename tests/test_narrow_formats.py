"""The 8-, 6- and 4-bit formats bit for bit: every code decoded, round-tripped and cast as ml_dtypes
and torch cast it; random float32/float64 inputs (ties, subnormals, overflow) rounded as ml_dtypes
rounds them."""

import ml_dtypes
import numpy as np
import pytest
import torch

from numdev.numerics.formats import FORMATS, decode, round_to

NARROW = {
    "fp8_e4m3": ml_dtypes.float8_e4m3fn,
    "fp8_e5m2": ml_dtypes.float8_e5m2,
    "fp6_e2m3": ml_dtypes.float6_e2m3fn,
    "fp6_e3m2": ml_dtypes.float6_e3m2fn,
    "fp4_e2m1": ml_dtypes.float4_e2m1fn,
}
TORCH_FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def _every_code(name):
    fmt = FORMATS[name]
    codes = np.arange(2**fmt.total_bits, dtype=np.uint8)
    return fmt, codes, codes.view(NARROW[name]).astype(np.float64)  # ml_dtypes keeps narrow codes in the low bits


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal values with equal signs of zero, NaN where the other is NaN."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    nan = np.isnan(a) | np.isnan(b)
    return bool(np.array_equal(np.isnan(a), np.isnan(b)) and np.array_equal(a[~nan], b[~nan])
                and np.array_equal(np.signbit(a[~nan]), np.signbit(b[~nan])))


@pytest.mark.parametrize("name", sorted(NARROW))
def test_every_code_decodes_as_ml_dtypes(name):
    fmt, codes, expected = _every_code(name)
    assert len(codes) == {8: 256, 6: 64, 4: 16}[fmt.total_bits]
    assert _same(decode(torch.from_numpy(codes.astype(np.int64)), fmt).numpy(), expected)
    finite = expected[np.isfinite(expected)]
    assert fmt.max_finite == finite.max() and fmt.smallest_subnormal == finite[finite > 0].min()


@pytest.mark.parametrize("name", sorted(TORCH_FP8))
def test_every_fp8_code_decodes_as_torch(name):
    fmt = FORMATS[name]
    codes = torch.arange(256, dtype=torch.int64)
    theirs = codes.to(torch.uint8).view(TORCH_FP8[name]).double()
    assert _same(decode(codes, fmt).numpy(), theirs.numpy())


@pytest.mark.parametrize("name", sorted(NARROW))
@pytest.mark.parametrize("working", [torch.float32, torch.float64])
def test_every_value_round_trips_to_its_own_code(name, working):
    fmt, codes, values = _every_code(name)
    ours = round_to(torch.from_numpy(values).to(working), fmt).double().numpy()
    assert _same(ours, values)  # each value of the format is a fixed point of the rounding
    back = ours.astype(NARROW[name]).view(np.uint8)
    keep = ~np.isnan(values)
    assert np.array_equal(back[keep], codes[keep])  # and casts to the code it came from


@pytest.mark.parametrize("name", sorted(TORCH_FP8))
def test_every_fp8_value_casts_to_its_code_in_torch(name):
    fmt, codes, values = _every_code(name)
    keep = ~np.isnan(values)
    ours = round_to(torch.from_numpy(values[keep]).float(), fmt)
    assert np.array_equal(ours.to(TORCH_FP8[name]).view(torch.uint8).numpy(), codes[keep])


def _midpoints_and_neighbours(values: np.ndarray) -> np.ndarray:
    """Every tie between neighbouring values, one float64 ulp either side, and beyond the largest."""
    finite = np.unique(values[np.isfinite(values)])
    ties = (finite[1:] + finite[:-1]) / 2
    top = finite.max()
    beyond = np.array([top * 1.01, top * 1.5, top * 4, 1e30, np.inf, 2.0**-40, 2.0**-140])
    out = np.concatenate([ties, np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf), beyond, -beyond])
    return out


def _random_inputs(fmt) -> np.ndarray:
    """Random magnitudes across the format's range and past it (subnormals, overflow) and random bits."""
    rng = np.random.default_rng(7)
    span = rng.uniform(np.log2(fmt.smallest_subnormal) - 3, np.log2(fmt.max_finite) + 2, 20_000)
    magnitudes = np.exp2(span) * rng.choice([-1.0, 1.0], span.size)
    bits = rng.integers(0, 2**32, 20_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([magnitudes, bits[np.isfinite(bits)].astype(np.float64)])


@pytest.mark.parametrize("name", sorted(NARROW))
@pytest.mark.parametrize("working", [np.float32, np.float64])
def test_rounding_matches_ml_dtypes(name, working):
    """Ties (to even), subnormals, overflow (NaN for e4m3, inf for e5m2, saturation for fp6/fp4).
    float64 inputs: those exact in float32 (ml_dtypes converts float64 to fp4/fp6 through float32,
    a double rounding; the next test holds the others to the exact answer)."""
    fmt, _, values = _every_code(name)
    x = np.concatenate([_midpoints_and_neighbours(values), _random_inputs(fmt)]).astype(working)
    with np.errstate(all="ignore"):
        x = x[np.isnan(x) | (x.astype(np.float32).astype(working) == x)]
    with np.errstate(all="ignore"):
        expected = x.astype(NARROW[name]).astype(np.float64)
    ours = round_to(torch.from_numpy(x), fmt).double().numpy()
    assert _same(ours, expected), f"{name}: {(~np.isclose(ours, expected, equal_nan=True)).sum()} of {x.size} differ"


@pytest.mark.parametrize("name", sorted(NARROW))
def test_float64_one_ulp_off_a_tie_rounds_once(name):
    """One float64 ulp above the tie between neighbours lo < hi rounds to hi, one below to lo: one
    correct rounding from float64 (a detour through float32 would land on the tie, then on the even one)."""
    fmt, _, values = _every_code(name)
    finite = np.unique(values[np.isfinite(values)])
    lo, hi = finite[:-1], finite[1:]
    ties = (lo + hi) / 2
    up = round_to(torch.from_numpy(np.nextafter(ties, np.inf)), fmt).numpy()
    down = round_to(torch.from_numpy(np.nextafter(ties, -np.inf)), fmt).numpy()
    assert np.array_equal(up, hi) and np.array_equal(np.abs(down), np.abs(lo))


@pytest.mark.parametrize("name", sorted(TORCH_FP8))
def test_fp8_rounding_matches_torch_casts(name):
    """torch saturates e4m3 on overflow where the format says NaN (numdev follows the format and
    ml_dtypes): within range the casts agree bit for bit."""
    fmt, _, values = _every_code(name)
    x = np.concatenate([_midpoints_and_neighbours(values), _random_inputs(fmt)]).astype(np.float32)
    x = x[np.abs(x) <= fmt.max_finite] if name == "fp8_e4m3" else x
    t = torch.from_numpy(x)
    theirs = t.to(TORCH_FP8[name]).double().numpy()
    assert _same(round_to(t, fmt).double().numpy(), theirs)


def test_saturating_formats_keep_nan_and_saturate_inf():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 7.0, -100.0])
    assert round_to(x, "fp4_e2m1").tolist()[1:] == [6.0, -6.0, 6.0, -6.0]
    assert torch.isnan(round_to(x, "fp4_e2m1")[0])
    assert FORMATS["fp6_e2m3"].max_finite == 7.5 and FORMATS["fp6_e3m2"].max_finite == 28.0
    assert [FORMATS[n].emax for n in NARROW] == [8, 15, 2, 4, 2]  # the OCP MX spec's emax_elem


def _exact_truncate(value: float, fmt) -> float:
    """Round toward zero with rational arithmetic: the reference for the :rtz rounding. inf stays inf
    in formats with inf, becomes NaN in fn formats and the largest finite number in formats with neither."""
    from fractions import Fraction

    if abs(value) == float("inf") and not fmt.has_inf:
        return float("nan") if fmt.has_nan else (fmt.max_finite if value > 0 else -fmt.max_finite)
    if value == 0 or value != value or abs(value) == float("inf"):
        return value
    x = Fraction(value)
    exponent = fmt.emin
    while Fraction(2) ** (exponent + 1) <= abs(x):
        exponent += 1
    quantum = Fraction(2) ** (exponent - fmt.mantissa_bits)
    n = abs(x) // quantum
    result = min(n * quantum, Fraction(fmt.max_finite))
    return float(result if x > 0 else -result)


@pytest.mark.parametrize("name", ["e8m13", "bf16", "fp8_e4m3", "fp4_e2m1", "fp16"])
@pytest.mark.parametrize("working", [torch.float32, torch.float64])
def test_truncation_matches_exact_rational_arithmetic(name, working):
    from numdev.numerics.formats import parse_format, round_to

    fmt = parse_format(name)
    rng = np.random.default_rng(11)
    span = rng.uniform(np.log2(fmt.smallest_subnormal) - 2, min(np.log2(fmt.max_finite) + 2, 120), 1000)
    x = np.exp2(span) * rng.choice([-1.0, 1.0], span.size)
    x = np.concatenate([x, [0.0, -0.0, np.inf, -np.inf, fmt.max_finite, fmt.smallest_subnormal]])
    x = torch.from_numpy(x).to(working)
    ours = round_to(x, parse_format(f"{name}:rtz")).double().numpy()
    expected = np.array([_exact_truncate(float(v), fmt) for v in x.double()])
    assert np.array_equal(ours, expected, equal_nan=True)


@pytest.mark.parametrize("name", sorted(NARROW))
@pytest.mark.parametrize("source", [np.float16, ml_dtypes.bfloat16])
def test_every_16_bit_input_rounds_as_ml_dtypes(name, source):
    """All 65536 fp16 or bf16 bit patterns (their values exact in float32) rounded to each narrow format;
    NaN left out for the formats without NaN (ml_dtypes turns it into -0; numdev keeps NaN visible)."""
    x = np.arange(2**16, dtype=np.uint16).view(source).astype(np.float32)
    x = x[~np.isnan(x)] if FORMATS[name].saturates else x
    with np.errstate(all="ignore"):
        expected = x.astype(NARROW[name]).astype(np.float64)
    assert _same(round_to(torch.from_numpy(x), name).double().numpy(), expected)
