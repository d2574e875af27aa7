"""torch.compile for the flash emulator's elementwise steps, with the rounding kept.

Inductor computes bfloat16/float16 arithmetic in float32 and, unless told otherwise, drops a
float32 -> bf16 -> float32 round trip as a no-op: the emulator's rounding would silently vanish.
`emulate_precision_casts` keeps every such cast; it is passed per compiled function (the
`options` of torch.compile), so nothing global changes for the rest of the process.

The row sum and the matmuls are not in the compiled steps (the caller runs them in ATen), and
exp is ATen's (see `exp`): inductor's own differ from ATen's in the last bit.

Only formats whose rounding is a native cast from float32 (fp32, bf16, fp16) are compiled; the
bit-twiddling paths of round_to (fp8, tf32, custom formats, float64 working precision) run eagerly.
A failed compile (no C++ compiler, an inductor error) warns once and falls back to eager, which
gives the same bits.
"""

from __future__ import annotations

import functools
import types
import warnings

import torch

from numdev.numerics.stages import STAGES, StageFormats

_COMPILABLE_FORMATS = ("fp32", "bf16", "fp16")


@torch.library.custom_op("numdev::aten_exp", mutates_args=())
def _aten_exp(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(x)


@_aten_exp.register_fake
def _(x):
    return torch.empty_like(x)


def exp(x: torch.Tensor) -> torch.Tensor:
    """torch.exp, and ATen's own exp inside compiled code too.

    Inductor's exp (Sleef) and ATen's (MKL VML on x86) differ in the last bit of ~10% of float32
    values, enough to change a bf16 probability now and then, so compiled steps call ATen's.
    """
    if torch.compiler.is_compiling():
        return torch.ops.numdev.aten_exp(x)
    return torch.exp(x)
_broken: list[str] = []  # the first compile error, if any: from then on everything runs eagerly


def supports(formats: StageFormats) -> bool:
    """Whether compiled steps for these formats are known to give the eager bits."""
    return (
        not _broken
        and formats.nearest_only
        and formats.working_dtype == torch.float32
        and all(getattr(formats, stage).name in _COMPILABLE_FORMATS for stage in STAGES)
    )


def compiled(step, formats: StageFormats):
    """`step` (called as step(*args, f=formats)) compiled for these formats, falling back to eager."""
    return _compiled(step, formats)


@functools.cache
def _compiled(step, formats: StageFormats):
    # A fresh code object per (step, formats): dynamo keeps its cache, and its recompile limit,
    # per code object, so a sweep over many format sets never spills into silent eager fallback.
    fresh = types.FunctionType(step.__code__.replace(), step.__globals__, step.__name__)
    fresh.__kwdefaults__ = {**(step.__kwdefaults__ or {}), "f": formats}  # the step's other keyword defaults kept
    fast = torch.compile(
        fresh,
        dynamic=True,  # sequence lengths and ragged last tiles vary in sweeps: one graph for all
        fullgraph=True,
        options={"emulate_precision_casts": True},
    )

    def run(*args, f):
        if not _broken:
            try:
                return fast(*args)
            except Exception as error:  # noqa: BLE001 - any compile failure: fall back, same bits
                _broken.append(f"{type(error).__name__}: {error}".splitlines()[0])
                warnings.warn(f"torch.compile of the flash emulator failed, running eagerly: {_broken[0]}", stacklevel=2)
        return step(*args, f=f)

    return run
