"""Relative noise on every attention output: the calibration ladder's per-call rungs, and a biased twin.

mode unbiased (default): out <- out * (1 + delta * z), z ~ N(0, 1) per element and call, drawn from
the backend's own generator (seed: the run's seed.perturbation), after an inner backend (eager
attention under the run's autocast in conf/attention/output_noise.yaml; no default in code) computed out. A deviation of known relative size in
every call, forward and (through the product) backward, as Flash's own per-call deviation is: the
study reads Flash's weight distance against these rungs (docs/study.md#ladder).

mode biased: out <- out + delta * |out| = out * (1 + delta * s), s = sign(out), for every element and
call: the same RMS relative deviation (E[z^2] = E[s^2] = 1, zeros aside) but every deviation upward,
so its mean is delta * mean|out| > 0 where the unbiased one's is 0: a signed bias, the shape of Qiu &
Yao's mechanism (arXiv:2510.04212: the bf16 rounding of P V errs consistently in one direction), as a
positive control of known size. Unlike a gain out * (1 + delta), which the next projection absorbs by
rescaling its weights, it is not a linear map of out. Nothing is drawn, so the generator does not advance.

delta is in (0, 10]: the ladder runs upward until training is harmed. The product is formed in
fp32 and cast back to the output's dtype, so under bf16 a delta well below bf16's half-ulp (2^-9)
mostly rounds away: what a bf16 run can carry, not a bug.
"""

from __future__ import annotations

import torch

from numdev.attention.registry import AttentionBackend, inner_backend, register

MODES = ("unbiased", "biased")
MAX_DELTA = 10.0


@register("output_noise")
class OutputNoise(AttentionBackend):
    wraps = True

    def __init__(self, inner: AttentionBackend, delta: float = 1e-3, seed: int = 0, mode: str = "unbiased"):
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not (0 < delta <= MAX_DELTA):
            raise ValueError(f"attention.delta={delta!r} must be a number in (0, {MAX_DELTA:g}]")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"attention.seed={seed!r} must be a non-negative integer")
        if mode not in MODES:
            raise ValueError(f"attention.mode={mode!r}: use unbiased (out x (1 + delta z), z ~ N(0, 1)) "
                             "or biased (out + delta |out|, every element)")
        self.inner = inner_backend(inner, self.name)
        self.delta, self.seed, self.mode = float(delta), seed, mode
        self.generator = torch.Generator().manual_seed(seed)

    def unsupported_reason(self, q):
        return self.inner.unsupported_reason(q)

    def forward_only(self, key="attention"):
        return self.inner.forward_only(f"{key}.inner")

    def kv_tiling(self, n_queries, n_keys, head_dim, device="cpu"):
        return self.inner.kv_tiling(n_queries, n_keys, head_dim, device)  # the noise is per element: the inner's blocks

    def forward(self, q, k, v, scale, causal):
        out = self.inner(q, k, v, scale=scale, causal=causal)
        if self.mode == "biased":
            wide = out.float()
            return (wide + self.delta * wide.abs()).to(out.dtype)
        z = torch.randn(out.shape, generator=self.generator, dtype=torch.float32).to(out.device)
        return (out.float() * (1.0 + self.delta * z)).to(out.dtype)

    def describe(self):
        return {"backend": self.name, "delta": self.delta, "seed": self.seed, "mode": self.mode, "inner": self.inner.describe()}
