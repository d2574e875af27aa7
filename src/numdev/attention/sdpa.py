"""torch.nn.functional.scaled_dot_product_attention with one kernel forced.

On CPU, `sdpa_flash` is PyTorch's own tiled FlashAttention (FP32 scores, max, sum and output
accumulator; P rounded to the input dtype before P.V): the CPU stand-in for "the original kernel".
`sdpa_math` upcasts FP16/BF16 to FP32 internally on CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from numdev.attention.registry import AttentionBackend, BackendUnavailable, blocks_of, one_block, register
from numdev.attention.tiles import resolve_tiles

_DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_HALF = (torch.float16, torch.bfloat16)


class _Sdpa(AttentionBackend):
    kernel: SDPBackend

    def __init__(self, dtype: str | None = None):
        """dtype: run in this dtype (inputs cast to it, output cast back); None: the inputs' dtype."""
        if dtype is not None and dtype not in _DTYPES:
            raise ValueError(f"{self.name}: unsupported dtype {dtype!r}: use one of {', '.join(_DTYPES)}")
        self.dtype = dtype

    def _run_dtype(self, q: torch.Tensor) -> torch.dtype:
        return _DTYPES[self.dtype] if self.dtype is not None else q.dtype

    def unsupported_reason(self, q):
        return self._reason(q.device, self._run_dtype(q), q.shape[-1])

    def _reason(self, device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
        return None

    def forward(self, q, k, v, scale, causal):
        out_dtype = q.dtype
        run_dtype = self._run_dtype(q)
        q, k, v = (t.to(run_dtype) for t in (q, k, v))
        try:
            with sdpa_kernel(self.kernel):
                out = F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=causal)
        except RuntimeError as error:
            if "No viable backend" in str(error) or "No available kernel" in str(error):
                raise BackendUnavailable(
                    f"attention backend {self.name!r} refused these inputs "
                    f"({q.device.type}, {run_dtype}, q {tuple(q.shape)}, k {tuple(k.shape)}): {error}"
                ) from None
            raise
        return out.to(out_dtype)

    def describe(self):
        return {"backend": self.name, "dtype": self.dtype}


@register("sdpa_math")
class SdpaMath(_Sdpa):
    kernel = SDPBackend.MATH

    def kv_tiling(self, n_queries, n_keys, head_dim, device="cpu"):
        return one_block(n_keys)


@register("sdpa_flash")
class SdpaFlash(_Sdpa):
    kernel = SDPBackend.FLASH_ATTENTION

    def _reason(self, device, dtype, head_dim):
        if device.type == "cuda":
            if dtype not in _HALF:
                return f"the CUDA flash kernel takes float16 or bfloat16, not {dtype}"
            if head_dim > 256 or head_dim % 8:
                return f"the CUDA flash kernel takes head dims <= 256 that are multiples of 8, not {head_dim}"
        elif device.type != "cpu":
            return f"no flash kernel on {device.type}"
        return None

    def kv_tiling(self, n_queries, n_keys, head_dim, device="cpu"):
        """On CPU PyTorch's flash kernel's own rule (numdev.attention.tiles, cpu_sdpa): key/value blocks
        of 512, clamped to the length. The CUDA kernels pick their own (not known here)."""
        if device != "cpu":
            return super().kv_tiling(n_queries, n_keys, head_dim, device)
        tiles = resolve_tiles(n_queries, n_keys, head_dim, rule="cpu_sdpa")
        return blocks_of(n_keys, tiles.block_c, "PyTorch's CPU flash kernel: key/value blocks of 512, clamped to the length")


@register("sdpa_efficient")
class SdpaEfficient(_Sdpa):
    kernel = SDPBackend.EFFICIENT_ATTENTION

    def _reason(self, device, dtype, head_dim):
        if device.type != "cuda":
            return "the memory-efficient kernel runs on CUDA only"
        if dtype == torch.float64:
            return "the memory-efficient kernel takes float16, bfloat16 or float32, not float64"
        return None


@register("sdpa_cudnn")
class SdpaCudnn(_Sdpa):
    kernel = SDPBackend.CUDNN_ATTENTION

    def _reason(self, device, dtype, head_dim):
        if device.type != "cuda":
            return "the cuDNN kernel runs on CUDA only"
        if dtype not in _HALF:
            return f"the cuDNN kernel takes float16 or bfloat16, not {dtype}"
        return None
