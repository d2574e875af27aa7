"""flash_tie_fix: Qiu & Yao's fix (arXiv:2510.04212) for bf16 flash attention's biased rounding.

When several scores of a key/value block tie its maximum, the block's maximum is shifted (2m for
m > 0, 0 for m < 0) so that no unnormalised probability P = exp(S - m) is exactly 1; the shift
cancels in O / l. Implemented in numdev's flash emulator (numdev.attention.flash_emulated:
tie_shifted_max), so it applies to runs with attention=flash_emulated; its baseline is the same
emulator without the fix.
"""

from __future__ import annotations

from numdev.attention.flash_emulated import FlashEmulated
from numdev.optimizations.base import Optimization


class FlashTieFix(Optimization):
    kernel = "emulated"

    def attention(self, backend):
        if not isinstance(backend, FlashEmulated):
            raise ValueError(f"optimization={self.name} changes numdev's flash emulator: use attention=flash_emulated "
                             f"(the run's attention is {backend.name})")
        if backend.variant != "fa2" or backend.formats.exp != "aten" or backend.formats.matmul != "aten":
            raise ValueError(f"optimization={self.name}: the fix is implemented for attention.variant=fa2 with "
                             "numerics exp=aten and matmul=aten")
        backend.tie_fix = True
        return backend

    def describe(self, model=None, optimizer=None) -> dict:
        out = super().describe()
        if model is not None:
            backends = {id(m.backend): m.backend for m in model.modules() if hasattr(m, "backend")}
            out["tie_fix_backends"] = sum(bool(getattr(b, "tie_fix", False)) for b in backends.values())
        return out
