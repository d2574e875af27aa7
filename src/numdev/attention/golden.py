"""The golden value: exact attention in float64, in query chunks so long sequences never need
the whole n_q x n_k score matrix at once."""

from __future__ import annotations

import math

import torch

from numdev.attention.checks import causal_mask, check_qkv


def golden_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    causal: bool = False,
    max_chunk_elements: int = 2**24,
) -> torch.Tensor:
    """softmax(q k^T * scale) v in float64, returned as float64."""
    check_qkv(q, k, v)
    q, k, v = q.double(), k.double(), v.double()
    batch, heads, n_q, dim = q.shape
    n_k = k.shape[2]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    rows = max(1, max_chunk_elements // (batch * heads * n_k))
    key_index = torch.arange(n_k, device=q.device)
    out = torch.empty(batch, heads, n_q, v.shape[-1], dtype=torch.float64, device=q.device)
    for start in range(0, n_q, rows):
        stop = min(start + rows, n_q)
        scores = q[:, :, start:stop] @ k.transpose(-1, -2) * scale  # (B, H, rows, n_k)
        if causal:
            mask = causal_mask(stop - start, key_index - start, q.device)
            scores.masked_fill_(mask, float("-inf"))
        out[:, :, start:stop] = torch.softmax(scores, dim=-1) @ v
    return out
