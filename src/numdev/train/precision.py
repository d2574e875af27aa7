"""Low-precision training at full speed on CPUs without bf16/fp16 instructions.

On a CPU without AVX-512 BF16 or AMX (AMD EPYC Zen 3 and older, Intel before Cooper Lake),
PyTorch's bf16 and fp16 matrix products take slow paths (oneDNN's or ATen's reference loops): a
dit_tiny bf16-mixed step took 9x the fp32 step (docs/training.md#precision). The arithmetic those
paths implement is simple: operands rounded to bf16 (or fp16), products accumulated in FP32, the
result rounded once to bf16 (fp16). Products of two bf16 values are exact in FP32 (8 + 8 significand
bits fit in 24; fp16: 11 + 11 fit too), so an FP32 GEMM on the rounded operands, rounded once to
the low-precision dtype, is the same arithmetic up to the order of the FP32 summation, which
differs between BLAS builds and CPUs anyway.

`FP32Gemm` is that route: a torch function mode that, while it is active, computes every product
of the matmul family (linear, matmul, mm, bmm, addmm, baddbmm, addbmm, conv, conv_transpose) whose
operands are, or autocast would make, bf16/fp16 CPU tensors as `op(a.to(low).float(), ...).to(low)`:
 - forward: operands rounded exactly as autocast rounds them (round to nearest even), FP32 GEMM,
   one rounding of the output (bias added before it, as oneDNN's fused bias does);
 - backward: autograd differentiates the FP32 op and the two casts, so each gradient is an FP32
   GEMM of bf16-valued operands whose result is rounded once to bf16 (the cast's backward), as the
   native bf16 GEMM's backward computes it;
 - what differs from the native kernels: the FP32 summation order only (the native bf16 kernels
   also accumulate in FP32). Nothing else in the step changes: element-wise ops, softmax, norms,
   the loss, the optimizer and the attention backends' own kernels (SDPA is not rerouted: the real
   kernel under study stays the real kernel) run as before.

`precision.gemm` picks the route: `native` (PyTorch's own low-precision kernels), `fp32` (this
route) or `auto` (native where the CPU has the instructions oneDNN uses for that dtype and
oneDNN is not capped below them by ONEDNN_MAX_CPU_ISA, fp32 otherwise; native on a GPU). The
decision depends on the machine only, so every sibling run of a study on one machine computes the
same way; run.json records the route and why (`precision_gemm`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.pytorch.plugins.precision import HalfPrecision as _HalfPrecision
from lightning.pytorch.plugins.precision import MixedPrecision as _MixedPrecision
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.utilities import GradClipAlgorithmType
from torch.overrides import TorchFunctionMode

SETTINGS = ("auto", "native", "fp32")
LOW = (torch.bfloat16, torch.float16)

# The products CPU autocast runs in its low-precision dtype (PyTorch's autocast op lists), as the
# Python functions that call them. scaled_dot_product_attention is left out on purpose (above).
ROUTED = frozenset({
    F.linear, F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d,
    torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__,
    torch.mm, torch.Tensor.mm, torch.bmm, torch.Tensor.bmm,
    torch.addmm, torch.Tensor.addmm, torch.baddbmm, torch.Tensor.baddbmm, torch.addbmm, torch.Tensor.addbmm,
})

# CPU flags with which oneDNN runs each dtype's products natively, and the ONEDNN_MAX_CPU_ISA
# values (oneDNN's names) that still allow those instructions.
NATIVE_FLAGS = {torch.bfloat16: ("avx512_bf16", "amx_bf16"), torch.float16: ("avx512_fp16", "amx_fp16")}
_ISA_ALLOWS = {
    torch.bfloat16: ("ALL", "AVX2_VNNI_2", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16",
                     "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2"),
    torch.float16: ("ALL", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16",
                    "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2"),
}
# Every ONEDNN_MAX_CPU_ISA value oneDNN (x64) recognises; it ignores any other (no cap), and reads
# DNNL_MAX_CPU_ISA where ONEDNN_MAX_CPU_ISA is not set.
_ISA_NAMES = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_MIC", "AVX512_MIC_4OPS", "AVX512_CORE",
              "AVX512_CORE_VNNI", *_ISA_ALLOWS[torch.bfloat16])


def onednn_cap() -> str | None:
    """The ISA oneDNN is capped at by the environment (None: no cap, or a value oneDNN ignores)."""
    for variable in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        value = os.environ.get(variable, "").strip()
        if value:
            return value.upper() if value.upper() in _ISA_NAMES and value.upper() != "ALL" else None
    return None


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def resolve(setting: str, dtype: torch.dtype | None, device: str) -> tuple[str, str]:
    """(route, why) for `precision.gemm=setting` with products in `dtype` on `device`."""
    if setting not in SETTINGS:
        raise ValueError(f"precision.gemm={setting!r}: use one of {', '.join(SETTINGS)}")
    if dtype not in LOW:
        return "native", "no bf16/fp16 products in this precision"
    if setting != "auto":
        return setting, f"precision.gemm={setting}"
    if device != "cpu":
        return "native", f"{device}: its own {_name(dtype)} kernels"
    wanted = NATIVE_FLAGS[dtype]
    found = sorted(set(wanted) & cpu_flags())
    if not found:
        return "fp32", f"the CPU has none of {', '.join(wanted)}: {_name(dtype)} GEMMs in FP32 on {_name(dtype)}-rounded operands"
    cap = onednn_cap()
    if cap and cap not in _ISA_ALLOWS[dtype]:
        return "fp32", f"ONEDNN_MAX_CPU_ISA={cap} rules out {', '.join(found)}: {_name(dtype)} GEMMs in FP32"
    return "native", f"the CPU has {', '.join(found)}"


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.").replace("bfloat16", "bf16").replace("float16", "fp16")


def _tensors(args, kwargs):
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, torch.Tensor))


def compute_dtype(tensors: list[torch.Tensor]) -> torch.dtype | None:
    """The low-precision dtype this call's product runs in natively, or None (leave it alone)."""
    floats = [t for t in tensors if t.is_floating_point()]
    if not floats or any(t.device.type != "cpu" for t in tensors):
        return None
    if torch.is_autocast_enabled("cpu"):
        dtype = torch.get_autocast_dtype("cpu")
        # autocast casts every floating tensor but fp64 ones; with an fp64 operand the op fails natively
        return dtype if dtype in LOW and not any(t.dtype == torch.float64 for t in floats) else None
    dtypes = {t.dtype for t in floats}
    return dtypes.pop() if len(dtypes) == 1 and dtypes <= set(LOW) else None


# Under torch.compile, inductor drops a cast pair x.to(bf16).float() (and fuses a rounded output
# into the next op unrounded) unless told to emulate casts: the two casts that make this route
# bf16 arithmetic go through custom ops it cannot see into. Eager calls take the plain casts.
@torch.library.custom_op("numdev::exact_float", mutates_args=())
def exact_float(x: torch.Tensor) -> torch.Tensor:
    """A bf16/fp16 tensor as FP32 (exact)."""
    return x.float()


@torch.library.custom_op("numdev::round_to", mutates_args=())
def round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x rounded to `dtype` (round to nearest even, as a cast)."""
    return x.to(dtype)


@exact_float.register_fake
def _(x):
    return torch.empty_like(x, dtype=torch.float32)


@round_to.register_fake
def _(x, dtype):
    return torch.empty_like(x, dtype=dtype)


def _remember_dtype(ctx, inputs, output):
    ctx.dtype = inputs[0].dtype


exact_float.register_autograd(lambda ctx, grad: round_to(grad, ctx.dtype), setup_context=_remember_dtype)
round_to.register_autograd(
    lambda ctx, grad: (exact_float(grad) if ctx.dtype == torch.float32 else grad.to(ctx.dtype), None),
    setup_context=_remember_dtype)


def _round(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if value.dtype == dtype:
        return value
    return round_to(value, dtype) if torch.compiler.is_compiling() else value.to(dtype)


def _widen(value, low: torch.dtype):
    """A floating operand rounded to `low` as autocast rounds it, then held exactly in FP32."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        rounded = _round(value, low)
        return exact_float(rounded) if torch.compiler.is_compiling() else rounded.float()
    if isinstance(value, (list, tuple)):
        return type(value)(_widen(v, low) for v in value)
    return value


class FP32Gemm(TorchFunctionMode):
    """While active: bf16/fp16 products on the CPU computed as FP32 GEMMs on the rounded operands."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in ROUTED or "out" in kwargs:
            return func(*args, **kwargs)
        low = compute_dtype(list(_tensors(args, kwargs)))
        if low is None:
            return func(*args, **kwargs)
        with torch.autocast("cpu", enabled=False):
            out = func(*(_widen(a, low) for a in args), **{k: _widen(v, low) for k, v in kwargs.items()})
        return _round(out, low)

class _Route:
    """The route of a precision plugin, resolved once from its setting, dtype and device."""

    def _set_route(self, gemm: str, dtype: torch.dtype, device: str) -> None:
        self.gemm = gemm
        self.route, self.route_why = resolve(gemm, dtype, device)

    def describe_route(self) -> dict:
        return {"setting": self.gemm, "route": self.route, "why": self.route_why}

    @contextlib.contextmanager
    def _routed(self, context):
        with context:
            if self.route == "fp32":
                with FP32Gemm():
                    yield
            else:
                yield


class MixedPrecision(_MixedPrecision, _Route):
    """Lightning's MixedPrecision (autocast, and a gradient scaler for 16-mixed) with `precision.gemm`."""

    def __init__(self, precision: str, device: str, scaler=None, gemm: str = "auto"):
        super().__init__(precision=precision, device=device, scaler=scaler)
        self._set_route(gemm, torch.bfloat16 if precision == "bf16-mixed" else torch.float16, device)

    def forward_context(self):
        return self._routed(super().forward_context())

    # A fused optimizer (optimization=fused_adamw) can unscale the gradients inside its own step, so
    # Lightning neither unscales them before the step nor lets them be clipped (a RuntimeError at step 0,
    # even under bf16-mixed, which has no scaler). numdev clips (trainer.gradient_clip_val) and checks
    # the gradients (callbacks.instability) before the step: they are unscaled here for every optimizer;
    # GradScaler.step then hands a fused optimizer no scale (its stage is UNSCALED), only found_inf.
    def optimizer_step(self, optimizer, model, closure, **kwargs):
        if self.scaler is None or not getattr(optimizer, "_step_supports_amp_scaling", False):
            return super().optimizer_step(optimizer, model=model, closure=closure, **kwargs)
        closure_result = closure()
        skip = closure_result is None and model.automatic_optimization
        if not skip:
            self.scaler.unscale_(optimizer)
        self._after_closure(model, optimizer)
        if skip:
            return closure_result
        output = self.scaler.step(optimizer, **kwargs)
        self.scaler.update()
        return output

    def clip_gradients(self, optimizer, clip_val=0.0, gradient_clip_algorithm=GradClipAlgorithmType.NORM) -> None:
        Precision.clip_gradients(self, optimizer, clip_val=clip_val, gradient_clip_algorithm=gradient_clip_algorithm)


class HalfPrecision(_HalfPrecision, _Route):
    """Lightning's HalfPrecision (weights, activations and optimizer state in bf16/fp16) with `precision.gemm`."""

    def __init__(self, precision: str, device: str = "cpu", gemm: str = "auto"):
        super().__init__(precision=precision)
        self._set_route(gemm, self._desired_input_dtype, device)

    def forward_context(self):
        return self._routed(super().forward_context())
