"""The arithmetic of FlashAttention-2's CUDA forward that numdev models (`numerics=fa2_cuda`).

FlashAttention-2's forward as PyTorch compiles it into SDPA's FLASH_ATTENTION backend
(aten/src/ATen/native/transformers/cuda/flash_attn: flash_fwd_kernel.h, softmax.h, flash_api.cpp)
and as the flash-attn package builds it; SM80 code (mma.sync m16n8k16), run as is on SM90. Per
query tile of B_r rows and key/value block of B_c, in float32 registers:
  S = Q_tile K_block^T                    raw, unscaled; masked keys -inf
  m = max(m_old, rowmax(S))               the row max of the raw scores
  alpha = exp2((m_old - m) * c)           c = scale * log2(e), rounded once to float32
  l = alpha * l; O = alpha * O
  P = exp2(S * c - m * c)                 torch's build: FMUL, then FADD (its UNFUSE_FMA); flash-attn's:
                                          one FFMA (exp=exp2_ffma); m * c is rounded first
  l = l + P, per thread                   each of the 4 threads of a row's quad sums its own columns
                                          (8n + 2t + e, n-major) over every block, unrounded P
  O = O + bf16(P) V                       the tensor cores, P rounded to the input format (nearest even)
Key/value blocks run last to first. At the end l is summed over the quad (a butterfly: lanes xor 2,
then xor 1), O * (1 / l) (a correctly rounded reciprocal: MUFU.RCP and a Newton step) is rounded to
the input format, and lse = m * scale + __logf(l) (MUFU.LG2 times ln 2 in float32, then one FFMA).

Split-KV: when batch x heads x ceil(N_q / 64) < 0.8 x 2 x SMs, `flash_api.cpp` splits the key/value
blocks into `num_splits` ranges (its num_splits_heuristic; `schedule` here), run by the split kernel
with its own tiles (B_r = 64, B_c = 256 for d <= 64, 128 for d <= 128); each split writes its
normalised O in float32 and its lse_i as above, and a combine kernel computes
lse = logf(sum_i expf(lse_i - max)) + max (the sum over the kernel's thread layout, then a butterfly)
and O = sum_i expf(lse_i - lse) O_i (one FFMA per split, in split order), with libdevice's expf
(a range reduction around MUFU.EX2) and logf (a polynomial: no MUFU).

Where each of these forms comes from: torch 2.11's sm_90 machine code, read without a GPU by
scripts/kernel_sass.py (the constants here are the ones in the binary). What is not modelled, and
so bounds the share of bit-identical outputs: the multi-function unit's own bits (MUFU.EX2 and
MUFU.LG2, within 2 ulp) are correctly rounded float32 functions here; the tensor cores' sums are
float32 matmuls (matmul=aten) or one of two hypotheses to measure: each 16-term chunk's exact sum
added to the float32 accumulator with one rounding to nearest (matmul=mma16), or the accumulator
and the chunk's 16 exact products aligned to the largest with 25 bits kept, cut toward zero, summed
and cut toward zero to float32 (matmul=mma16_rz: the truncating multi-term adder Fasi et al., PeerJ
CS 7:e330, 2021, found in V100-A100 tensor cores; 25 bits is what public probes of H100 report, and
16 terms per step is this model's guess). Nothing here has been compared with a GPU's outputs yet:
scripts/gpu_kernels.py measures the share per kernel.
"""

from __future__ import annotations

import math
import struct

import torch

from numdev.attention import cpu_kernel
from numdev.numerics.formats import parse_format, round_to
from numdev.numerics.stages import CUDA_ARITHMETIC

MMA_K = 16  # the k of mma.sync m16n8k16: terms per tensor-core sum
ALIGN_BITS = 25  # matmul=mma16_rz: significand bits the tensor cores keep when they align a step's terms (SM90)
QUAD = 4  # threads sharing a row of the accumulator fragment
SM90_SMS = 132  # H100 SXM and H200
MAX_SPLITS = 128  # flash_api.cpp: "num_splits > 128 not supported"
LOG2E = 1.4426950408889634  # M_LOG2E, a double, as flash_api.cpp multiplies it

# (B_r, B_c) of FA2's forward on SM80/SM90 without dropout, causal or not (flash_fwd_launch_template.h):
FORWARD_TILES = {64: (128, 128), 128: (128, 64)}
SPLIT_BLOCK_M = 64  # the split kernel's B_r; its B_c: 256 for d <= 64, 128 for d <= 128, else 64
_NEG_INF = float("-inf")
_FP32_RZ = parse_format("fp32:rtz")  # the tensor cores' last rounding in matmul=mma16_rz


def split_block_n(dim: int) -> int:
    return 256 if dim <= 64 else 128 if dim <= 128 else 64


def num_splits_heuristic(batch_heads_mblocks: int, sms: int, n_blocks: int, max_splits: int) -> int:
    """flash_api.cpp's choice: the fewest splits within 85% of the best wave efficiency (1 when the
    work nearly fills the SMs). `sms` as the kernel passes it: 2 x the multiprocessors."""
    if batch_heads_mblocks >= 0.8 * sms:
        return 1
    max_splits = min(max_splits, sms, n_blocks)
    eligible = [s == 1 or math.ceil(n_blocks / s) != math.ceil(n_blocks / (s - 1)) for s in range(1, max_splits + 1)]
    efficiency = []
    for splits, ok in zip(range(1, max_splits + 1), eligible):
        waves = batch_heads_mblocks * splits / sms
        efficiency.append(waves / math.ceil(waves) if ok else 0.0)
    best = max(efficiency, default=0.0)
    return next((s for s, ok, e in zip(range(1, max_splits + 1), eligible, efficiency) if ok and e >= 0.85 * best), 1)


def schedule(batch: int, heads: int, n_q: int, n_k: int, dim: int, sms: int = SM90_SMS) -> tuple[int, int, int]:
    """(B_r, B_c, splits) of FA2's forward for this call on a GPU with `sms` multiprocessors (head dims 64
    and 128: the tiles modelled)."""
    if dim not in FORWARD_TILES:
        raise ValueError(f"FA2's tiles are modelled for head dims {sorted(FORWARD_TILES)}, not {dim}")
    block_n = split_block_n(dim)
    splits = num_splits_heuristic(batch * heads * -(-n_q // 64), 2 * sms, -(-n_k // block_n), MAX_SPLITS)
    if splits > 1:
        return SPLIT_BLOCK_M, block_n, splits
    return (*FORWARD_TILES[dim], 1)


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32)


# -- The GPU's float32 functions, as torch's FA2 machine code for sm_90 computes them ----------------------
# Read from the kernels' SASS (scripts/kernel_sass.py checks each of these forms in the binary). What the
# machine code cannot say is the bits of the multi-function unit's approximations (MUFU.EX2, MUFU.LG2:
# PTX's ex2.approx.f32 and lg2.approx.f32, within 2 ulp): those two are correctly rounded float32
# functions here, through float64 (the same bits for an element wherever it lies: ATen's float32 exp2
# takes its vector path or its scalar tail by position, and the two differ in the last bit). Everything
# around them (range reduction, scaling, polynomials, FFMA against FMUL + FADD) is the kernels' own.
LN2_F32 = 0.6931471824645996  # __logf's multiplier after MUFU.LG2: ln 2 rounded to float32
FLT_MIN = 2.0 ** -126


def mufu_ex2(x: torch.Tensor) -> torch.Tensor:
    """MUFU.EX2, the hypothesis: 2^x correctly rounded to float32."""
    return _f32(torch.exp2(x.double()))


def mufu_lg2(x: torch.Tensor) -> torch.Tensor:
    """MUFU.LG2, the hypothesis: log2(x) correctly rounded to float32 (x >= FLT_MIN: its callers scale)."""
    return _f32(torch.log2(x.double()))


def exp2(x: torch.Tensor) -> torch.Tensor:
    """exp2f in FA2's softmax (ex2.approx.f32, not flushed): below -126 the argument is halved, MUFU.EX2
    taken and the result squared (FSETP.GEU -126, FMUL 0.5, MUFU.EX2, FMUL r r), so that subnormal
    results are not flushed."""
    low = x < -126  # NaN is not: FSETP.GEU is true when unordered
    r = mufu_ex2(torch.where(low, x * 0.5, x))
    return torch.where(low, r * r, r)


def fast_log(x: torch.Tensor) -> torch.Tensor:
    """__logf in FA2's softmax (the log-sum-exp): MUFU.LG2 times ln 2 rounded to float32 (one FMUL); an
    argument below FLT_MIN is scaled by 2^24 first and 24 subtracted after (one FADD)."""
    x = _f32(x)
    low = x.abs() < FLT_MIN
    r = mufu_lg2(torch.where(low, x * 16777216.0, x))
    r = torch.where(low, r - 24.0, r)
    return r * LN2_F32


def float32_from_bits(bits: int) -> float:
    """The float32 whose bits are `bits` (the machine code's constants, exactly)."""
    return struct.unpack("<f", struct.pack("<I", bits))[0]


# libdevice's expf (the split-KV combine's exp): t = sat(x * log2(e)/252 + 1/2); j = floor(252 t) - 126
# (FFMA.RM against 1.5 * 2^23 + 1, then FADD); z = x log2(e) - j in two FFMAs (log2(e) split in two
# floats); 2^j (built from the integer's bits) times MUFU.EX2(z), one FMUL.
EXPF_T = float32_from_bits(0x3BBB989D)  # log2(e) / 252
EXPF_LOG2E = (float32_from_bits(0x3FB8AA3B), float32_from_bits(0x32A57060))


def expf(x: torch.Tensor) -> torch.Tensor:
    x = _f32(x)
    t = torch.nan_to_num(_fma(x, EXPF_T, torch.full_like(x, 0.5)), nan=0.0).clamp(0.0, 1.0)  # .SAT: NaN to 0
    j = torch.floor(t.double() * 252.0) - 126.0  # exact: t * 252 has at most 32 significant bits
    z = _fma(x, EXPF_LOG2E[1], _fma(x, EXPF_LOG2E[0], _f32(-j)))
    return torch.ldexp(torch.ones_like(x), j.to(torch.int32)) * mufu_ex2(z)


# libdevice's logf (the split-KV combine's log): a = 2^e m with m in [2/3, 4/3) by integer arithmetic on its
# bits (a below FLT_MIN scaled by 2^23 first), f = m - 1, log1p(f) = f + f (f p(f)) with p of degree 8 in
# FFMAs (no MUFU), + e ln 2 in one FFMA; +inf, NaN and negatives through a FFMA with +inf, 0 to -inf.
LOGF_POLY = tuple(float32_from_bits(b) for b in (0xBE055027, 0x3E1039F6, 0xBDF8CDCC, 0x3E0F2955, 0xBE2AD8B9, 0x3E4CED0B,
                                        0xBE7FFF22, 0x3EAAAA78, 0xBF000000))


def logf(x: torch.Tensor) -> torch.Tensor:
    a = _f32(x)
    small = a < FLT_MIN  # FSETP.GEU a, FLT_MIN (a, not |a|): negatives are scaled too, NaN is not
    a = torch.where(small, a * 8388608.0, a)
    bits = a.view(torch.int32)
    e_bits = (bits - 0x3F2AAAAB) & -0x800000  # LOP3 with 0xff800000: the exponent's step, a signed integer
    f = (bits - e_bits).view(torch.float32) - 1.0
    e = _fma(e_bits.to(torch.float32), 2.0 ** -23, torch.where(small, -23.0, 0.0))
    r = torch.full_like(f, LOGF_POLY[0])
    for coefficient in LOGF_POLY[1:]:
        r = _fma(f, r, torch.full_like(f, coefficient))
    r = _fma(f, f * r, f)
    r = _fma(e, LN2_F32, r)
    special = (bits.long() & 0xFFFFFFFF) >= 0x7F800000  # unsigned: +inf, NaN and every negative
    r = torch.where(special, torch.where(a == float("inf"), a, torch.full_like(a, float("nan"))), r)
    return torch.where(a == 0, torch.full_like(a, _NEG_INF), r)


def _fma(a: torch.Tensor, b, c: torch.Tensor) -> torch.Tensor:
    """FFMA: a * b + c rounded once to float32 (cpu_kernel.fma; b may be a float32 scalar)."""
    return cpu_kernel.fma(a, torch.as_tensor(b, dtype=torch.float32), c)


def tensor_core_matmul(a: torch.Tensor, b: torch.Tensor, acc: torch.Tensor | None, matmul: str) -> torch.Tensor:
    """acc + a @ b (acc None: zero) in float32, as the tensor cores of `matmul` sum it."""
    if matmul == "aten":
        product = a @ b
        return product if acc is None else acc + product
    k = a.shape[-1]
    pad = -k % MMA_K
    if pad:
        a = torch.nn.functional.pad(a, (0, pad))
        b = torch.nn.functional.pad(b, (0, 0, 0, pad))
    chunks = a.shape[-1] // MMA_K
    shape = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    total = torch.zeros(shape, dtype=torch.float32) if acc is None else acc
    if matmul == "mma16":
        # (..., chunks, rows, cols): each chunk's sum in float64 (16 products of 16-bit inputs: exact but in extreme cases)
        sums = a.double().unflatten(-1, (chunks, MMA_K)).movedim(-2, -3) @ b.double().unflatten(-2, (chunks, MMA_K))
        for i in range(chunks):
            total = _f32(total.double() + sums[..., i, :, :])
        return total
    a64, b64 = a.double(), b.double().transpose(-1, -2)  # (..., rows, K), (..., cols, K)
    for i in range(chunks):
        part = slice(i * MMA_K, (i + 1) * MMA_K)
        products = a64[..., :, None, part] * b64[..., None, :, part]  # (..., rows, cols, 16), each exact
        total = _aligned_sum_rz(torch.cat([total.double()[..., None], products], dim=-1))
    return total


def _truncate(x: torch.Tensor, unit: torch.Tensor) -> torch.Tensor:
    """x toward zero to a multiple of `unit` (powers of 2; exact in float64)."""
    return torch.trunc(x / unit) * unit


def _aligned_sum_rz(terms: torch.Tensor) -> torch.Tensor:
    """matmul=mma16_rz, one tensor-core step: the accumulator and the 16 exact products (last dim) aligned to the
    largest magnitude with ALIGN_BITS bits kept (the rest cut toward zero), summed exactly, and the sum cut to
    float32 toward zero (RZ)."""
    _, top = torch.frexp(terms.abs().amax(dim=-1, keepdim=True))  # |largest| in [2^(top-1), 2^top)
    aligned = _truncate(terms, torch.ldexp(torch.ones_like(terms[..., :1]), top - ALIGN_BITS))
    total = aligned.sum(dim=-1)  # < 2^(ALIGN_BITS + 5) units: exact in float64
    return _f32(round_to(total, _FP32_RZ))


def _lane_sums(lanes: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Each quad lane's running sum plus its columns of `probs` (..., cols), one float32 addition at a time
    in the fragment's order: lane t holds columns 8n + 2t + e, n-major, e-minor."""
    cols = probs.shape[-1]
    padded = torch.nn.functional.pad(probs, (0, -cols % 8))  # columns past the keys: P = 0, adding +0 is exact
    per_lane = padded.unflatten(-1, (-1, QUAD, 2)).movedim(-2, -3)  # (..., 4, n, 2)
    per_lane = per_lane.flatten(-2)  # (..., 4, n*2): lane t's columns in its order
    for i in range(per_lane.shape[-1]):
        lanes = lanes + per_lane[..., i]
    return lanes


def _butterfly(values: torch.Tensor) -> torch.Tensor:
    """Allreduce<N> of flash's utils.h over the last dim (a power of 2): x + shfl_xor(x, N/2), ... , 1; lane 0's."""
    width = values.shape[-1]
    offset = width // 2
    while offset >= 1:
        values = values + values[..., torch.arange(width) ^ offset]
        offset //= 2
    return values[..., 0]


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool, block_m: int,
            block_n: int, splits: int, exp_rule: str, matmul: str, half: torch.dtype, rounded: bool = True
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's output (float32 values of `half`) and its log-sum-exp (float32, (B, H, N_q): what
    the kernel writes as softmax_lse, +inf for a row that saw no key) for q, k, v (B, H, N, d) holding
    `half` values; rounded=False: the float32 output before its last rounding (for tests)."""
    if exp_rule not in CUDA_ARITHMETIC["exp"] or matmul not in CUDA_ARITHMETIC["matmul"]:
        raise ValueError(f"the FA2 CUDA model takes exp in {CUDA_ARITHMETIC['exp']} and matmul in {CUDA_ARITHMETIC['matmul']}")
    q, k, v = (t.to(torch.float32) for t in (q, k, v))
    n_q, n_k = q.shape[2], k.shape[2]
    scale32 = float(torch.tensor(scale, dtype=torch.float32))  # the kernel's float softmax_scale
    c = float(torch.tensor(scale32 * LOG2E, dtype=torch.float32))  # params.scale_softmax_log2
    n_blocks = -(-n_k // block_n)
    per_split = -(-n_blocks // splits)
    rows = torch.arange(n_q)
    row_tile_end = (rows // block_m + 1) * block_m  # one past the last row of each row's tile
    # causal (bottom-right aligned, as FA2): the blocks a row's tile needs end at ceil((tile end + n_k - n_q) / B_c)
    needed = torch.clamp(-(-(row_tile_end + n_k - n_q) // block_n), max=n_blocks) if causal else torch.full_like(rows, n_blocks)
    outs, lses = [], []
    for split in range(splits):
        lo, hi = split * per_split, min(n_blocks, (split + 1) * per_split)
        row_hi = torch.clamp(needed, max=hi)
        out, lse = _split(q, k, v, scale32, c, causal, block_n, lo, row_hi, exp_rule, matmul, half, split_kernel=splits > 1)
        outs.append(out)
        lses.append(lse)
    out, lse = (outs[0], lses[0]) if splits == 1 else _combine(torch.stack(outs), torch.stack(lses), q.shape[-1])
    return (_f32(out.to(half)) if rounded else out), lse


def _split(q, k, v, scale32: float, c: float, causal: bool, block_n: int, lo: int, row_hi: torch.Tensor,
           exp_rule: str, matmul: str, half: torch.dtype, split_kernel: bool):
    """One split's loop over blocks row_hi - 1 down to lo (per row's tile): its normalised O (float32)
    and lse (float32, (..., rows); a row with no key: -inf in a split, +inf in the kernel without splits)."""
    batch, heads, n_q, dim = q.shape
    n_k = k.shape[2]
    row_max = torch.full((batch, heads, n_q, 1), _NEG_INF)
    lanes = torch.zeros(batch, heads, n_q, QUAD)
    acc = torch.zeros(batch, heads, n_q, v.shape[-1])
    top = int(row_hi.max()) if n_q else lo
    for block in range(top - 1, lo - 1, -1):
        start, stop = block * block_n, min((block + 1) * block_n, n_k)
        # the rows whose tile reads this block: a suffix (row_hi never decreases down the rows), computed alone
        first = int(torch.searchsorted(row_hi, block, right=True))
        rows = slice(first, n_q)
        scores = tensor_core_matmul(q[:, :, rows], k[:, :, start:stop].transpose(-1, -2), None, matmul)
        if causal:
            keys = torch.arange(start, stop)[None, :]
            scores = scores.masked_fill(keys > torch.arange(first, n_q)[:, None] + (n_k - n_q), _NEG_INF)
        old_max = row_max[:, :, rows]
        new_max = torch.maximum(old_max, scores.amax(dim=-1, keepdim=True))
        current = new_max.masked_fill(new_max == _NEG_INF, 0.0)  # Check_inf
        alpha = exp2(_f32((old_max - current) * c))  # FSUB, FMUL: -inf - m gives 0
        max_scaled = _f32(new_max * c).masked_fill(new_max == _NEG_INF, 0.0)
        if exp_rule == "exp2":  # __fmul_rn(S, c) - m c
            argument = _f32(scores * c) - max_scaled
        else:
            argument = _fma(scores, c, -max_scaled).masked_fill(scores == _NEG_INF, _NEG_INF)
        probs = exp2(argument)
        lanes[:, :, rows] = _lane_sums(lanes[:, :, rows] * alpha, probs)
        acc[:, :, rows] = tensor_core_matmul(_f32(probs.to(half)), v[:, :, start:stop], acc[:, :, rows] * alpha, matmul)
        row_max[:, :, rows] = new_max
    row_sum = _butterfly(lanes).unsqueeze(-1)
    empty = (row_sum == 0) | torch.isnan(row_sum)
    inverse = torch.where(empty, torch.ones_like(row_sum), 1.0 / row_sum)
    out = acc * inverse
    # lse = m * scale + __logf(l): the FMUL after MUFU.LG2, then one FFMA with m * scale
    lse = _fma(row_max, scale32, fast_log(row_sum.masked_fill(empty, 1.0)))
    lse = lse.masked_fill(empty, _NEG_INF if split_kernel else float("inf"))
    return out, lse.squeeze(-1)


def _combine(outs: torch.Tensor, lses: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """flash_fwd_splitkv_combine_kernel: outs (splits, ..., rows, d) float32, lses (splits, ..., rows);
    the combined O (float32) and lse."""
    splits = outs.shape[0]
    max_splits = max(2, 1 << (splits - 1).bit_length())  # kMaxSplits: the power of 2 the launch picks
    block_m = 4 if dim % 128 == 0 else 8 if dim % 64 == 0 else 16  # the combine kernel's rows per block
    lanes = min(128 // block_m, max_splits)  # kRowsPerLoadTranspose: threads sharing a row's splits
    per_lane = -(-max_splits * block_m // 128)  # kNLsePerThread
    padded = torch.full((per_lane * lanes, *lses.shape[1:]), _NEG_INF)
    padded[:splits] = lses
    lse_max = padded.amax(dim=0)
    lse_max = lse_max.masked_fill(lse_max == _NEG_INF, 0.0)
    terms = expf(padded - lse_max).unflatten(0, (per_lane, lanes))  # row l*lanes + t: lane t's l-th
    local = terms[0]
    for i in range(1, per_lane):
        local = local + terms[i]
    lse_sum = _butterfly(local.movedim(0, -1))
    bad = (lse_sum == 0) | torch.isnan(lse_sum)
    lse = torch.where(bad, torch.full_like(lse_sum, float("inf")), logf(lse_sum.masked_fill(bad, 1.0)) + lse_max)
    out = torch.zeros_like(outs[0])
    for split in range(splits):
        weight = expf(lses[split] - lse).unsqueeze(-1)
        out = _fma(weight.expand_as(outs[split]), outs[split], out)
    return out, lse
