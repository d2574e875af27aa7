"""`flash_attn`: the real FlashAttention kernels a user has installed on a CUDA machine.

Each kernel is found by the module whose `flash_attn_func` numdev calls, not by a package name:
the FlashAttention-4 wheel ships `flash_attn/cute` without `flash_attn/__init__.py`, so the
package `flash_attn` can be found while FlashAttention-2's `flash_attn.flash_attn_func` is not.

  kernel    module                 backward  what it is
  fa2       flash_attn             yes       flash-attn 2 (Dao-AILab): `.venv/bin/pip install -e '.[cuda]'`
  fa3       flash_attn_interface   yes       FlashAttention-3, built from flash-attention's hopper/
  fa4       flash_attn.cute        yes       FlashAttention-4 (CuTe DSL): `pip install flash-attn-4`
  fa3_fwd   fa3_fwd_interface      no        the FA3 forward kernels alone: `pip install fa3-fwd`

`kernel=auto` (the default) takes the first installed one in that order. The run's record names
the kernel that ran, its module and its distribution's version (`describe()`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass
from functools import cache

import torch

from numdev.attention.registry import AttentionBackend, BackendUnavailable, register


@dataclass(frozen=True)
class Kernel:
    name: str
    module: str
    distributions: tuple[str, ...]  # the pip names whose version the record carries, first found wins
    backward: bool
    dtypes: tuple[torch.dtype, ...]
    min_capability: int  # major.minor as 10*major + minor
    max_capability: int
    install: str

    def supports(self, q: torch.Tensor) -> str | None:
        if q.dtype not in self.dtypes:
            names = " or ".join(str(d).removeprefix("torch.") for d in self.dtypes)
            return f"{self.name} ({self.module}) takes {names}, not {str(q.dtype).removeprefix('torch.')}"
        dim = q.shape[-1]
        if dim > 256 or dim % 8:
            return f"{self.name} takes head dims <= 256 that are multiples of 8, not {dim}"
        major, minor = torch.cuda.get_device_capability(q.device)
        capability = 10 * major + minor
        if not self.min_capability <= capability <= self.max_capability:
            return (f"{self.name} runs on compute capability {self.min_capability / 10:.1f}"
                    f"{'+' if self.max_capability >= 999 else f'-{self.max_capability / 10:.1f}'}, "
                    f"this GPU is {major}.{minor}")
        return None


HALF = (torch.float16, torch.bfloat16)
KERNELS = {
    "fa2": Kernel("fa2", "flash_attn", ("flash-attn", "flash_attn"), True, HALF, 80, 999,
                  ".venv/bin/pip install -e '.[cuda]' on a GPU machine (builds flash-attn 2 from source with nvcc)"),
    "fa3": Kernel("fa3", "flash_attn_interface", ("flash-attn-3", "flash_attn_3", "flashattn-hopper"), True, HALF, 90, 99,
                  "python setup.py install in flash-attention/hopper on an H100/H200"),
    "fa4": Kernel("fa4", "flash_attn.cute", ("flash-attn-4",), True, HALF, 80, 999,
                  "pip install flash-attn-4"),
    "fa3_fwd": Kernel("fa3_fwd", "fa3_fwd_interface", ("fa3-fwd",), False, (torch.bfloat16,), 90, 99,
                      "pip install fa3-fwd"),
}
KERNEL_CHOICES = ("auto", *KERNELS)


@cache
def load(name: str):
    """(flash_attn_func, None) when kernel `name` can be imported, else (None, why not)."""
    kernel = KERNELS[name]
    try:
        module = importlib.import_module(kernel.module)
    except Exception as error:  # not installed, or installed without its compiled extension
        return None, f"{kernel.module} cannot be imported ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
    function = getattr(module, "flash_attn_func", None)
    if not callable(function):
        return None, (f"{kernel.module} has no flash_attn_func, so {name} is not installed (a namespace left by another "
                      "package, e.g. FlashAttention-4's wheel ships flash_attn/cute without flash_attn/__init__.py)")
    return function, None


def installed() -> list[str]:
    """The kernels whose module gives a flash_attn_func, in auto's order."""
    return [name for name in KERNELS if load(name)[0] is not None]


@cache
def version(name: str) -> str:
    """The installed distribution's version of kernel `name` ('unknown' when none says)."""
    kernel = KERNELS[name]
    for distribution in kernel.distributions:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    found = getattr(importlib.import_module(kernel.module), "__version__", None)
    return str(found) if found else "unknown"


def runnable(device: str, dtype: torch.dtype) -> dict[str, FlashAttn]:
    """{"flash_attn[<kernel>]": backend} for every installed kernel that runs on `device` with
    `dtype` (the scripts that time or compare every real kernel list them with this)."""
    probe = torch.zeros(1, 1, 16, 64, device=device, dtype=dtype)
    backends = {f"flash_attn[{name}]": FlashAttn(kernel=name) for name in installed()}
    return {label: b for label, b in backends.items() if b.unsupported_reason(probe) is None}


def none_installed() -> str:
    return ("no FlashAttention kernel is installed; install one of: "
            + "; ".join(f"{k.name} ({k.module}): {k.install}" for k in KERNELS.values()))


@register("flash_attn")
class FlashAttn(AttentionBackend):
    def __init__(self, kernel: str = "auto"):
        if kernel not in KERNEL_CHOICES:
            raise ValueError(f"attention.kernel={kernel!r}: use one of {', '.join(KERNEL_CHOICES)}")
        self.kernel = kernel
        self._resolved: str | None = None

    def resolved(self) -> str | None:
        """The kernel this backend calls: the one asked for, or auto's first installed one (found
        once, at the first call: not on every attention call)."""
        if self.kernel != "auto":
            return self.kernel
        if self._resolved is None:
            found = installed()
            self._resolved = found[0] if found else None
        return self._resolved

    def unsupported_reason(self, q):
        name = self.resolved()
        if name is None:
            return none_installed()
        function, why = load(name)
        if function is None:
            others = [k for k in installed() if k != name]
            also = f"; installed: attention.kernel={' or '.join(others)}" if others else ""
            return f"attention.kernel={name}: {why}; {KERNELS[name].install}{also}"
        if q.device.type != "cuda":
            return f"{name} ({KERNELS[name].module}) runs on CUDA only, not {q.device.type}"
        return KERNELS[name].supports(q)

    def forward_only(self, key: str = "attention") -> str | None:
        name = self.resolved()
        if name is None or KERNELS[name].backward:
            return None
        trainable = [k for k in installed() if KERNELS[k].backward]
        return (f"{key}.kernel={name} ({KERNELS[name].module}) has no backward pass: train with "
                f"{key + '.kernel=' + ' or '.join(trainable) if trainable else 'fa2, fa3 or fa4 (none installed)'}, "
                "or call it under torch.no_grad()")

    def forward(self, q, k, v, scale, causal):
        name = self.resolved()
        if name is None:
            raise BackendUnavailable(f"attention backend 'flash_attn' cannot run here: {none_installed()}")
        function, why = load(name)
        if function is None:
            raise BackendUnavailable(f"attention backend 'flash_attn' cannot run here: attention.kernel={name}: {why}")
        reason = self.forward_only() if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)) else None
        if reason:
            raise BackendUnavailable(reason)
        if causal and q.shape[2] != k.shape[2]:
            raise ValueError(
                "flash-attn aligns the causal mask bottom-right when query and key lengths differ, "
                "torch SDPA and numdev top-left: use equal lengths or causal=False with flash_attn"
            )
        # The kernels take (batch, seq, heads, dim); FA4 (and FA3 with return_attn_probs) return (out, lse).
        out = function(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale, causal=causal)
        if isinstance(out, tuple):
            out = out[0]
        return out.transpose(1, 2)

    def describe(self) -> dict:
        name = self.resolved()
        described = {**super().describe(), "kernel": name or "none installed", "asked": self.kernel}
        if name is not None and load(name)[0] is not None:
            described.update(module=KERNELS[name].module, version=version(name))
        return described
