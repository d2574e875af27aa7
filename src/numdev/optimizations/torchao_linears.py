"""torchao_fp8 and torchao_mxfp8: torchao's own training linears, applied as a user applies them, beside
numdev's emulations of the same recipes (fp8_linear, mxfp8_linear with block_scale=rceil).

  torchao_fp8    torchao.float8.convert_to_float8_training: every nn.Linear becomes torchao's
                 Float8Linear (tensorwise dynamic scaling, e4m3 forward, e5m2 gradients, the three GEMMs
                 by torch._scaled_mm; on a CPU with AMX that is oneDNN's FP8 matmul, slow: docs/optimizations.md)
  torchao_mxfp8  torchao.quantization.quantize_ with MXFP8TrainingOpConfig in its EMULATED kernel mode
                 (the hardware-agnostic path: MXFP8 quantisation with RCEIL scales, dequantised GEMMs),
                 output in float32; the weights stay nn.Parameters whose data torchao wraps

torchao is an optional extra (pip install -e '.[torchao]'); without it the run is refused in one line.
Parity with numdev's emulations is a test (tests/test_torchao_roles.py): one linear's forward and both
gradients, bit for bit.
"""

from __future__ import annotations

import contextlib
import functools
import logging

import torch
from torch import nn

from numdev.optimizations.base import Optimization

RECIPES = {"float8_tensorwise": "torchao Float8Linear (tensorwise dynamic, e4m3/e5m2)",
           "mxfp8_emulated_rceil": "torchao MXFP8 training (emulated kernels, RCEIL scales)"}


@contextlib.contextmanager
def _quiet():
    """torchao 0.18 registers Enum constants in a way torch 2.14 deprecates: a warning per Enum on import."""
    logger = logging.getLogger("torch.utils._pytree")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _torchao(name: str):
    try:
        with _quiet():
            import torchao
    except ImportError:
        raise ValueError(f"optimization={name} calls torchao, which is not installed: pip install -e '.[torchao]' "
                         "(or pick numdev's emulation of the same recipe: fp8_linear, mxfp8_linear)") from None
    return torchao


ALIGN = {"float8_tensorwise": 16, "mxfp8_emulated_rceil": 32}  # torchao's shape requirements: _scaled_mm's 16, MX's block


def _convertible(recipe: str):
    """torchao's filter, as its users write it: plain nn.Linear whose both dims it can take (a 48-wide
    patch embedding stays in float32, which numdev's emulations, taking every Linear, do not)."""
    align = ALIGN[recipe]
    return lambda module, fqn="": (type(module) is nn.Linear and module.in_features % align == 0
                                   and module.out_features % align == 0)


class TorchaoTraining(Optimization):
    kernel = "real"  # torchao's own code: what a user gets from it on this device
    extra = "torchao"  # the optional extra it needs: not in the default catalogue (experiment=optimizations_torchao)

    def __init__(self, name: str, recipe: str = "float8_tensorwise"):
        super().__init__(name)
        if recipe not in RECIPES:
            raise ValueError(f"optimization.recipe={recipe!r}: use one of {', '.join(RECIPES)}")
        self.recipe = recipe
        self.version = _torchao(name).__version__  # refused at construction, before any run starts

    def model(self, model):
        chosen = _convertible(self.recipe)
        count = sum(chosen(m) for m in model.modules())
        if not count:
            raise ValueError(f"optimization={self.name}: the model has no nn.Linear with both dims a multiple of "
                             f"{ALIGN[self.recipe]} for torchao to convert")
        self.left = sum(type(m) is nn.Linear for m in model.modules()) - count
        if self.recipe == "float8_tensorwise":
            with _quiet():
                from torchao.float8 import convert_to_float8_training
            convert_to_float8_training(model, module_filter_fn=chosen)
        else:
            with _quiet():
                from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig
                from torchao.quantization import quantize_
                from torchao.quantization.quantize_.common import KernelPreference
            config = MXFP8TrainingOpConfig(kernel_preference=KernelPreference.EMULATED, out_dtype=torch.float32)
            quantize_(model, config, filter_fn=chosen)
            for name, module in model.named_modules():  # torchao asserts mid-step on a ragged token count: say it first
                if chosen(module):
                    module.register_forward_pre_hook(functools.partial(_rows_in_blocks, self.name, name))
        self.converted = count
        return model

    def describe(self, model=None, optimizer=None) -> dict:
        return {**super().describe(), "recipe": RECIPES[self.recipe], "torchao": self.version,
                **({"replaced": self.converted, "plain_linear_left": self.left} if model is not None else {})}


def _rows_in_blocks(optimization: str, module_name: str, module, args) -> None:
    """torchao's MXFP8 weight gradient blocks the token dimension by 32: refuse another count in one line
    (a forward without gradients, as sampling's, quantises along K only and takes any count)."""
    x = args[0]
    rows = x.numel() // x.shape[-1]
    if torch.is_grad_enabled() and rows % ALIGN["mxfp8_emulated_rceil"]:
        raise ValueError(f"optimization={optimization}: torchao's MXFP8 training blocks the tokens by 32, and {module_name} "
                         f"got {rows}; use a data.batch_size (x tokens) that is a multiple of 32, or optimization=mxfp8_linear")
