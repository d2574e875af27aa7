"""The arithmetic of PyTorch's CPU flash kernel that numdev models (`numerics=cpu_sdpa`).

PyTorch 2.14's `cpu_flash_attention` (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp) computes,
per query tile and key/value block of 512, in float32:
  S = gemm(K_block^T, Q_tile) * scale          the BLAS's mixed-precision GEMM (bf16/fp16 in, fp32 out)
  m = max(m_old, rowmax(S)); P = exp(S - m)      exp: ATen's `fexp_u20` on the first W*floor(B_c/W)
                                                 columns (W = the float lanes of the build: 16 for
                                                 AVX-512, 8 for AVX2), libm's expf on the rest
  l_block = the lane sums of P (2W accumulators, then a butterfly over the lanes), then + the tail
  alpha = expf(m_old - m); l = l_block + alpha * l; O = alpha * O (after the first block)
  O = gemm(P rounded to the input dtype, V_block) + O   (the BLAS GEMM with beta = 1)
  out = O * (1 / l), rounded to the input dtype.
The GEMMs are one of two entry points, chosen per call as the kernel chooses (`kernel_packs`):
  cblas    MKL's cblas_gemm_bf16bf16f32 / cblas_gemm_f16f16f32, through at::native::cpublas::gemm
  brgemm   at::native::cpublas::brgemm (oneDNN's batch-reduce GEMM ukernel, AMX tiles) on K^T and V
           packed to VNNI pairs, where `cpublas::could_pack` says the CPU has AMX for the dtype
           (AMX-BF16: Intel Xeon since Sapphire Rapids; AMX-FP16 for fp16) and the kernel's
           size heuristic (`need_pack`) takes it. Its float32 sums are ordered otherwise than MKL's.
This module holds the pieces that are not plain ATen ops: `fexp_u20` written with exact float32
operations, the lane sum, libm's expf, and the kernel's GEMM entry points (called through ctypes on
the loaded libtorch_cpu). numdev.attention.flash_emulated runs them in its ATen path and, fused,
in kernels/flash_emulator.c (`cpu_flash_forward`); both give the same bits.

Validated against torch `MODELED_TORCH` only: another version warns once (`check_torch_version`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import os
import warnings

import torch

MODELED_TORCH = "2.14.1"  # the PyTorch release whose CPU flash kernel this models
MODELED_COMMIT = "5c48869"  # its git commit (torch.version.git_version)
EXP_CHOICES = ("aten", "fexp_u20")
ROW_SUM_CHOICES = ("aten", "lanes")
MATMUL_CHOICES = ("aten", "blas")
LANES = {"AVX512": 16, "AVX2": 8}  # float lanes of ATen's Vectorized<float> per CPU capability

_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)


def check_torch_version() -> None:
    """One warning, once, when the installed torch is not the one the model was validated on."""
    installed = torch.__version__.split("+")[0]
    if installed != MODELED_TORCH:
        warn_once("version", f"numerics=cpu_sdpa models PyTorch {MODELED_TORCH}'s CPU flash kernel "
                             f"(commit {MODELED_COMMIT}); torch {installed} is installed, whose kernel may differ")


def lanes() -> int | None:
    """W, the float lanes of the running torch's CPU kernels (None: a build the model does not cover)."""
    return LANES.get(torch.backends.cpu.get_cpu_capability())


def model_lanes() -> int:
    """W for the model: the build's, or 8 (ATen's generic 32-byte vectors) with one warning where the
    running torch's kernels are neither AVX2 nor AVX-512 (ARM, DEFAULT), which the model does not cover."""
    width = lanes()
    if width is None:
        capability = torch.backends.cpu.get_cpu_capability()
        warn_once("capability", f"numerics=cpu_sdpa models the AVX2/AVX512 builds of PyTorch's CPU flash kernel; "
                                f"this torch runs its {capability} kernels, whose bits the model may not give")
        return 8
    return width


# fexp_u20's constants, bit for bit as ATen sets them (vec512_float.h / vec256_float.h).
def _f32(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32)


def _bits(pattern: int) -> torch.Tensor:
    return torch.tensor(pattern - (1 << 32) if pattern >= 1 << 31 else pattern, dtype=torch.int32).view(torch.float32)


C0, C1 = _f32(0.00010703434948458272), _f32(0.30354260500649682)
C2, C3 = _f32(-0.22433836478672356), _f32(-0.079204240219773236)
LOG2E = _bits(0x3FB8AA3B)
SCALE_A, SCALE_B = _f32(2.0**23), _f32(2.0**23 * 127.0)
LN_FLT_MIN, LN_FLT_MAX = _bits(0xC2AEAC50), _bits(0x42B17218)
_INF64 = torch.tensor(math.inf, dtype=torch.float64)


def fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 fused multiply-add, rounded once: a*b is exact in float64, a*b + c is summed there
    with its error kept (TwoSum) and rounded to odd, so the final rounding to float32 is correct."""
    a, b, c = (t.to(torch.float64) for t in (a, b, c))
    p = a * b
    s = p + c
    t = s - p
    err = (p - (s - t)) + (c - t)
    even = (s.view(torch.int64) & 1) == 0
    inexact = (err != 0) & even & torch.isfinite(s)
    s = torch.where(inexact, torch.nextafter(s, torch.where(err > 0, _INF64, -_INF64)), s)
    return s.to(torch.float32)


def fexp_u20(x: torch.Tensor) -> torch.Tensor:
    """ATen's fast exp for a bf16/fp16 downcast (Vectorized<float>::fexp_u20, AVX2 and AVX-512),
    lane by lane: 2^(x log2 e) with a cubic for the fraction, its exponent built by a float->int
    truncation. x < ln(FLT_MIN) gives 0, x > ln(FLT_MAX) +inf, NaN -0.0 (the truncation's 0x80000000)."""
    x = x.to(torch.float32)
    too_small, too_large = x < LN_FLT_MIN, x > LN_FLT_MAX
    src = x * LOG2E
    frac = src - torch.floor(src)
    r = fma(frac, C3, C2)
    r = fma(frac, r, C1)
    r = fma(frac, r, C0)
    t = fma(SCALE_A, src - r, SCALE_B)
    i = torch.where(torch.isnan(t), torch.tensor(-(2**31), dtype=torch.int32), t.to(torch.int32))
    i = torch.where(too_small, 0, i)
    i = torch.where(too_large, 0x7F800000, i)
    return i.view(torch.float32)


def probs(x: torch.Tensor, width: int) -> torch.Tensor:
    """P = exp(x) along the last axis as the kernel computes it: fexp_u20 on the first
    width*floor(n/width) columns, libm's expf on the rest."""
    n = x.shape[-1]
    vector = width * (n // width)
    if vector == n:
        return fexp_u20(x)
    return torch.cat([fexp_u20(x[..., :vector]), libm_exp(x[..., vector:])], dim=-1)


def lane_sum(p: torch.Tensor, width: int) -> torch.Tensor:
    """The row sum of P (float32) in the kernel's order, for vectors of `width` floats: 2*width
    lane accumulators (a pair of vectors, ATen's VectorizedN<float, 2>) over the chunks of 2*width
    columns, then one chunk of `width` columns added into the first vector if that many are left,
    the lanes reduced lane i + lane i + width, then i + width/2, ..., i + 1, then the tail
    (fewer than `width` columns) added in order. Measured against the kernel (tests/test_attention.py):
    `width` accumulators alone, or the last chunk summed on its own, match fewer outputs."""
    n = p.shape[-1]
    pairs = 2 * width * (n // (2 * width))
    vector = width * (n // width)
    acc = torch.zeros(*p.shape[:-1], 2 * width, dtype=torch.float32)
    for start in range(0, pairs, 2 * width):
        acc = acc + p[..., start:start + 2 * width]
    if vector > pairs:
        acc = torch.cat([acc[..., :width] + p[..., pairs:vector], acc[..., width:]], dim=-1)
    half = 2 * width
    while half > 1:
        half //= 2
        acc = acc[..., :half] + acc[..., half:2 * half]
    total = acc[..., :1]
    for j in range(vector, n):
        total = total + p[..., j:j + 1]
    return total


@functools.cache
def _libm_expf():
    name = ctypes.util.find_library("m") or "libm.so.6"
    function = ctypes.CDLL(name).expf
    function.argtypes, function.restype = [ctypes.c_float], ctypes.c_float
    return function


def libm_exp(x: torch.Tensor) -> torch.Tensor:
    """expf from the C library, the std::exp of the kernel's scalar code (it is neither ATen's
    exp nor the correctly rounded one in about 6 of 10,000 arguments). Uses numdev's C kernels
    (`libm_expf`) where they are built, else calls libm element by element."""
    from numdev.attention import native

    x = x.to(torch.float32).contiguous()
    out = torch.empty_like(x)
    if x.numel() == 0:
        return out
    lib = native.library()
    if lib is not None:
        lib.libm_expf(x.data_ptr(), out.data_ptr(), x.numel())
        return out
    expf = _libm_expf()
    flat = out.view(-1)
    for i, value in enumerate(x.view(-1).tolist()):
        flat[i] = expf(value)
    return out


# The BLAS entry points PyTorch's CPU flash kernel calls (MKL_VERBOSE shows GEMM_BF16BF16F32 and
# GEMM_F16F16F32), exported by libtorch_cpu: cblas_gemm_<t><t>f32(layout, transa, transb, m, n, k,
# alpha, a, lda, b, ldb, beta, c, ldc), column-major as ATen's cpublas calls them.
BLAS_SYMBOLS = {torch.bfloat16: "cblas_gemm_bf16bf16f32", torch.float16: "cblas_gemm_f16f16f32"}
_COL_MAJOR, _NO_TRANS, _TRANS = 102, 111, 112


@functools.cache
def blas_gemm(dtype: torch.dtype):
    """The ctypes function of the kernel's GEMM for 16-bit inputs, or None (with one warning)."""
    symbol = BLAS_SYMBOLS.get(dtype)
    if symbol is None:
        return None
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        function = getattr(ctypes.CDLL(path), symbol)
    except (OSError, AttributeError):
        warn_once(f"blas-{symbol}", f"numerics.matmul=blas: this torch exports no {symbol} (not an MKL build?); "
                                    "the GEMMs run as float32 matmuls, which may differ from the kernel's in the last bit")
        return None
    i, p = ctypes.c_int, ctypes.c_void_p
    function.argtypes = [i, i, i, i, i, i, ctypes.c_float, p, i, p, i, ctypes.c_float, p, i]
    function.restype = None
    return function


def blas_address(dtype: torch.dtype) -> int:
    function = blas_gemm(dtype)
    return 0 if function is None else ctypes.cast(function, ctypes.c_void_p).value


# The packed path (FlashAttentionKernel.cpp's `with_pack`/`need_pack`, PyTorch 2.14.1), exported by
# libtorch_cpu as C++ functions with C-compatible arguments (the Itanium ABI passes them as C does):
#   bool could_pack(ScalarType)      whether oneDNN's brgemm runs the dtype on AMX here
#   void brgemm(M, N, K, ld_a, ld_b, ld_c, add_C, const T* A, const T* B, float* C, bool is_vnni)
#       C (M x N, row-major) = A (M x K) B (K x N) (+ C if add_C), B packed to VNNI pairs.
BRGEMM_SYMBOLS = {torch.bfloat16: "_ZN2at6native7cpublas6brgemmEllllllbPKN3c108BFloat16ES5_Pfb",
                  torch.float16: "_ZN2at6native7cpublas6brgemmEllllllbPKN3c104HalfES5_Pfb"}
_COULD_PACK_SYMBOL = "_ZN2at6native7cpublas10could_packEN3c1010ScalarTypeE"
_RELEASE_SYMBOL = "_ZN2at6native7cpublas14brgemm_releaseEb"  # void brgemm_release(bool is_vnni)
_SCALAR_TYPE = {torch.bfloat16: 15, torch.float16: 5}  # c10::ScalarType (an int8_t enum)
GEMM_ENTRIES = ("cblas", "brgemm")


@functools.cache
def _libtorch_cpu() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    except OSError:
        return None


@functools.cache
def _could_pack_function():
    lib = _libtorch_cpu()
    function = getattr(lib, _COULD_PACK_SYMBOL, None) if lib is not None else None
    if function is not None:
        function.argtypes, function.restype = [ctypes.c_int8], ctypes.c_bool
    return function


def could_pack(dtype: torch.dtype) -> bool:
    """at::native::cpublas::could_pack: whether the kernel may take its packed brgemm path for
    `dtype` on this CPU (oneDNN's AMX brgemm; False where this torch exports no such function).
    Asked on every call, as the kernel asks it."""
    function = _could_pack_function()
    return function is not None and dtype in _SCALAR_TYPE and bool(function(_SCALAR_TYPE[dtype]))


@functools.cache
def brgemm(dtype: torch.dtype):
    """The ctypes function of at::native::cpublas::brgemm for 16-bit inputs, or None (with one warning)."""
    lib = _libtorch_cpu()
    function = getattr(lib, BRGEMM_SYMBOLS[dtype], None) if lib is not None and dtype in BRGEMM_SYMBOLS else None
    if function is None:
        warn_once(f"brgemm-{dtype}", f"this torch exports no cpublas::brgemm for {dtype}: the model of PyTorch's CPU "
                                     "flash kernel calls the cblas GEMM where the kernel packs, which may differ in the last bit")
        return None
    i, p = ctypes.c_int64, ctypes.c_void_p
    function.argtypes = [i, i, i, i, i, i, ctypes.c_bool, p, p, p, ctypes.c_bool]
    function.restype = None
    return function


def brgemm_address(dtype: torch.dtype) -> int:
    function = brgemm(dtype)
    return 0 if function is None else ctypes.cast(function, ctypes.c_void_p).value


@functools.cache
def _brgemm_release():
    lib = _libtorch_cpu()
    function = getattr(lib, _RELEASE_SYMBOL, None) if lib is not None else None
    if function is not None:
        function.argtypes, function.restype = [ctypes.c_bool], None
    return function


def brgemm_release() -> None:
    """cpublas::brgemm_release: the calling thread gives its AMX tile configuration back, as the
    kernel does after its tiles (no numeric effect)."""
    function = _brgemm_release()
    if function is not None:
        function(True)


def brgemm_release_address() -> int:
    function = _brgemm_release()
    return 0 if function is None else ctypes.cast(function, ctypes.c_void_p).value


def kernel_packs(dtype: torch.dtype, batch: int, heads: int, n_q: int, n_k: int, dim: int, tile_rows: int,
                 causal: bool, threads: int | None = None) -> bool:
    """Whether PyTorch 2.14.1's CPU flash kernel runs its GEMMs packed (cpublas::brgemm) for this call:
    `with_pack` = could_pack(dtype), then its `need_pack` heuristic: both lengths at least 64 (bf16)
    or 16 (fp16), and the GEMM work of one thread's query tiles at least 4 (bf16) or 1 (fp16) times
    the packing work. threads: torch's thread count (the kernel's at::get_num_threads()).
    Checked against oneDNN's verbose log on an AMX Xeon: 2048 keys pack and 2049 do not at
    (1, 1, 128, n, 64), causal, two threads."""
    if dtype not in _SCALAR_TYPE or not could_pack(dtype):
        return False
    threshold, ratio = (64, 4.0) if dtype == torch.bfloat16 else (16, 1.0)
    if n_k < threshold or n_q < threshold:
        return False
    threads = torch.get_num_threads() if threads is None else threads
    split = min(tile_rows, n_q)
    tiles_per_thread = (batch * heads * -(-n_q // split) + threads - 1) // threads  # integer division, as in C++
    pack_size = float(batch * heads * n_k * dim)
    gemm_size = float(tiles_per_thread) * split * (min(n_q, n_k) if causal else n_k) * dim
    return gemm_size / pack_size >= ratio


def gemm_entry(dtype: torch.dtype, packed: bool) -> str:
    """Which GEMM the model calls: brgemm where the kernel packs (and this torch exports it), else cblas."""
    return "brgemm" if packed and brgemm(dtype) is not None else "cblas"


def pack_vnni2(x: torch.Tensor) -> torch.Tensor:
    """ATen's pack_vnni2 of a (K, N) 16-bit matrix: [K, N] -> [ceil(K/2), N, 2], an odd K padded
    with a row of zeros (the layout brgemm takes B in)."""
    rows, cols = x.shape
    if rows % 2:
        x = torch.cat([x, x.new_zeros(1, cols)])
    return x.reshape(-1, 2, cols).transpose(1, 2).contiguous()


def _even(n: int) -> int:
    return n + n % 2


def _padded(x: torch.Tensor, cols: int) -> torch.Tensor:
    """x (rows, n) contiguous, with zero columns up to `cols` (the kernel pads an odd K so)."""
    if x.shape[-1] == cols:
        return x.contiguous()
    out = x.new_zeros(x.shape[0], cols)
    out[:, :x.shape[-1]] = x
    return out


def _scores_packed(q: torch.Tensor, k: torch.Tensor, rows: int) -> torch.Tensor:
    """Q K^T by cpublas::brgemm as the packed kernel calls it: K^T of the block packed (odd d padded
    to d + 1, Q then padded too), one call per (batch, head, `rows` query rows)."""
    call = brgemm(q.dtype)
    batch, heads, n, d = q.shape
    m = k.shape[2]
    depth = _even(d)
    out = torch.empty(batch, heads, n, m, dtype=torch.float32)
    for b in range(batch):
        for h in range(heads):
            packed_k = pack_vnni2(k[b, h].transpose(0, 1).contiguous())
            for start in range(0, n, rows):
                count = min(rows, n - start)
                a = _padded(q[b, h, start:start + count], depth)
                call(count, m, depth, depth, m, m, False, a.data_ptr(), packed_k.data_ptr(),
                     out[b, h, start].data_ptr(), True)
    brgemm_release()
    return out


def _accumulate_packed(p: torch.Tensor, v: torch.Tensor, out: torch.Tensor, rows: int, add: bool, active) -> None:
    """out += P V (or = where not `add`) by cpublas::brgemm as the packed kernel calls it: V of the
    block packed, an odd block length padded with a zero column of P and a zero row of V."""
    call = brgemm(p.dtype)
    batch, heads, n, m = p.shape
    d = v.shape[-1]
    depth = _even(m)
    for b in range(batch):
        for h in range(heads):
            packed_v = pack_vnni2(v[b, h].contiguous())
            for start in range(0, n, rows):
                if active is not None and not bool(active[b, h, start, 0]):
                    continue
                count = min(rows, n - start)
                a = _padded(p[b, h, start:start + count], depth)
                call(count, d, depth, depth, d, d, add, a.data_ptr(), packed_v.data_ptr(), out[b, h, start].data_ptr(),
                     True)
    brgemm_release()


def _caller(dtype: torch.dtype, parallel: bool):
    """A function calling the kernel's GEMM (column-major arguments, alpha 1) the way the kernel
    does: from inside an OpenMP parallel region of torch's thread count (numdev's C helper
    `blas_in_region`; MKL's fp16 GEMM gives other bits when called from outside one) where the
    kernel's loop is `parallel` (more than one query tile and thread), else, or without the C
    kernels, directly."""
    from numdev.attention import native

    gemm = blas_gemm(dtype)
    lib = native.library()
    if lib is None:
        return lambda ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc: gemm(_COL_MAJOR, ta, tb, m, n, k, 1.0, a, lda, b, ldb,
                                                                          beta, c, ldc)
    address, threads = blas_address(dtype), torch.get_num_threads() if parallel else 1
    return lambda ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc: lib.blas_in_region(address, ta, tb, m, n, k, a, lda, b,
                                                                                    ldb, beta, c, ldc, threads)


def scores(q: torch.Tensor, k: torch.Tensor, rows: int, parallel: bool = True, entry: str = "cblas") -> torch.Tensor:
    """Q K^T in float32 as the kernel's GEMM computes it: one call per (batch, head, `rows` query
    rows) and key block, q (B, H, n, d) and k (B, H, m, d) contiguous in the input dtype.
    parallel: whether the kernel runs these tiles in a parallel loop (more than one tile and thread).
    entry: the GEMM the kernel calls (`gemm_entry`)."""
    if entry == "brgemm":
        return _scores_packed(q.contiguous(), k.contiguous(), rows)
    gemm = blas_gemm(q.dtype)
    if gemm is None:
        return q.float() @ k.float().transpose(-1, -2)
    batch, heads, n, d = q.shape
    m = k.shape[2]
    q, k = q.contiguous(), k.contiguous()
    out = torch.empty(batch, heads, n, m, dtype=torch.float32)
    gemm = _caller(q.dtype, parallel)
    for b in range(batch):
        for h in range(heads):
            for start in range(0, n, rows):
                count = min(rows, n - start)
                gemm(_TRANS, _NO_TRANS, m, count, d, k[b, h].data_ptr(), d, q[b, h, start].data_ptr(), d, 0.0,
                     out[b, h, start].data_ptr(), m)
    return out


def accumulate(p: torch.Tensor, v: torch.Tensor, out: torch.Tensor, rows: int, beta: float, active=None,
               parallel: bool = True, entry: str = "cblas") -> None:
    """out (float32, updated in place) = p @ v + beta * out, as the kernel's GEMM does it, one call
    per (batch, head, `rows` rows); tiles whose `active` (B, H, n, 1) is False are left alone.
    entry: the GEMM the kernel calls (`gemm_entry`)."""
    batch, heads, n, m = p.shape
    d = v.shape[-1]
    if active is not None:
        active = active.expand(batch, heads, n, 1)
    if entry == "brgemm":
        _accumulate_packed(p.contiguous(), v.contiguous(), out, rows, beta != 0, active)
        return
    gemm = blas_gemm(p.dtype)
    if gemm is None:
        pv = p.float() @ v.float()
        new = pv if beta == 0 else pv + out
        out.copy_(new if active is None else torch.where(active, new, out))
        return
    p, v = p.contiguous(), v.contiguous()
    gemm = _caller(p.dtype, parallel)
    for b in range(batch):
        for h in range(heads):
            for start in range(0, n, rows):
                if active is not None and not bool(active[b, h, start, 0]):
                    continue
                count = min(rows, n - start)
                gemm(_NO_TRANS, _NO_TRANS, d, count, m, v[b, h].data_ptr(), d, p[b, h, start].data_ptr(), m, beta,
                     out[b, h, start].data_ptr(), d)
