"""compile: torch.compile of the model (inductor: fused kernels, reductions possibly reordered).

Compiled in place (nn.Module.compile), the denoiser's forward and the text tower's, so parameter
names stay those of the uncompiled model (snapshots and sibling comparisons match them). On CPU
inductor generates C++ and needs a compiler (cc/g++); the first steps pay the compilation.
"""

from __future__ import annotations

import shutil

from numdev.optimizations.base import Optimization


class Compile(Optimization):
    kernel = "real"

    def __init__(self, name: str, mode: str | None = None, submodules: tuple[str, ...] | list[str] = ("text",)):
        super().__init__(name)
        self.mode = mode
        self.submodules = tuple(submodules)
        self.compiled: list[str] = []

    def model(self, model):
        if shutil.which("g++") is None and shutil.which("c++") is None:
            raise RuntimeError(f"optimization={self.name}: torch.compile's CPU backend needs a C++ compiler (g++); install one")
        for name in self.submodules:  # called outside the model's forward (encode_text): compiled on their own
            sub = model.get_submodule(name)
            sub.compile(mode=self.mode)
            self.compiled.append(name)
        model.compile(mode=self.mode)
        self.compiled.append("")
        return model

    def describe(self, model=None, optimizer=None) -> dict:
        out = {**super().describe(), "mode": self.mode}
        if model is not None:
            out["compiled_modules"] = [name or "<model>" for name, m in model.named_modules() if getattr(m, "_compiled_call_impl", None) is not None]
        return out
