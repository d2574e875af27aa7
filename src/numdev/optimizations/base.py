"""The interface every optimization implements: hooks that numdev.train.run calls, in this order.

    with optimization.active():          # process-wide settings, for this run only (restored after)
        backend = optimization.attention(backend)
        model = optimization.model(model)          # after the initial weights are drawn
        factory = optimization.optimizer(factory)  # the optimizer's partial, before it is built
        ... training ...
        optimization.describe(model, optimizer)    # what is really active, for run.json

The base class changes nothing: it is `optimization=none`. A subclass overrides the hooks it
needs and says whether it runs the real kernel or an emulation (`kernel`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

KERNELS = ("real", "emulated", "none")


class Optimization:
    """optimization=none: the run as configured. `name` is the config file's name."""

    kernel = "none"  # real: the kernel a user gets; emulated: numdev's exact emulation of the arithmetic
    precisions: tuple[str, ...] | None = None  # the precision configs it applies to (None: any); others are refused

    def __init__(self, name: str = "none"):
        if not isinstance(name, str) or not name:
            raise ValueError(f"optimization.name={name!r} must be the optimization's name (its file in conf/train/optimization/)")
        self.name = name

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Process-wide settings for the duration of the run; restored afterwards (a worker process runs other jobs next)."""
        yield

    def attention(self, backend):
        return backend

    def model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Change the model in place or wrap it; parameter names and shapes must stay (snapshots compare them)."""
        return model

    def optimizer(self, factory: Callable[..., torch.optim.Optimizer]) -> Callable[..., torch.optim.Optimizer]:
        return factory

    def describe(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None) -> dict:
        """What is active, read from the run's own objects and settings (JSON-ready, for run.json)."""
        return {"name": self.name, "kernel": self.kernel}
