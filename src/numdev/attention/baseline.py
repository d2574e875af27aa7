"""Baseline Attention: the full score matrix, softmax, then P.V, each stage in an explicit format.

Two presets name the two Baselines a Flash ratio can divide by (numdev.numerics.stages):
  paper  every stage in the run precision, the exps and the row sum included: the paper's Baseline.
  eager  what eager PyTorch computes for softmax(q @ k^T * scale) @ v on bf16/fp16 tensors: the
         softmax's internals in FP32, P rounded once. tests/test_eager_baseline.py holds it to
         PyTorch's own result (the only differing bits come from the softmax kernel's fast exp).
"""

from __future__ import annotations

import torch

from numdev.attention.checks import causal_mask, round_masked
from numdev.attention.registry import AttentionBackend, one_block, register
from numdev.numerics.formats import round_to
from numdev.numerics.stages import StageFormats, prepared_inputs, stage_formats


@register("baseline")
class Baseline(AttentionBackend):
    """S = QK^T scale -> E = exp(S - max) -> l = sum E -> P = E / l -> O = P V.

    Stages: input (Q, K, V), score (S: the product QK^T, then the scaled product, each rounded,
    as the literal expression `q @ k.transpose(-1, -2) * scale` rounds them), stats (the softmax's
    internals: S - max, E and l), prob (P), accum (P V), output (O).
    """

    def __init__(self, formats: StageFormats | None = None):
        self.formats = formats if formats is not None else stage_formats("paper", "fp32")

    def forward(self, q, k, v, scale, causal):
        f = self.formats
        out_dtype = q.dtype
        q, k, v = prepared_inputs(q, k, v, f)
        products = round_to(q @ k.transpose(-1, -2), f.score)  # (B, H, Nq, Nk)
        scores = round_to(products * scale, f.score)
        if causal:
            key_index = torch.arange(k.shape[2], device=q.device)
            scores = scores.masked_fill(causal_mask(q.shape[2], key_index, q.device), float("-inf"))
        row_max = scores.amax(dim=-1, keepdim=True)
        row_max = row_max.masked_fill(row_max == float("-inf"), 0.0)  # fully masked rows
        exps = round_to(torch.exp(round_masked(scores - row_max, f.stats)), f.stats)
        row_sum = round_to(exps.sum(dim=-1, keepdim=True), f.stats)
        probs = round_to(exps / row_sum, f.prob)
        out = round_to(round_to(probs @ v, f.accum), f.output)
        return out.to(out_dtype)

    def describe(self):
        return {"backend": self.name, **{f"formats.{k}": v for k, v in self.formats.describe().items()}}

    def kv_tiling(self, n_queries, n_keys, head_dim, device="cpu"):
        return one_block(n_keys)
