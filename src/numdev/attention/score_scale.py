"""Attention logits multiplied by a known factor: a positive control for the edge of stability.

softmax(factor * q k^T * scale) v, by an inner backend (conf/attention/score_scale.yaml: eager attention
under the run's autocast; there is no default in code) that is handed the scale times the factor: the inner's own arithmetic, tiling and stage
formats are unchanged, only its logits are `factor` times larger (or smaller), in the forward and,
through the same product, in the backward.

Why this harms: the attention-logit-growth instability (Dehghani et al. 2023, arXiv:2302.05442;
Wortsman et al. 2023, arXiv:2309.14322, section 3.1) is training at a high learning rate driving the
logits so large that the softmax collapses to one key (its entropy near zero) and the loss diverges;
a larger logit scale starts every layer nearer that point and makes each step's change to q and k
move the logits `factor` times further. So a run with factor > 1 is expected to fail at a lower
learning rate than the same model without it: a deviation of known size whose direction on the edge
is known, which a rule asking "does this backend move the edge earlier?" must detect
(docs/gpu.md#the-edge-of-stability-on-the-cpu). It is not a numeric error: it changes the model.

factor is in (0, 64]; 1 is the inner backend itself. Above 64 the edge spreads out rather than moving earlier
in every seed: with factors 128 and 256 the language model of experiment=lr_edge diverged at lr 0.03 in 1 and
2 of 3 pilot seeds and trained at 0.1 in 2 and 1 of them (docs/gpu.md#the-edge-of-stability-on-the-cpu).
"""

from __future__ import annotations

import math

from numdev.attention.registry import AttentionBackend, inner_backend, register

MAX_FACTOR = 64.0


@register("score_scale")
class ScoreScale(AttentionBackend):
    wraps = True

    def __init__(self, inner: AttentionBackend, factor: float = 4.0):
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) \
                or not (0 < factor <= MAX_FACTOR):
            raise ValueError(f"attention.factor={factor!r} must be a number in (0, {MAX_FACTOR:g}]: the multiplier of "
                             "every attention logit (1 is the inner backend itself)")
        self.inner = inner_backend(inner, self.name)
        self.factor = float(factor)

    def unsupported_reason(self, q):
        return self.inner.unsupported_reason(q)

    def forward_only(self, key="attention"):
        return self.inner.forward_only(f"{key}.inner")

    def kv_tiling(self, n_queries, n_keys, head_dim, device="cpu"):
        return self.inner.kv_tiling(n_queries, n_keys, head_dim, device)  # the inner's blocks: only the logits are scaled

    def forward(self, q, k, v, scale, causal):
        return self.inner(q, k, v, scale=scale * self.factor, causal=causal)

    def describe(self):
        return {"backend": self.name, "factor": self.factor, "inner": self.inner.describe()}
