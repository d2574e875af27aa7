"""Eager attention: softmax(q @ kᵀ · scale) @ v exactly as eager PyTorch code computes it.

This is the study's reference. The Baseline backend rounds each stage to an explicit format (its
`paper` preset rounds exp and the row sum to bf16 in a bf16 run), which is not what a model
written in plain PyTorch does. Eager runs the literal expression under the autocast the run's
precision implies (bf16-mixed, fp16-mixed), so its numbers are whatever PyTorch's kernels give on
this device:

- CPU autocast (measured, tests/test_eager_attention.py): matmul runs in the low-precision dtype
  and softmax stays in it too (softmax is not on CPU autocast's fp32 list); PyTorch's CPU softmax
  computes max, exp and sum in fp32 and rounds P once to bf16/fp16, then P @ V runs in bf16/fp16.
- CUDA autocast: softmax is on the fp32 list, so P is fp32 until autocast casts it back for P @ V.

The CPU computation, stage by stage, is the Baseline backend's `eager` numerics preset
(numdev.numerics.stages): the phase-1 figures divide real kernels' deviation by that Baseline, which
tests/test_eager_baseline.py holds to PyTorch's own eager attention.

`dtype="fp32"` instead upcasts q, k, v and computes the expression in fp32 without autocast (the
output is cast back to the input dtype): the study's "truth" run, attention without rounding
error to speak of, beside a model that is otherwise the reference's.

`scores="fp32"` keeps the rest and computes only the scores in fp32: q k^T, the scale and the softmax from
fp32 q and k, P then rounded once to the compute dtype before P @ v (under the run's autocast). Those are
the FlashAttention kernels' stage formats without their tiling (fp32 scores and statistics, P in the
compute format): it asks whether the bf16 rounding of the scores, which eager under autocast does and
Flash does not, is what sets the two apart (docs/gpu.md#the-edge-of-stability-on-the-cpu).
"""

from __future__ import annotations

import torch

from numdev.attention.checks import causal_mask
from numdev.attention.registry import AttentionBackend, one_block, register

# Lightning precision name -> the autocast dtype it runs the model's ops under (None: no autocast).
AUTOCAST = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}
_DTYPES = {"fp32": torch.float32, "fp64": torch.float64}


@register("eager")
class Eager(AttentionBackend):
    def __init__(self, precision: str | None = None, dtype: str | None = None, scores: str | None = None):
        """precision: the run's precision name (its autocast, if any, is used); dtype: fp32/fp64 to upcast;
        scores: fp32 to compute only the scores and the softmax in fp32."""
        if dtype is not None and dtype not in _DTYPES:
            raise ValueError(f"eager attention: dtype={dtype!r}: use null, {' or '.join(_DTYPES)}")
        if scores not in (None, "fp32"):
            raise ValueError(f"eager attention: scores={scores!r}: use null (the scores in the compute dtype) or fp32")
        self.precision, self.dtype, self.scores = precision, dtype, scores
        self.autocast = AUTOCAST.get(precision) if dtype is None else None

    def forward(self, q, k, v, scale, causal):
        out_dtype = q.dtype
        if self.dtype is not None:
            q, k, v = (t.to(_DTYPES[self.dtype]) for t in (q, k, v))
        device = q.device.type
        wide = self.scores == "fp32"
        with torch.autocast(device, dtype=self.autocast or torch.bfloat16, enabled=self.autocast is not None and not wide):
            if wide:
                q, k = q.float(), k.float()
            scores = q @ k.transpose(-1, -2) * scale  # (B, H, Nq, Nk)
            if causal:
                key_index = torch.arange(k.shape[2], device=q.device)
                scores = scores.masked_fill(causal_mask(q.shape[2], key_index, q.device), float("-inf"))
            probs = torch.softmax(scores, dim=-1)
        if wide:  # P rounded once to the compute dtype, as the flash kernels round it
            probs = probs.to(self.autocast or v.dtype)
        with torch.autocast(device, dtype=self.autocast or torch.bfloat16, enabled=self.autocast is not None):
            out = probs @ v  # (B, H, Nq, D)
        return out.to(out_dtype)

    def describe(self):
        autocast = str(self.autocast).removeprefix("torch.") if self.autocast is not None else None
        return {"backend": self.name, "autocast": autocast, "dtype": self.dtype, "scores": self.scores}

    def kv_tiling(self, n_queries, n_keys, head_dim, device="cpu"):
        return one_block(n_keys)
