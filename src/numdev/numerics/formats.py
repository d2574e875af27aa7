"""Floating-point formats, each with its rounding: to nearest even, toward zero, or stochastic.

A format is a number of exponent and mantissa bits plus what its top exponent means:
IEEE-like formats keep it for inf and NaN; the OCP "fn" formats (fp8_e4m3) use it for finite
numbers, keep only the all-ones mantissa for NaN, and have no inf (overflow becomes NaN); the OCP MX
element formats fp6_e2m3, fp6_e3m2 and fp4_e2m1 have neither inf nor NaN: every code is a finite
number, and a conversion saturates (overflow and inf become the largest finite number, as ml_dtypes
and the OCP MX specification v1.0 convert).

`round_to(x, fmt)` returns a tensor of x's dtype holding the values of x rounded, once, to fmt by
fmt's rounding (`Rounding`, written after the format's name: "bf16", "bf16:rtz", "bf16:sr",
"e4m3:sr8"):

  nearest     (":rne", the default) ties to even, gradual underflow into subnormals, overflow to
              inf (NaN for fn formats, the largest finite number for formats without inf and NaN)
  zero        (":rtz") toward zero (IEEE roundTowardZero): the bits below fmt's quantum dropped; a
              finite overflow becomes the largest finite number
  stochastic  (":sr<n>", n random bits per element, 16 when not written) up or down at random: with
              x = (i + f) quanta (i an integer, 0 <= f < 1), away from zero when round(f 2^n) + r >= 2^n
              for a uniform random integer 0 <= r < 2^n (f rounded to n bits, ties to even), so
              E[round(x)] = x up to f's rounding to n bits (exactly when f has n bits or fewer);
              overflow as nearest. This is gfloat's RoundMode.Stochastic (srbits r, srnumbits n), bit
              for bit; the random integers come from the format's own seeded torch.Generator
              (`with_random_source`; numdev.numerics.stages and numdev.gemm.stages give each stochastic
              stage one, seeded by numerics.seed / gemm.seed), or are given (`round_stochastic`).

inf and NaN: NaN stays NaN (in the tensor, even for a format without NaN); inf stays inf in formats
with inf, becomes NaN in fn formats and the largest finite number in formats without either (as
gfloat with sat = fmt.saturates). Under autograd every rounding is a straight-through identity.
`decode(codes, fmt)` gives the value of every bit pattern (tests hold round_to to ml_dtypes, torch and
gfloat, and decode to ml_dtypes and torch, on every code).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import torch

ROUNDINGS = ("nearest", "zero", "stochastic")
_SUFFIXES = {"rne": "nearest", "rtz": "zero", "sr": "stochastic"}
DEFAULT_RANDOM_BITS = 16
SEED_LIMIT = 2**64  # torch.manual_seed takes 64 bits; a seed beyond is refused naming its key
MAX_RANDOM_BITS = 32


@dataclass(frozen=True)
class Rounding:
    """How a value is rounded into a format; `source` (stochastic only) draws the random integers."""

    mode: str = "nearest"
    random_bits: int = 0  # stochastic: random bits per element (1-32)
    source: torch.Generator | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.mode not in ROUNDINGS:
            raise ValueError(f"unknown rounding {self.mode!r}: use one of {', '.join(ROUNDINGS)}")
        stochastic = self.mode == "stochastic"
        if stochastic and not 1 <= self.random_bits <= MAX_RANDOM_BITS or not stochastic and self.random_bits != 0:
            raise ValueError(f"rounding {self.mode}: random_bits={self.random_bits} "
                             + (f"must lie in 1-{MAX_RANDOM_BITS}" if stochastic else "applies to stochastic rounding only"))

    @property
    def suffix(self) -> str:
        """What follows the format's name in its spec: '', ':rtz' or ':sr<bits>'."""
        return {"nearest": "", "zero": ":rtz", "stochastic": f":sr{self.random_bits}"}[self.mode]


NEAREST = Rounding()


@dataclass(frozen=True)
class FloatFormat:
    name: str
    exponent_bits: int
    mantissa_bits: int
    has_inf: bool = True
    has_nan: bool = True  # False: no NaN code either (MX fp6/fp4): the top binade is wholly finite
    rounding: Rounding = NEAREST

    def __post_init__(self):
        if not 2 <= self.exponent_bits <= 11 or not 0 <= self.mantissa_bits <= 52:
            raise ValueError(
                f"format {self.name!r}: need 2 <= exponent bits <= 11 and 0 <= mantissa bits <= 52, "
                f"got e{self.exponent_bits}m{self.mantissa_bits}"
            )

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal binade (subnormals share its quantum)."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        # fn formats use the top exponent field for finite numbers too.
        return self.bias if self.has_inf else self.bias + 1

    @property
    def max_finite(self) -> float:
        top_mantissa = 2 - 2.0 ** -self.mantissa_bits
        if not self.has_inf and self.has_nan:  # fn: the all-ones mantissa of the top binade is NaN
            top_mantissa = 2 - 2.0 ** -(self.mantissa_bits - 1)
        return top_mantissa * 2.0**self.emax

    @property
    def saturates(self) -> bool:
        """No inf and no NaN: overflow becomes the largest finite number."""
        return not self.has_inf and not self.has_nan

    @property
    def total_bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def overflow_threshold(self) -> float:
        """Magnitudes above this round past max_finite (to inf, NaN for fn formats, max_finite when saturating)."""
        return self.max_finite + 2.0 ** (self.emax - self.mantissa_bits - 1)

    @property
    def smallest_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.mantissa_bits)

    @property
    def eps(self) -> float:
        """Unit roundoff: half the distance from 1 to the next number."""
        return 2.0 ** -(self.mantissa_bits + 1)

    def fits_in(self, dtype: torch.dtype) -> bool:
        """Whether every value of this format is exactly representable in `dtype`."""
        wide = {torch.float32: (8, 23), torch.float64: (11, 52)}.get(dtype)
        if wide is None:
            return False
        return self.exponent_bits <= wide[0] and self.mantissa_bits <= wide[1]

    @property
    def torch_dtype(self) -> torch.dtype | None:
        """The torch dtype with exactly these values, if there is one."""
        return _TORCH_DTYPES.get(self.name)

    @property
    def spec(self) -> str:
        """The name with the rounding, as parse_format reads it back: 'bf16', 'bf16:sr16'."""
        return self.name + self.rounding.suffix

    @property
    def nearest(self) -> bool:
        return self.rounding.mode == "nearest"

    def __str__(self) -> str:
        return self.spec


FORMATS: dict[str, FloatFormat] = {
    f.name: f
    for f in (
        FloatFormat("fp64", 11, 52),
        FloatFormat("fp32", 8, 23),
        FloatFormat("tf32", 8, 10),
        FloatFormat("bf16", 8, 7),
        FloatFormat("fp16", 5, 10),
        FloatFormat("fp8_e4m3", 4, 3, has_inf=False),
        FloatFormat("fp8_e5m2", 5, 2),
        # The OCP MX element formats (OCP Microscaling Formats (MX) Specification v1.0, section 5.3)
        FloatFormat("fp6_e2m3", 2, 3, has_inf=False, has_nan=False),
        FloatFormat("fp6_e3m2", 3, 2, has_inf=False, has_nan=False),
        FloatFormat("fp4_e2m1", 2, 1, has_inf=False, has_nan=False),
    )
}

_TORCH_DTYPES = {
    "fp64": torch.float64,
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}

_CUSTOM = re.compile(r"^e(\d+)m(\d+)$")


_ROUNDING_SPEC = re.compile(r"^(rne|rtz|sr)(\d*)$")


def parse_format(spec) -> FloatFormat:
    """A format from a name ('bf16'), an 'e5m10' string, or an (exponent, mantissa) pair; a name may
    carry its rounding after a colon: 'bf16:rne' (nearest even, the default), 'bf16:rtz' (toward
    zero), 'bf16:sr' or 'bf16:sr8' (stochastic with 16 or 8 random bits per element)."""
    if isinstance(spec, FloatFormat):
        return spec
    if isinstance(spec, str) and ":" in spec:
        name, _, mode = spec.partition(":")
        return replace(parse_format(name), rounding=_parse_rounding(spec, mode))
    if isinstance(spec, str):
        if spec in FORMATS:
            return FORMATS[spec]
        match = _CUSTOM.match(spec)
        if match:
            return _custom(int(match[1]), int(match[2]))
    elif _is_pair(spec):
        return _custom(int(spec[0]), int(spec[1]))
    raise ValueError(
        f"unknown float format {spec!r}: use one of {', '.join(FORMATS)}, "
        "a custom 'e<exponent bits>m<mantissa bits>' such as e5m10, or an [exponent, mantissa] pair; "
        "a rounding may follow a colon: bf16:rne, bf16:rtz, bf16:sr, bf16:sr8"
    )


def _parse_rounding(spec: str, mode: str) -> Rounding:
    match = _ROUNDING_SPEC.match(mode)
    if not match or (match[2] and match[1] != "sr"):
        raise ValueError(f"unknown rounding {mode!r} in {spec!r}: write rne (nearest even), rtz (toward zero) or sr<bits> "
                         f"(stochastic with that many random bits, 1-{MAX_RANDOM_BITS}; sr alone: {DEFAULT_RANDOM_BITS}), "
                         "e.g. bf16:sr or e4m3:sr8")
    if match[1] != "sr":
        return Rounding(_SUFFIXES[match[1]])
    bits = int(match[2]) if match[2] else DEFAULT_RANDOM_BITS
    if not 1 <= bits <= MAX_RANDOM_BITS:
        raise ValueError(f"{spec!r}: stochastic rounding takes 1-{MAX_RANDOM_BITS} random bits per element, not {bits}")
    return Rounding("stochastic", bits)


def stream_seed(seed: int, stream: int) -> int:
    """The seed of random stream `stream` (e.g. an input seed) under a configured seed: a measurement's
    random integers depend on both, not on what ran before it in the same process."""
    return (int(seed) * 0x9E3779B97F4A7C15 + int(stream) * 0xBF58476D1CE4E5B9 + 1) % (1 << 63)


def seeded(formats: dict[str, FloatFormat], seed, key: str) -> dict[str, FloatFormat]:
    """The formats of one computation (stage or GEMM formats) with one torch.Generator, seeded by `seed`
    (the config key `key`), shared by every stochastic one; unchanged (no generator) when none is."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"{key}={seed!r} must be a non-negative integer below 2^64 (a 64-bit seed)")
    if all(f.rounding.mode != "stochastic" for f in formats.values()):
        return formats
    source = torch.Generator().manual_seed(seed)
    return {name: with_random_source(f, source) for name, f in formats.items()}


def with_random_source(fmt: FloatFormat, source: torch.Generator) -> FloatFormat:
    """fmt drawing its stochastic rounding's random integers from `source` (unchanged if not stochastic)."""
    if fmt.rounding.mode != "stochastic":
        return fmt
    return replace(fmt, rounding=replace(fmt.rounding, source=source))


def _is_pair(spec) -> bool:
    try:
        return len(spec) == 2 and all(float(s) == int(s) for s in spec)
    except (TypeError, ValueError):
        return False


def _custom(exponent_bits: int, mantissa_bits: int) -> FloatFormat:
    for known in FORMATS.values():
        if known.has_inf and (known.exponent_bits, known.mantissa_bits) == (exponent_bits, mantissa_bits):
            return known
    return FloatFormat(f"e{exponent_bits}m{mantissa_bits}", exponent_bits, mantissa_bits)


def round_to(x: torch.Tensor, fmt: FloatFormat | str) -> torch.Tensor:
    """x rounded to `fmt` by fmt's rounding, as a tensor of x's dtype (float32 or float64)."""
    fmt = parse_format(fmt)
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"round_to works in float32 or float64, got {x.dtype}; upcast first")
    if fmt.exponent_bits >= _WIDTH[x.dtype][0] and fmt.mantissa_bits >= _WIDTH[x.dtype][1]:
        return x  # every value of x is already in fmt (no random integers are drawn)
    if fmt.rounding.mode == "stochastic" and fmt.rounding.source is None:
        raise ValueError(f"format {fmt.spec} rounds stochastically but has no source of random bits: give it a seeded "
                         "torch.Generator (numdev.numerics.formats.with_random_source; numerics.seed in a config)")
    if x.requires_grad:
        return _StraightThrough.apply(x, fmt)
    return _round(x, fmt)


_WIDTH = {torch.float32: (8, 23), torch.float64: (11, 52)}


def _round(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    if fmt.rounding.mode == "zero":
        return _truncate(x, fmt)
    if fmt.rounding.mode == "stochastic":  # the integers drawn here are in range: no check on this path
        bits = torch.randint(0, 1 << fmt.rounding.random_bits, tuple(x.shape), generator=fmt.rounding.source, dtype=torch.int64)
        return _stochastic(x, fmt, bits.to(x.device))
    return _round_nearest(x, fmt)


def _round_nearest(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    native = fmt.torch_dtype
    # An ATen conversion is one correct rounding from float32 (and from float64 to float32);
    # from float64 to narrower dtypes ATen goes through float32, a double rounding.
    if native is not None and (x.dtype == torch.float32 or native == torch.float32):
        rounded = x.to(native).to(x.dtype)
        if not fmt.has_inf:  # ATen saturates fn formats; the format (and ml_dtypes) says NaN
            rounded.masked_fill_(x.abs() > fmt.overflow_threshold, float("nan"))
        return rounded
    if fmt.has_inf and fmt.exponent_bits == _WIDTH[x.dtype][0]:
        return _round_mantissa(x, fmt.mantissa_bits)
    return _round_normal_fast(x, fmt)


def _truncate(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Toward zero: the bits below fmt's quantum dropped (on the bit pattern where x is normal in fmt)."""
    int_dtype = torch.int32 if x.dtype == torch.float32 else torch.int64
    dropped = _WIDTH[x.dtype][1] - fmt.mantissa_bits
    truncated = (x.view(int_dtype) & -(1 << dropped)).view(x.dtype)  # exact where x is normal in fmt
    odd = ~(x.abs() >= 2.0**fmt.emin) | (truncated.abs() > fmt.max_finite)  # zeros, subnormals, overflow, NaN
    if bool(odd.any()):
        truncated[odd] = _truncate_generic(x[odd], fmt)
    return truncated


def _truncate_generic(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    _, exponent = torch.frexp(x)
    quantum = exponent.sub_(1 + fmt.mantissa_bits).clamp_(min=fmt.emin - fmt.mantissa_bits)
    truncated = _times_pow2(_times_pow2(x, quantum.neg()).trunc_(), quantum)
    limit = torch.tensor(fmt.max_finite, dtype=x.dtype)
    return torch.where(torch.isfinite(x), torch.clamp(truncated, -limit, limit), _non_finite(x, fmt))


def round_stochastic(x: torch.Tensor, fmt: FloatFormat | str, bits: torch.Tensor) -> torch.Tensor:
    """x rounded stochastically to fmt with the given random integers (0 <= bits < 2^n, n =
    fmt.rounding.random_bits, broadcastable to x): gfloat's RoundMode.Stochastic(srbits=bits,
    srnumbits=n) element by element (module docstring). float32 or float64 x; no gradient."""
    fmt = parse_format(fmt)
    n = fmt.rounding.random_bits
    if fmt.rounding.mode != "stochastic":
        raise ValueError(f"round_stochastic needs a stochastic format (e.g. {fmt.name}:sr), not {fmt.spec}")
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"round_stochastic works in float32 or float64, got {x.dtype}; upcast first")
    bits = torch.as_tensor(bits, device=x.device).to(torch.int64)
    if bits.numel() and (int(bits.min()) < 0 or int(bits.max()) >= 1 << n):
        raise ValueError(f"random bits for {fmt.spec} lie in [0, 2^{n}), got {int(bits.min())}..{int(bits.max())}")
    return _stochastic(x, fmt, bits)


def _stochastic(x: torch.Tensor, fmt: FloatFormat, bits: torch.Tensor) -> torch.Tensor:
    """round_stochastic without its checks (bits: int64, in range, broadcastable to x)."""
    n = fmt.rounding.random_bits
    if x.dtype == torch.float32 and fmt.has_inf and fmt.exponent_bits == 8 and n == 23 - fmt.mantissa_bits:
        # The n dropped bits themselves: add the random integer to them and clear them (a carry is the
        # rounding away, into the next binade or to inf), as hardware does; the generic rule gives the same.
        raw = x.view(torch.int32)
        added = ((raw + bits.to(torch.int32)) & -(1 << n)).view(torch.float32)
        return torch.where(torch.isfinite(x), added, x)
    finite = torch.isfinite(x)
    magnitude = torch.where(finite, x.abs(), torch.zeros((), dtype=x.dtype))
    _, exponent = torch.frexp(magnitude)
    quantum = exponent.sub_(1 + fmt.mantissa_bits).clamp_(min=fmt.emin - fmt.mantissa_bits)
    scaled = _times_pow2(magnitude, quantum.neg())  # exact: x = scaled quanta
    whole = scaled.floor()
    fraction = (scaled - whole).mul_(2.0**n).round_()  # the fraction on n bits, ties to even (exact: powers of two)
    away = (fraction.to(torch.int64) + bits) >= 1 << n
    rounded = torch.copysign(_times_pow2(whole + away.to(x.dtype), quantum), x)
    overflow = rounded.abs() > fmt.max_finite
    if fmt.saturates:
        beyond = torch.copysign(torch.tensor(fmt.max_finite, dtype=x.dtype), x)
    else:
        beyond = torch.copysign(torch.tensor(float("inf") if fmt.has_inf else float("nan"), dtype=x.dtype), x)
    return torch.where(finite, torch.where(overflow, beyond, rounded), _non_finite(x, fmt))


def _non_finite(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Where x is inf or NaN: NaN stays NaN; inf stays inf (formats with inf), becomes NaN (fn formats)
    or the largest finite number (formats with neither)."""
    if fmt.has_inf:
        return x
    if fmt.saturates:
        return torch.where(torch.isinf(x), torch.copysign(torch.tensor(fmt.max_finite, dtype=x.dtype), x), x)
    return torch.where(torch.isinf(x), torch.tensor(float("nan"), dtype=x.dtype), x)


def _round_normal_fast(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Ties-to-even on the bit pattern where x lies in fmt's normal range and rounds to a finite
    number (the bit rounding is exact there: fmt's quantum is x's own exponent's); the generic
    path for the rest (zeros, subnormals, overflow, NaN), which is usually none or few."""
    rounded = _round_mantissa(x, fmt.mantissa_bits)
    odd = ~(x.abs() >= 2.0**fmt.emin) | (rounded.abs() > fmt.max_finite)
    if bool(odd.any()):
        rounded[odd] = _round_generic(x[odd], fmt)
    return rounded


def _round_mantissa(x: torch.Tensor, mantissa_bits: int) -> torch.Tensor:
    """Ties-to-even on the bit pattern, for a format with x's own exponent range.

    Adding half an ulp (minus one, plus the kept lsb) carries into the exponent exactly when the
    value rounds up a binade or overflows to inf; subnormals round with the same quantum.
    """
    int_dtype = torch.int32 if x.dtype == torch.float32 else torch.int64
    dropped = _WIDTH[x.dtype][1] - mantissa_bits
    bits = x.view(int_dtype)
    kept_lsb = (bits >> dropped) & 1
    rounded = ((bits + kept_lsb + ((1 << (dropped - 1)) - 1)) & -(1 << dropped)).view(x.dtype)
    return torch.where(torch.isnan(x), x, rounded)


def _round_generic(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    _, exponent = torch.frexp(x)  # x = m * 2**exponent with 0.5 <= |m| < 1
    # log2 of the spacing of fmt's numbers around x; subnormals share the smallest normal's.
    quantum = exponent.sub_(1 + fmt.mantissa_bits).clamp_(min=fmt.emin - fmt.mantissa_bits)
    # Scaling by powers of two is exact, and torch.round breaks ties to even.
    rounded = _times_pow2(_times_pow2(x, quantum.neg()).round_(), quantum)
    overflow = rounded.abs() > fmt.max_finite
    if fmt.saturates:
        return torch.where(overflow, torch.copysign(torch.tensor(fmt.max_finite, dtype=x.dtype), x), rounded)
    if fmt.has_inf:
        return torch.where(overflow, torch.copysign(torch.tensor(float("inf"), dtype=x.dtype), x), rounded)
    return rounded.masked_fill_(overflow, float("nan"))


def _times_pow2(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """x * 2**n, exactly, with n split in two so each factor is a normal number."""
    half = n >> 1
    return (x * _pow2(half, x.dtype)).mul_(_pow2(n - half, x.dtype))


def _pow2(n: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """2**n built from its exponent bits (n within the dtype's normal range)."""
    if dtype == torch.float64:
        return ((n.to(torch.int64) + 1023) << 52).view(torch.float64)
    return ((n.to(torch.int32) + 127) << 23).view(torch.float32)


def decode(codes: torch.Tensor, fmt: FloatFormat | str, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The values of fmt's bit patterns `codes` (integers below 2**total_bits), as `dtype`."""
    fmt = parse_format(fmt)
    codes = codes.to(torch.int64)
    if ((codes < 0) | (codes >= 2**fmt.total_bits)).any():
        raise ValueError(f"codes of {fmt.name} lie in [0, {2**fmt.total_bits}), got {int(codes.min())}..{int(codes.max())}")
    mantissa_mask, top = (1 << fmt.mantissa_bits) - 1, (1 << fmt.exponent_bits) - 1
    sign = torch.where((codes >> (fmt.total_bits - 1)) == 1, -1.0, 1.0).double()
    field = (codes >> fmt.mantissa_bits) & top
    mantissa = (codes & mantissa_mask).double() / 2.0**fmt.mantissa_bits
    exponent = torch.clamp(field, min=1) - fmt.bias  # subnormals (field 0) share the smallest normal's exponent
    value = sign * (mantissa + (field > 0).double()) * torch.pow(2.0, exponent.double())
    if fmt.has_inf:
        value = torch.where((field == top) & (mantissa == 0), sign * float("inf"), value)
        value = torch.where((field == top) & (mantissa > 0), float("nan"), value)
    elif fmt.has_nan:
        value = torch.where((field == top) & ((codes & mantissa_mask) == mantissa_mask), float("nan"), value)
    return value.to(dtype)


class _StraightThrough(torch.autograd.Function):
    """Rounding in the forward pass, identity in the backward pass."""

    @staticmethod
    def forward(ctx, x, fmt):
        return _round(x, fmt)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def float32_ulps(found: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """found - reference in float32 units in the last place (int64, signed; signed zeros 0 apart): the
    difference of their bit patterns mapped to ordered integers (negatives reflected below zero)."""
    def ordered(x: torch.Tensor) -> torch.Tensor:
        bits = x.to(torch.float32).contiguous().view(torch.int32).long()
        return torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits)
    return ordered(found) - ordered(reference)
