"""compile: torch.compile of the model (inductor: fused kernels, reductions possibly reordered).

Compiled in place (nn.Module.compile), the model's forward and, on their own, the submodules it calls
outside its forward (a model's `outside_forward`: the DiT's text tower, which encode_text runs), so
parameter names stay those of the uncompiled model (snapshots and sibling comparisons match them). On CPU
inductor generates C++ and needs a compiler (cc/g++); the first steps pay the compilation.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence

from numdev.optimizations.base import Optimization

log = logging.getLogger(__name__)

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class Compile(Optimization):
    kernel = "real"

    def __init__(self, name: str, mode: str | None = None, submodules: tuple[str, ...] | list[str] | None = None):
        super().__init__(name)
        if mode is not None and mode not in MODES:
            raise ValueError(f"optimization.mode={mode!r}: use one of {', '.join(MODES)} or null (torch.compile's modes)")
        if submodules is not None and (isinstance(submodules, str) or not isinstance(submodules, Sequence) or not all(
                isinstance(s, str) and s for s in submodules)):
            raise ValueError(f"optimization.submodules={submodules!r} must be a list of the model's submodule names, e.g. [text] or [], "
                             "or null (the model's own outside_forward)")
        self.mode = mode
        self.submodules = None if submodules is None else tuple(submodules)
        self.compiled: list[str] = []

    def _submodules(self, model) -> tuple[str, ...]:
        """The submodules compiled on their own: as configured, or (null) those the model says it calls
        outside its forward (`outside_forward`; none for a model that does not say)."""
        return self.submodules if self.submodules is not None else tuple(getattr(model, "outside_forward", ()))

    def check_model(self, model) -> None:
        """Every submodule named exists in the model (built on the meta device before the run starts)."""
        if model is None:
            return
        for name in self._submodules(model):
            try:
                model.get_submodule(name)
            except AttributeError:
                top = sorted(n for n, _ in model.named_children())
                raise ValueError(f"optimization.submodules: the model has no submodule {name!r}: name some of "
                                 f"{', '.join(top)} (or [])") from None

    def model(self, model):
        if shutil.which("g++") is None and shutil.which("c++") is None:
            raise RuntimeError(f"optimization={self.name}: torch.compile's CPU backend needs a C++ compiler (g++); install one")
        for name in self._submodules(model):  # called outside the model's forward (encode_text): compiled on their own
            sub = model.get_submodule(name)
            sub.compile(mode=self.mode)
            self.compiled.append(name)
        model.compile(mode=self.mode)
        self.compiled.append("")
        log.info("torch.compile (%s): the first steps compile the model, minutes on a CPU; the run continues after that",
                 self.mode or "default")
        return model

    def describe(self, model=None, optimizer=None) -> dict:
        out = {**super().describe(), "mode": self.mode}
        if model is not None:
            out["compiled_modules"] = [name or "<model>" for name, m in model.named_modules() if getattr(m, "_compiled_call_impl", None) is not None]
        return out
