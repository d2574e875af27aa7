"""`triton`: the project's own FlashAttention kernel (kernels/flash_attention.py), forward and
backward, with the emulator's knobs, so a perturbed flash attention runs (and trains) at GPU speed.

Knobs, named as in flash_emulated where they mean the same thing:
  block_r, block_c   the query and key/value tile (powers of two, 16..256; None: FA2's tiles)
  stats, accum       "fp32" (FA2) or "input": the softmax statistics / the output accumulator
                     rounded to the input dtype after every update
  variant            "fa2" (deferred normalisation) or "fa1" (normalised at every block)
  exp2               True: exp2 with the scale folded in, as FA2; False: exp, as the emulator
  interpret          True: Triton's CPU interpreter (float32, float16); False: the GPU;
                     None: the TRITON_INTERPRET environment variable, read at every call
"""

from __future__ import annotations

import torch

from numdev.attention.registry import AttentionBackend, BackendUnavailable, register

try:
    from numdev.kernels import flash_attention as kernel
except ImportError as error:  # Triton comes with torch's CUDA builds only
    kernel, _IMPORT_ERROR = None, error


class _FlashFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal, knobs, interpret):
        out, lse = kernel.forward(q, k, v, scale, causal, knobs, interpret)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (scale, causal, knobs, interpret)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = kernel.backward(grad_out, q, k, v, out, lse, *ctx.args)
        return dq, dk, dv, None, None, None, None


@register("triton")
class TritonFlash(AttentionBackend):
    def __init__(
        self,
        block_r: int | None = None,
        block_c: int | None = None,
        stats: str = "fp32",
        accum: str = "fp32",
        variant: str = "fa2",
        exp2: bool = True,
        interpret: bool | None = None,
        num_warps: int | None = None,
        num_stages: int | None = None,
    ):
        if kernel is None:
            raise BackendUnavailable(f"attention backend 'triton' needs the triton package: {_IMPORT_ERROR}")
        self.knobs = kernel.Knobs(
            block_m=block_r,
            block_n=block_c,
            stats=stats,
            accum=accum,
            variant=variant,
            exp2=bool(exp2),
            num_warps=num_warps,
            num_stages=num_stages,
        )
        self.interpret = interpret
        self.last_blocks = None  # (B_r, B_c) of the latest call, for result records

    def _interpret(self) -> bool:
        return kernel.interpret_default() if self.interpret is None else bool(self.interpret)

    def unsupported_reason(self, q):
        return kernel.unsupported_reason(q, self._interpret())

    def forward(self, q, k, v, scale, causal):
        self.last_blocks = self.knobs.blocks(q.shape[-1])
        return _FlashFunction.apply(q, k, v, scale, causal, self.knobs, self._interpret())

    def describe(self):
        block_r, block_c = self.last_blocks or (self.knobs.block_m, self.knobs.block_n)
        return {
            "backend": self.name,
            "variant": self.knobs.variant,
            "stats": self.knobs.stats,
            "accum": self.knobs.accum,
            "exp2": self.knobs.exp2,
            "tiles.block_r": block_r,
            "tiles.block_c": block_c,
            "interpret": self._interpret(),
        }
