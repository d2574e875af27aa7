"""Swap a model's nn.Linear modules for a low-precision linear, keeping their parameters.

The replacement takes over the very Parameter objects (weight, bias) of the Linear it replaces,
so the initial weights, parameter names and shapes stay those of the model as built: snapshots,
sibling comparisons and the optimizer see the same tensors.
"""

from __future__ import annotations

import torch
from torch import nn


def swap_linears(model: nn.Module, make) -> list[str]:
    """Replace every module of type exactly nn.Linear by make(linear); returns the replaced names."""
    swapped = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, child_name, make(child))
                swapped.append(f"{name}.{child_name}" if name else child_name)
    return swapped


def adopt(target: nn.Linear, source: nn.Linear) -> nn.Linear:
    """target holds source's parameters (the same objects) and mode."""
    target.weight = source.weight
    target.bias = source.bias
    target.train(source.training)
    return target


def linear_count(model: nn.Module, cls: type) -> dict:
    """How many Linears the model has of type `cls` and how many plain nn.Linear are left."""
    return {"replaced": sum(isinstance(m, cls) for m in model.modules()),
            "plain_linear_left": sum(type(m) is nn.Linear for m in model.modules())}


def flat(x: torch.Tensor) -> torch.Tensor:
    """(..., K) -> (M, K), the matrix a GEMM takes."""
    return x.reshape(-1, x.shape[-1])
