"""fused_adamw: the optimizer built with fused=True (one fused kernel over all parameters; runs on CPU).

The same AdamW update, computed by a different kernel: the arithmetic order (and with it the
rounding) differs from the default for-each implementation.
"""

from __future__ import annotations

import functools

import torch

from numdev.optimizations.base import Optimization


class FusedOptimizer(Optimization):
    kernel = "real"

    def optimizer(self, factory):
        target = factory.func if isinstance(factory, functools.partial) else factory
        if target not in (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD):
            raise ValueError(f"optimization={self.name}: optim.optimizer is {getattr(target, '__name__', target)}, which has no "
                             "fused kernel here: use torch.optim.AdamW (optim.optimizer._target_)")
        return functools.partial(factory, fused=True)

    def describe(self, model=None, optimizer=None) -> dict:
        out = super().describe()
        if optimizer is not None:
            out["fused"] = bool(optimizer.defaults.get("fused"))
        return out
