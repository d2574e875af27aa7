"""FlashAttention forward and backward in Triton, with the flash emulator's numeric knobs.

Inputs are (batch, heads, seq, dim) with the last dim contiguous; causal masking is top-left
aligned as in torch SDPA (query i sees keys 0..i), also when n_q != n_k.

Numeric knobs (all compile-time constants, so a knob left at its default compiles to the plain
FA2 kernel and costs nothing):

  block_m, block_n  B_r x B_c, the query and key/value tile (powers of two, 16..256)
  stats             "fp32" (default) or "input": the running max m and sum l (and P as summed into
                    l) are rounded to the input dtype after every update
  accum             "fp32" (default) or "input": the output accumulator O is rounded to the input
                    dtype after every update (P.V is then not fused into the accumulator)
  variant           "fa2" (default): O unnormalised, scaled by 1/l once at the end;
                    "fa1": O renormalised at every key/value block (FlashAttention-1)
  exp2              True (default), FA2's formula: scores and row max stay raw Q.K^T and
                    P = exp2(s * c - m * c), c = scale * log2(e) (one FMA per element);
                    False, the emulator's: S = Q.K^T * scale, P = exp(S - m)
P is always rounded to the input dtype before P.V, and score, rescale factor and the final 1/l are
fp32 (or stats), as in FA2. The operation order of each update is that of
numdev.attention.flash_emulated, so with exp2=False the two agree to a few fp32 ulps.

The backward is FA2's (P recomputed from the saved log-sum-exp, dQ in a separate pass so it is
deterministic, fp32 accumulators); the knobs reach it only through the forward's O and LSE.

Running on CPU: Triton's `@triton.jit` reads TRITON_INTERPRET when the decorator runs, not at
launch, and returns an InterpretedFunction instead of a JITFunction; a kernel can call only jit
functions of its own kind. That holds for triton.language's own jit functions too (tl.max,
tl.sum, tl.zeros, tl.cdiv, ...: decorated once, when triton is first imported), so the kernels
here use builtins only. `kernels(interpret)` loads a private copy of this file with the
interpreter switched on (or off) for the duration of the load: callers choose per call, and the
process environment is left as it was.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import sys
from dataclasses import asdict, dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

HEAD_DIMS = (16, 32, 64, 128)
GPU_DTYPES = (torch.float16, torch.bfloat16)
INTERPRETER_DTYPES = (torch.float32, torch.float16)  # numpy, hence the interpreter, has no bfloat16
STATS_FORMATS = ("fp32", "input")
VARIANTS = ("fa2", "fa1")
BLOCK_SIZES = (16, 32, 64, 128, 256)
LOG2_E = 1.4426950408889634

# Backward tiles and launch options: performance only (the backward has no numeric knobs).
# At d <= 64 no backward kernel spills registers on sm90; at d = 128 some variants of dK/dV (and,
# under Triton 3.8, of dQ) spill a little: scripts/triton_compile.py's table in docs/gpu.md (ptxas -v
# of every variant). Whether that costs time is for a GPU to say.
BACKWARD_OPTIONS = {"num_warps": 8, "num_stages": 3}


def backward_blocks(head_dim: int) -> dict[str, tuple[int, int]]:
    """(BLOCK_M, BLOCK_N) of each backward kernel. dK/dV keep BLOCK_N keys resident and stream
    query blocks of BLOCK_M rows; dQ keeps BLOCK_M query rows and streams BLOCK_N keys."""
    return {"_bwd_dkdv_kernel": (32, 128) if head_dim <= 64 else (32, 64), "_bwd_dq_kernel": (128, 32)}


# --------------------------------------------------------------------------------------------
# Device code
# --------------------------------------------------------------------------------------------


@triton.jit
def _round(x, LOW: tl.constexpr, DTYPE: tl.constexpr):
    """x rounded to DTYPE and held in fp32 again: emulates a stage kept in the input format."""
    if LOW:
        x = x.to(DTYPE).to(tl.float32)
    return x


# tl.max, tl.sum, tl.zeros and tl.cdiv are themselves @triton.jit functions of triton.language,
# fixed to one mode (compiled or interpreted) when triton is first imported, so a kernel of the
# other mode cannot call them. The kernels below use builtins only: tl.reduce is one, and with
# these combine functions the interpreter reduces with numpy, as it would for tl.max / tl.sum.
@triton.jit
def _row_max(x):
    return tl.reduce(x, 1, tl.standard._elementwise_max)


@triton.jit
def _row_sum(x):
    return tl.reduce(x, 1, tl.standard._sum_combine)


@triton.jit
def _exp(x, USE_EXP2: tl.constexpr):
    if USE_EXP2:
        y = tl.exp2(x)
    else:
        y = tl.exp(x)
    return y


@triton.jit
def _exp_shifted(s, shift, s_scale, USE_EXP2: tl.constexpr):
    """exp(s - shift) for scores s and a row max `shift` held in the same units.

    USE_EXP2 (FA2): s and shift are raw Q.K^T, the scale is folded into exp2's argument,
    exp2(s * c - shift * c) with c = scale * log2(e), one FMA per element.
    Otherwise (the emulator): s and shift are already scaled, exp(s - shift).
    """
    if USE_EXP2:
        y = tl.exp2(s * s_scale - shift * s_scale)
    else:
        y = tl.exp(s - shift)
    return y


@triton.jit
def _fwd_blocks(
    acc, l_i, m_i, q, K, V, stride_kn, stride_vn, s_scale, offs_m, n_k, lo, hi,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
    FA1: tl.constexpr, USE_EXP2: tl.constexpr, STATS_LOW: tl.constexpr, ACC_LOW: tl.constexpr,
):
    """Fold key/value blocks lo..hi into the running state (m, l, O) of one query tile.

    MASK: the blocks may hold keys past n_k or above the diagonal (the caller passes the blocks
    that need no mask separately, so the common case pays for no compare/select).
    """
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k_ptrs = K + cols[:, None] * stride_kn + offs_d[None, :]
        v_ptrs = V + cols[:, None] * stride_vn + offs_d[None, :]
        if MASK:
            k = tl.load(k_ptrs, mask=cols[:, None] < n_k, other=0.0)
        else:
            k = tl.load(k_ptrs)
        s = tl.dot(q, tl.trans(k))  # (BM, BN) fp32
        if not USE_EXP2:
            s = s * s_scale  # the emulator's S = Q K^T * scale (FA2 scales inside exp2 instead)
        if MASK:
            visible = cols[None, :] < n_k
            if CAUSAL:
                visible = visible & (cols[None, :] <= offs_m[:, None])
            s = tl.where(visible, s, float("-inf"))
        if MASK:
            v = tl.load(v_ptrs, mask=cols[:, None] < n_k, other=0.0)
        else:
            v = tl.load(v_ptrs)

        if FA1:
            # FlashAttention-1 (Algorithm 1): block statistics first, then merge and renormalise.
            m_blk = _round(_row_max(s), STATS_LOW, q.dtype)
            # A row that sees no key of this block (causal, B_c < B_r) has m_blk = -inf.
            m_blk_safe = tl.where(m_blk == float("-inf"), 0.0, m_blk)
            p = _exp_shifted(s, m_blk_safe[:, None], s_scale, USE_EXP2).to(q.dtype)
            l_blk = _round(_row_sum(p.to(tl.float32)), STATS_LOW, q.dtype)
            m_new = tl.maximum(m_i, m_blk)
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha_old = _exp_shifted(m_i, shift, s_scale, USE_EXP2)
            alpha_blk = _exp_shifted(m_blk, shift, s_scale, USE_EXP2)
            l_new = _round(
                _round(alpha_old * l_i, STATS_LOW, q.dtype) + _round(alpha_blk * l_blk, STATS_LOW, q.dtype),
                STATS_LOW,
                q.dtype,
            )
            kept = _round(_round(l_i * alpha_old, STATS_LOW, q.dtype)[:, None] * acc, ACC_LOW, q.dtype)
            pv = _round(tl.dot(p, v), ACC_LOW, q.dtype)
            added = _round(alpha_blk[:, None] * pv, ACC_LOW, q.dtype)
            divisor = tl.where(l_new == 0.0, 1.0, l_new)
            acc = _round(_round(kept + added, ACC_LOW, q.dtype) / divisor[:, None], ACC_LOW, q.dtype)
            l_i = l_new
            m_i = m_new
        else:
            # FlashAttention-2: O stays unnormalised. Key 0 lies in the first block every query
            # tile processes and every row sees it, so m_new is finite from the first block on.
            m_new = _round(tl.maximum(m_i, _row_max(s)), STATS_LOW, q.dtype)
            alpha = _exp_shifted(m_i, m_new, s_scale, USE_EXP2)
            p = _round(_exp_shifted(s, m_new[:, None], s_scale, USE_EXP2), STATS_LOW, q.dtype)
            l_i = _round(_round(l_i * alpha, STATS_LOW, q.dtype) + _row_sum(p), STATS_LOW, q.dtype)
            if ACC_LOW:
                acc = _round(acc * alpha[:, None], ACC_LOW, q.dtype)
                acc = _round(acc + _round(tl.dot(p.to(q.dtype), v), ACC_LOW, q.dtype), ACC_LOW, q.dtype)
            else:
                # The FA2 way: P.V accumulates straight into the fp32 accumulator.
                acc = tl.dot(p.to(q.dtype), v, acc * alpha[:, None])
            m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_kernel(
    Q, K, V, Out, LSE, s_scale, n_q, n_k, n_heads,
    stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn,
    stride_vz, stride_vh, stride_vn, stride_oz, stride_oh, stride_om,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    FA1: tl.constexpr, USE_EXP2: tl.constexpr, STATS_LOW: tl.constexpr, ACC_LOW: tl.constexpr,
):
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    # int64: batch * batch-stride can pass 2**31 elements even when every stride fits in int32.
    off_z = (off_hz // n_heads).to(tl.int64)
    off_h = (off_hz % n_heads).to(tl.int64)
    Q += off_z * stride_qz + off_h * stride_qh
    K += off_z * stride_kz + off_h * stride_kh
    V += off_z * stride_vz + off_h * stride_vh
    Out += off_z * stride_oz + off_h * stride_oh

    row0 = start_m * BLOCK_M
    offs_m = row0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :], mask=offs_m[:, None] < n_q, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, HEAD_DIM], 0.0, tl.float32)

    # Key blocks this tile visits: all, or (causal) those starting before the tile's last row,
    # and never one starting at or past n_q -- the emulator's tile-skipping rule.
    hi = n_k
    full_hi = (n_k // BLOCK_N) * BLOCK_N  # blocks wholly inside the key range ...
    if CAUSAL:
        hi = tl.minimum(n_k, tl.minimum(row0 + BLOCK_M, n_q))
        # ... and (causal) wholly at or below the tile's first row: no mask needed.
        full_hi = tl.minimum(full_hi, ((row0 + 1) // BLOCK_N) * BLOCK_N)
    acc, l_i, m_i = _fwd_blocks(
        acc, l_i, m_i, q, K, V, stride_kn, stride_vn, s_scale, offs_m, n_k, 0, full_hi,
        HEAD_DIM, BLOCK_N, False, CAUSAL, FA1, USE_EXP2, STATS_LOW, ACC_LOW,
    )
    acc, l_i, m_i = _fwd_blocks(
        acc, l_i, m_i, q, K, V, stride_kn, stride_vn, s_scale, offs_m, n_k, full_hi, hi,
        HEAD_DIM, BLOCK_N, True, CAUSAL, FA1, USE_EXP2, STATS_LOW, ACC_LOW,
    )

    if not FA1:
        # Deferred normalisation: one reciprocal per row (in the stats format), then a multiply.
        acc = acc * _round(1.0 / l_i, STATS_LOW, q.dtype)[:, None]
    # The log-sum-exp (in the units of the exp used) lets the backward recompute P.
    if USE_EXP2:
        lse = m_i * s_scale + tl.log2(l_i)  # log2 units, so the backward's exp2 needs one FMA
    else:
        lse = m_i + tl.log(l_i)
    tl.store(LSE + off_hz * n_q + offs_m, lse, mask=offs_m < n_q)
    tl.store(Out + offs_m[:, None] * stride_om + offs_d[None, :], acc.to(Out.dtype.element_ty), mask=offs_m[:, None] < n_q)


@triton.jit
def _bwd_dkdv_blocks(
    dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_dom, s_scale, offs_n, n_q, n_k, lo, hi,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
    USE_EXP2: tl.constexpr,
):
    """Add the query blocks lo..hi to dK, dV of one key block (k, v resident)."""
    offs_d = tl.arange(0, HEAD_DIM)
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        if MASK:
            row_ok = rows < n_q
            q = tl.load(Q + rows[:, None] * stride_qm + offs_d[None, :], mask=row_ok[:, None], other=0.0)
            do = tl.load(DO + rows[:, None] * stride_dom + offs_d[None, :], mask=row_ok[:, None], other=0.0)
            lse = tl.load(LSE + rows, mask=row_ok, other=0.0)
            delta = tl.load(DELTA + rows, mask=row_ok, other=0.0)
        else:
            q = tl.load(Q + rows[:, None] * stride_qm + offs_d[None, :])
            do = tl.load(DO + rows[:, None] * stride_dom + offs_d[None, :])
            lse = tl.load(LSE + rows)
            delta = tl.load(DELTA + rows)
        # Transposed tiles (keys x queries), so dK and dV come out of plain dots.
        p_t = _exp(tl.dot(k, tl.trans(q)) * s_scale - lse[None, :], USE_EXP2)
        if MASK:
            visible = (rows[None, :] < n_q) & (offs_n[:, None] < n_k)
            if CAUSAL:
                visible = visible & (offs_n[:, None] <= rows[None, :])
            p_t = tl.where(visible, p_t, 0.0)
        dv += tl.dot(p_t.to(do.dtype), do)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = p_t * (dp_t - delta[None, :])
        dk += tl.dot(ds_t.to(q.dtype), q)
    return dk, dv


@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, DO, DK, DV, LSE, DELTA, s_scale, scale, n_q, n_k, n_heads,
    stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn,
    stride_vz, stride_vh, stride_vn, stride_doz, stride_doh, stride_dom,
    stride_dkz, stride_dkh, stride_dkn, stride_dvz, stride_dvh, stride_dvn,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    USE_EXP2: tl.constexpr,
):
    start_n = tl.program_id(0) * BLOCK_N
    off_hz = tl.program_id(1)
    # int64: batch * batch-stride can pass 2**31 elements even when every stride fits in int32.
    off_z = (off_hz // n_heads).to(tl.int64)
    off_h = (off_hz % n_heads).to(tl.int64)
    Q += off_z * stride_qz + off_h * stride_qh
    K += off_z * stride_kz + off_h * stride_kh
    V += off_z * stride_vz + off_h * stride_vh
    DO += off_z * stride_doz + off_h * stride_doh
    DK += off_z * stride_dkz + off_h * stride_dkh
    DV += off_z * stride_dvz + off_h * stride_dvh
    LSE += off_hz * n_q
    DELTA += off_hz * n_q

    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    key_ok = offs_n[:, None] < n_k
    k = tl.load(K + offs_n[:, None] * stride_kn + offs_d[None, :], mask=key_ok, other=0.0)
    v = tl.load(V + offs_n[:, None] * stride_vn + offs_d[None, :], mask=key_ok, other=0.0)
    dk = tl.full([BLOCK_N, HEAD_DIM], 0.0, tl.float32)
    dv = tl.full([BLOCK_N, HEAD_DIM], 0.0, tl.float32)

    # Query blocks: [lo, mid_lo) straddle the diagonal, [mid_lo, mid_hi) need no mask,
    # [mid_hi, end) run past n_q (or every block, when this key block runs past n_k).
    end = (n_q + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    lo = 0
    mid_lo = 0
    if CAUSAL:
        lo = (start_n // BLOCK_M) * BLOCK_M  # rows above start_n see none of these keys
        mid_lo = tl.minimum((start_n + BLOCK_N - 1 + BLOCK_M - 1) // BLOCK_M * BLOCK_M, end)
    mid_hi = tl.maximum(mid_lo, (n_q // BLOCK_M) * BLOCK_M)
    mid_hi = tl.where(start_n + BLOCK_N > n_k, mid_lo, mid_hi)
    dk, dv = _bwd_dkdv_blocks(
        dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_dom, s_scale, offs_n, n_q, n_k, lo, mid_lo,
        HEAD_DIM, BLOCK_M, True, CAUSAL, USE_EXP2,
    )
    dk, dv = _bwd_dkdv_blocks(
        dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_dom, s_scale, offs_n, n_q, n_k, mid_lo, mid_hi,
        HEAD_DIM, BLOCK_M, False, CAUSAL, USE_EXP2,
    )
    dk, dv = _bwd_dkdv_blocks(
        dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_dom, s_scale, offs_n, n_q, n_k, mid_hi, end,
        HEAD_DIM, BLOCK_M, True, CAUSAL, USE_EXP2,
    )
    dk *= scale  # d(scores)/d(qk) = scale
    tl.store(DK + offs_n[:, None] * stride_dkn + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=key_ok)
    tl.store(DV + offs_n[:, None] * stride_dvn + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=key_ok)


@triton.jit
def _bwd_dq_blocks(
    dq, q, do, lse, delta, K, V, stride_kn, stride_vn, s_scale, offs_m, n_q, n_k, lo, hi,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
    USE_EXP2: tl.constexpr,
):
    """Add the key blocks lo..hi to dQ of one query block (q, dO resident)."""
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        if MASK:
            key_ok = cols[:, None] < n_k
            k = tl.load(K + cols[:, None] * stride_kn + offs_d[None, :], mask=key_ok, other=0.0)
            v = tl.load(V + cols[:, None] * stride_vn + offs_d[None, :], mask=key_ok, other=0.0)
        else:
            k = tl.load(K + cols[:, None] * stride_kn + offs_d[None, :])
            v = tl.load(V + cols[:, None] * stride_vn + offs_d[None, :])
        p = _exp(tl.dot(q, tl.trans(k)) * s_scale - lse[:, None], USE_EXP2)
        if MASK:
            visible = (offs_m[:, None] < n_q) & (cols[None, :] < n_k)
            if CAUSAL:
                visible = visible & (cols[None, :] <= offs_m[:, None])
            p = tl.where(visible, p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    return dq


@triton.jit
def _bwd_dq_kernel(
    Q, K, V, DO, DQ, LSE, DELTA, s_scale, scale, n_q, n_k, n_heads,
    stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn,
    stride_vz, stride_vh, stride_vn, stride_doz, stride_doh, stride_dom,
    stride_dqz, stride_dqh, stride_dqm,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    USE_EXP2: tl.constexpr,
):
    row0 = tl.program_id(0) * BLOCK_M
    off_hz = tl.program_id(1)
    # int64: batch * batch-stride can pass 2**31 elements even when every stride fits in int32.
    off_z = (off_hz // n_heads).to(tl.int64)
    off_h = (off_hz % n_heads).to(tl.int64)
    Q += off_z * stride_qz + off_h * stride_qh
    K += off_z * stride_kz + off_h * stride_kh
    V += off_z * stride_vz + off_h * stride_vh
    DO += off_z * stride_doz + off_h * stride_doh
    DQ += off_z * stride_dqz + off_h * stride_dqh

    offs_m = row0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < n_q
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + offs_m[:, None] * stride_dom + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    lse = tl.load(LSE + off_hz * n_q + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + off_hz * n_q + offs_m, mask=row_ok, other=0.0)
    dq = tl.full([BLOCK_M, HEAD_DIM], 0.0, tl.float32)

    # As in the forward: blocks wholly visible first, then the masked rest.
    hi = n_k
    full_hi = (n_k // BLOCK_N) * BLOCK_N
    if CAUSAL:
        hi = tl.minimum(n_k, row0 + BLOCK_M)
        full_hi = tl.minimum(full_hi, ((row0 + 1) // BLOCK_N) * BLOCK_N)
    full_hi = tl.where(row0 + BLOCK_M > n_q, 0, full_hi)  # padded rows must be masked throughout
    dq = _bwd_dq_blocks(
        dq, q, do, lse, delta, K, V, stride_kn, stride_vn, s_scale, offs_m, n_q, n_k, 0, full_hi,
        HEAD_DIM, BLOCK_N, False, CAUSAL, USE_EXP2,
    )
    dq = _bwd_dq_blocks(
        dq, q, do, lse, delta, K, V, stride_kn, stride_vn, s_scale, offs_m, n_q, n_k, full_hi, hi,
        HEAD_DIM, BLOCK_N, True, CAUSAL, USE_EXP2,
    )
    dq *= scale
    tl.store(DQ + offs_m[:, None] * stride_dqm + offs_d[None, :], dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


# --------------------------------------------------------------------------------------------
# Host code
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Knobs:
    """The kernel's numeric knobs (module docstring) and two performance-only launch options."""

    block_m: int | None = None  # None: FA2's tile for the head dim (default_blocks)
    block_n: int | None = None
    stats: str = "fp32"
    accum: str = "fp32"
    variant: str = "fa2"
    exp2: bool = True
    num_warps: int | None = None  # None: a heuristic (launch_options); never changes numerics
    num_stages: int | None = None

    def __post_init__(self):
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if value is not None and value not in BLOCK_SIZES:
                raise ValueError(f"triton kernel: {name}={value} is not supported: use one of {BLOCK_SIZES}")
        for name in ("stats", "accum"):
            if getattr(self, name) not in STATS_FORMATS:
                raise ValueError(
                    f"triton kernel: {name}={getattr(self, name)!r} is not supported: use one of {STATS_FORMATS}"
                )
        if self.variant not in VARIANTS:
            raise ValueError(f"triton kernel: unknown variant {self.variant!r}: use one of {VARIANTS}")

    def blocks(self, head_dim: int) -> tuple[int, int]:
        default_m, default_n = default_blocks(head_dim)
        return self.block_m or default_m, self.block_n or default_n

    def describe(self) -> dict:
        return asdict(self)


def default_blocks(head_dim: int) -> tuple[int, int]:
    """FA2's forward tiles on sm80/sm90 (what sdpa_flash runs): 128 x 128 up to d=64, 128 x 64 above."""
    return (128, 128) if head_dim <= 64 else (128, 64)


def launch_options(head_dim: int, block_m: int, block_n: int, knobs: Knobs) -> dict:
    """num_warps / num_stages: performance only. Untuned guesses after Triton's attention tutorial."""
    warps = knobs.num_warps or (8 if block_m * max(block_n, head_dim) >= 128 * 128 else 4)
    stages = knobs.num_stages or (3 if head_dim >= 128 else 4)
    return {"num_warps": warps, "num_stages": stages}


def unsupported_reason(q: torch.Tensor, interpret: bool) -> str | None:
    """None when the kernels can run on q's device, dtype and head dim; else one line saying why."""
    head_dim = q.shape[-1]
    if head_dim not in HEAD_DIMS:
        return f"head dim {head_dim} is not supported: the Triton kernel takes head dims {', '.join(map(str, HEAD_DIMS))}"
    if interpret:
        if q.dtype not in INTERPRETER_DTYPES:
            return (
                f"Triton's CPU interpreter cannot run {_name(q.dtype)} (numpy has no bfloat16): "
                "it takes float32 or float16; bfloat16 needs a CUDA GPU"
            )
        return None
    if _is_interpreted(tl.standard):
        return (
            "Triton was imported with TRITON_INTERPRET=1, which makes its own library functions "
            "interpreter-only: unset it before starting Python to run on the GPU"
        )
    if q.device.type != "cuda":
        return (
            f"the Triton kernel runs on CUDA GPUs (float16, bfloat16), not {q.device.type}; "
            "to run it on CPU use Triton's interpreter (interpret=True or TRITON_INTERPRET=1; float32, float16)"
        )
    if q.dtype not in GPU_DTYPES:
        return f"the Triton kernel takes float16 or bfloat16 on the GPU, not {_name(q.dtype)}"
    return None


def interpret_default() -> bool:
    """What interpret=None means: TRITON_INTERPRET as set now (read at call time, not import time)."""
    return bool(triton.knobs.runtime.interpret)


def kernels(interpret: bool):
    """A module holding this file's kernels, compiled for the GPU or run by Triton's CPU interpreter."""
    this = sys.modules[__name__]
    if _is_interpreted(this) == interpret:
        return this
    return _load_copy(interpret)


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    causal: bool = False,
    knobs: Knobs | None = None,
    interpret: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, LSE): attention output in q's dtype and the fp32 row log-sum-exp (B, H, n_q).

    The LSE is in natural-log units with exp2=False and in log2 units with exp2=True.
    """
    knobs = knobs or Knobs()
    interpret = interpret_default() if interpret is None else interpret
    _check(q, k, v, interpret)
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    batch, heads, n_q, head_dim = q.shape
    n_k = k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    block_m, block_n = knobs.blocks(head_dim)
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(batch, heads, n_q, device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(n_q, block_m), batch * heads)
    constexprs = {
        "HEAD_DIM": head_dim, "BLOCK_M": block_m, "BLOCK_N": block_n, "CAUSAL": bool(causal),
        "FA1": knobs.variant == "fa1", "USE_EXP2": knobs.exp2,
        "STATS_LOW": knobs.stats == "input", "ACC_LOW": knobs.accum == "input",
    }
    with _on_device(q):
        _launch(
            kernels(interpret)._fwd_kernel, grid,
            (q, k, v, o, lse, _score_scale(scale, knobs), n_q, n_k, heads,
             *_strides(q), *_strides(k), *_strides(v), *_strides(o)),
            constexprs, launch_options(head_dim, block_m, block_n, knobs),
        )
    return o, lse


def backward(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    scale: float | None = None,
    causal: bool = False,
    knobs: Knobs | None = None,
    interpret: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) from the forward's inputs, output and LSE (FA2's backward, deterministic)."""
    knobs = knobs or Knobs()
    interpret = interpret_default() if interpret is None else interpret
    _check(q, k, v, interpret)
    q, k, v, do = (_last_dim_contiguous(t) for t in (q, k, v, do))
    batch, heads, n_q, head_dim = q.shape
    n_k = k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    # delta_i = sum_d dO_i O_i (= sum_j P_ij dP_ij): memory-bound, one pass, fp32.
    delta = (do.float() * o.float()).sum(-1).contiguous()
    dq, dk, dv = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    module = kernels(interpret)
    s_scale = _score_scale(scale, knobs)
    common = {"HEAD_DIM": head_dim, "CAUSAL": bool(causal), "USE_EXP2": knobs.exp2}
    blocks = backward_blocks(head_dim)
    with _on_device(q):
        block_m, block_n = blocks["_bwd_dkdv_kernel"]
        _launch(
            module._bwd_dkdv_kernel, (triton.cdiv(n_k, block_n), batch * heads),
            (q, k, v, do, dk, dv, lse, delta, s_scale, scale, n_q, n_k, heads,
             *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dk), *_strides(dv)),
            {"BLOCK_M": block_m, "BLOCK_N": block_n, **common}, BACKWARD_OPTIONS,
        )
        block_m, block_n = blocks["_bwd_dq_kernel"]
        _launch(
            module._bwd_dq_kernel, (triton.cdiv(n_q, block_m), batch * heads),
            (q, k, v, do, dq, lse, delta, s_scale, scale, n_q, n_k, heads,
             *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq)),
            {"BLOCK_M": block_m, "BLOCK_N": block_n, **common}, BACKWARD_OPTIONS,
        )
    return dq, dk, dv


def _launch(kernel, grid, args, constexprs, options) -> None:
    """Launch; on a GPU with less shared memory than the options assume (e.g. 100 KB on
    consumer parts), retry with fewer pipeline stages -- fewer buffered tiles, same numerics."""
    stages = options["num_stages"]
    while True:
        try:
            kernel[grid](*args, **constexprs, num_warps=options["num_warps"], num_stages=stages)
            return
        except OutOfResources:
            if stages <= 1:
                raise
            stages -= 1


def _score_scale(scale: float, knobs: Knobs) -> float:
    # exp2 variant: fold log2(e) into the scale once, so exp(x * scale) = exp2(x * scale * log2(e)).
    return scale * LOG2_E if knobs.exp2 else scale


def _check(q, k, v, interpret: bool) -> None:
    if not (q.dtype == k.dtype == v.dtype) or not (q.shape[-1] == k.shape[-1] == v.shape[-1]):
        raise ValueError(
            f"triton kernel: q, k, v need one dtype and one head dim, got {q.dtype}/{k.dtype}/{v.dtype}, "
            f"dims {q.shape[-1]}/{k.shape[-1]}/{v.shape[-1]}"
        )
    reason = unsupported_reason(q, interpret)
    if reason is not None:
        raise ValueError(f"triton kernel: {reason}")


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class _on_device:
    """Launch on the inputs' GPU (not whichever is current); a no-op for the interpreter on CPU."""

    def __init__(self, t: torch.Tensor):
        self.guard = torch.cuda.device(t.device) if t.device.type == "cuda" else None

    def __enter__(self):
        if self.guard is not None:
            self.guard.__enter__()

    def __exit__(self, *exc):
        if self.guard is not None:
            self.guard.__exit__(*exc)


def _is_interpreted(module) -> bool:
    """Whether `module`'s jit functions (this file, or triton.language.standard) are interpreted."""
    from triton.runtime.interpreter import InterpretedFunction

    probe = module._fwd_kernel if hasattr(module, "_fwd_kernel") else module._elementwise_max
    return isinstance(probe, InterpretedFunction)


@functools.cache
def _load_copy(interpret: bool):
    """This file loaded again as a separate module, with @triton.jit in the other mode.

    knobs.runtime.scope() restores TRITON_INTERPRET (in triton.knobs and os.environ) afterwards;
    the copy's kernels keep the mode they were decorated in.
    """
    name = f"{__name__}_{'interpreted' if interpret else 'compiled'}"
    spec = importlib.util.spec_from_file_location(name, __file__)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and Triton look modules up by name
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = interpret
        spec.loader.exec_module(module)
    return module


def compile_for_gpu(
    arch: int = 90,
    head_dim: int = 128,
    dtype: str = "bf16",
    causal: bool = False,
    knobs: Knobs | None = None,
) -> dict:
    """Compile the three kernels for an NVIDIA GPU of compute capability `arch` (90: H100),
    without needing one, and return {kernel name: triton CompiledKernel} (asm["ptx"], asm["cubin"]).

    A check for machines with no GPU: the interpreter runs the kernels' Python, not Triton's
    compiler, so only this catches code the GPU compiler rejects.
    """
    knobs = knobs or Knobs()
    block_m, block_n = knobs.blocks(head_dim)
    common = {"HEAD_DIM": head_dim, "CAUSAL": causal, "USE_EXP2": knobs.exp2}
    plans = {
        "_fwd_kernel": (
            {**common, "BLOCK_M": block_m, "BLOCK_N": block_n, "FA1": knobs.variant == "fa1",
             "STATS_LOW": knobs.stats == "input", "ACC_LOW": knobs.accum == "input"},
            launch_options(head_dim, block_m, block_n, knobs),
        ),
        **{
            name: ({**common, "BLOCK_M": block_m, "BLOCK_N": block_n}, BACKWARD_OPTIONS)
            for name, (block_m, block_n) in backward_blocks(head_dim).items()
        },
    }
    return {name: compile_kernel(name, constexprs, options, arch, dtype) for name, (constexprs, options) in plans.items()}


def compile_kernel(name: str, constexprs: dict, options: dict, arch: int = 90, dtype: str = "bf16"):
    """One of this file's kernels compiled for compute capability `arch`, no GPU needed."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(kernels(False), name)
    signature, attrs = {}, {}
    for index, arg in enumerate(fn.arg_names):
        if arg in constexprs:
            signature[arg] = "constexpr"
        elif arg in ("s_scale", "scale"):
            signature[arg] = "fp32"
        elif arg[0].isupper():  # the tensors (constexprs are caught above)
            signature[arg] = "*fp32" if arg in ("LSE", "DELTA") else f"*{dtype}"
        else:
            signature[arg] = "i32"
        # What a launch with contiguous tensors gets: aligned pointers and strides that are
        # multiples of 16 (without it the loads cannot be vectorised or pipelined).
        if arg not in constexprs and (arg[0].isupper() or arg.startswith("stride_")):
            attrs[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
