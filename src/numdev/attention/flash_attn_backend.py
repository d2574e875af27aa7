"""The flash-attn package (Dao-AILab), when installed on a CUDA machine: `.venv/bin/pip install -e '.[cuda]'`."""

from __future__ import annotations

import importlib.util

import torch

from numdev.attention.registry import AttentionBackend, register


@register("flash_attn")
class FlashAttn(AttentionBackend):
    def unsupported_reason(self, q):
        if importlib.util.find_spec("flash_attn") is None:
            return "the flash-attn package is not installed (it builds only with CUDA: .venv/bin/pip install -e '.[cuda]' on a GPU machine)"
        if q.device.type != "cuda":
            return f"flash-attn runs on CUDA only, not {q.device.type}"
        if q.dtype not in (torch.float16, torch.bfloat16):
            return f"flash-attn takes float16 or bfloat16, not {q.dtype}"
        if q.shape[-1] > 256 or q.shape[-1] % 8:
            return f"flash-attn takes head dims <= 256 that are multiples of 8, not {q.shape[-1]}"
        return None

    def forward(self, q, k, v, scale, causal):
        from flash_attn import flash_attn_func

        if causal and q.shape[2] != k.shape[2]:
            raise ValueError(
                "flash-attn aligns the causal mask bottom-right when query and key lengths differ, "
                "torch SDPA and numdev top-left: use equal lengths or causal=False with flash_attn"
            )
        # flash-attn takes (batch, seq, heads, dim).
        out = flash_attn_func(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale, causal=causal
        )
        return out.transpose(1, 2)
