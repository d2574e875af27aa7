"""Input generators for the microbenchmark: identical Q, K, V for every method under test.

Values are drawn in float64 from a seeded generator. With `quantize` the draws are rounded to the
run's input format first, as if generated in that dtype (torch.randn(dtype=bf16)): then the golden
value sees exactly the inputs the methods see, and the deviation measured is the algorithm's own,
not the input rounding's. Without it, methods round the inputs themselves and the golden uses the
exact draws (FlashAttention-3's Table 3 setting, where FP8 input quantisation is part of the error).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from numdev.numerics.formats import FloatFormat, round_to


@dataclass(frozen=True)
class Shape:
    batch: int = 1
    heads: int = 1
    seq_q: int = 1024
    seq_k: int | None = None  # None: same as seq_q
    dim: int = 64

    def __post_init__(self):
        for name in ("batch", "heads", "seq_q", "dim", "seq_k"):
            value = getattr(self, name)
            if value is None and name == "seq_k":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                extra = " or null" if name == "seq_k" else ""
                raise ValueError(f"shape.{name}={value!r} must be a positive integer{extra}")

    @property
    def n_k(self) -> int:
        return self.seq_q if self.seq_k is None else self.seq_k


class InputGenerator:
    name = "?"

    def __init__(self, scale: float = 1.0, quantize: bool = True):
        self.scale = scale
        self.quantize = quantize

    def draw(self, n: int, generator: torch.Generator) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, shape: Shape, seed: int, input_format: FloatFormat | None = None):
        """(q, k, v) in float64: q (B, H, seq_q, dim), k and v (B, H, n_k, dim)."""
        generator = torch.Generator().manual_seed(seed)
        tensors = []
        for rows in (shape.seq_q, shape.n_k, shape.n_k):
            count = shape.batch * shape.heads * rows * shape.dim
            t = (self.draw(count, generator) * self.scale).view(shape.batch, shape.heads, rows, shape.dim)
            if self.quantize and input_format is not None:
                t = round_to(t, input_format)
            tensors.append(t)
        return tuple(tensors)

    def describe(self) -> dict:
        return {"generator": self.name, "scale": self.scale, "quantize": self.quantize}


class NormalInputs(InputGenerator):
    """Standard normal entries, as in the paper."""

    name = "normal"

    def draw(self, n, generator):
        return torch.randn(n, generator=generator, dtype=torch.float64)


class UniformInputs(InputGenerator):
    """U[lo, hi) entries; the default [0, 1) is what torch.rand gives.

    Why it matters: with all-positive Q and K every score is positive, so exp(S - m) stays close
    to 1 for many keys and the running row sum l grows to about N. In BF16 (8 significant bits) a
    sum near N swamps what each new key/value block adds, and a BF16 output accumulator rescaled
    at every block (FA1) loses the same way: this is the input under which the paper-like
    emulation (FA1, every stage in BF16) deviates ~10x more than Baseline; with N(0, 1) inputs
    the same emulation gives about 3x (docs/microbenchmark.md, experiment=reconcile).
    """

    name = "uniform"

    def __init__(self, scale: float = 1.0, quantize: bool = True, lo: float = 0.0, hi: float = 1.0):
        super().__init__(scale, quantize)
        if not lo < hi:
            raise ValueError(f"inputs.lo={lo} must be below inputs.hi={hi}")
        self.lo, self.hi = float(lo), float(hi)

    def draw(self, n, generator):
        return torch.rand(n, generator=generator, dtype=torch.float64) * (self.hi - self.lo) + self.lo

    def describe(self):
        return {**super().describe(), "lo": self.lo, "hi": self.hi}


class OutlierInputs(InputGenerator):
    """N(0, 1) + N(0, outlier_std^2) * Bernoulli(outlier_prob): FlashAttention-3's outlier features."""

    name = "outliers"

    def __init__(self, scale: float = 1.0, quantize: bool = False, outlier_std: float = 10.0, outlier_prob: float = 0.001):
        super().__init__(scale, quantize)
        if not 0 <= outlier_prob <= 1:
            raise ValueError(f"inputs.outlier_prob={outlier_prob} must lie in [0, 1]")
        self.outlier_std, self.outlier_prob = outlier_std, outlier_prob

    def draw(self, n, generator):
        base = torch.randn(n, generator=generator, dtype=torch.float64)
        spikes = torch.randn(n, generator=generator, dtype=torch.float64) * self.outlier_std
        hits = torch.rand(n, generator=generator, dtype=torch.float64) < self.outlier_prob
        return base + spikes * hits

    def describe(self):
        return {**super().describe(), "outlier_std": self.outlier_std, "outlier_prob": self.outlier_prob}


# The generators by name (conf/bench/inputs/<name>.yaml instantiates the same classes).
GENERATORS = {cls.name: cls for cls in (NormalInputs, UniformInputs, OutlierInputs)}
