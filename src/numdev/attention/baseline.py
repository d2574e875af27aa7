"""Baseline Attention: the full score matrix, softmax, then P.V, each stage in an explicit format."""

from __future__ import annotations

import torch

from numdev.attention.checks import causal_mask, round_masked
from numdev.attention.registry import AttentionBackend, register
from numdev.formats import round_to
from numdev.numerics import StageFormats, stage_formats, working_input


@register("baseline")
class Baseline(AttentionBackend):
    """S = QK^T scale -> E = exp(S - max) -> l = sum E -> P = E / l -> O = P V.

    Stages: input (Q, K, V), score (S), stats (E and l), prob (P), accum (P V), output (O).
    """

    def __init__(self, formats: StageFormats | None = None):
        self.formats = formats if formats is not None else stage_formats("paper", "fp32")

    def forward(self, q, k, v, scale, causal):
        f = self.formats
        out_dtype = q.dtype
        q, k, v = (working_input(t, f) for t in (q, k, v))
        scores = round_to(q @ k.transpose(-1, -2) * scale, f.score)  # (B, H, Nq, Nk)
        if causal:
            key_index = torch.arange(k.shape[2], device=q.device)
            scores = scores.masked_fill(causal_mask(q.shape[2], key_index, q.device), float("-inf"))
        row_max = scores.amax(dim=-1, keepdim=True)
        row_max = row_max.masked_fill(row_max == float("-inf"), 0.0)  # fully masked rows
        exps = round_to(torch.exp(round_masked(scores - row_max, f.score)), f.stats)
        row_sum = round_to(exps.sum(dim=-1, keepdim=True), f.stats)
        probs = round_to(exps / row_sum, f.prob)
        out = round_to(round_to(probs @ v, f.accum), f.output)
        return out.to(out_dtype)

    def describe(self):
        return {"backend": self.name, **{f"formats.{k}": v for k, v in self.formats.describe().items()}}
