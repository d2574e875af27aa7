/* The flash emulator's elementwise work per key/value block, fused, for numdev.attention.native.

Every function gives bit for bit what numdev.attention.flash_emulated computes with ATen ops:
  - each arithmetic operation is one IEEE float32 operation (built with -ffp-contract=off, so no
    multiply-add is ever fused, and without -ffast-math);
  - rounding to bf16 is c10::BFloat16's round to nearest even, to fp16 the IEEE conversion;
  - exp comes from a table made by ATen's own exp over every value of the 16-bit score format,
    already rounded to the format that follows it, so it is ATen's exp by construction;
  - the row sum, the matmuls and exp of a float32 argument stay in ATen (the caller runs them).
The caller (numdev.attention.native) holds the tests that compare these with the ATen path.

Blocks are row-major float32 (rows x cols, row stride ld): the rows of every (batch, head) one
after another, `period` rows each. Row i has query index q0 + i % period, key column j has key
index k0 + j; with `causal`, keys after the query are masked (-inf). A row
whose causal tile lies wholly above the diagonal (its tile's last query index < k0) is not
active: the merge leaves its state as it was, as kernels skip the tile. */

#include <stdint.h>
#include <string.h>

enum { FP32 = 0, BF16 = 1, FP16 = 2 };

static inline uint32_t bits_of(float x) { uint32_t b; memcpy(&b, &x, 4); return b; }
static inline float float_of(uint32_t b) { float x; memcpy(&x, &b, 4); return x; }

static inline float round_bf16(float x) {
    uint32_t b = bits_of(x);
    float rounded = float_of((b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u);
    return x != x ? x : rounded;  /* NaN stays NaN (the bit trick could carry it into inf) */
}

static inline float round_fp16(float x) { return (float)(_Float16)x; }

/* x rounded in place to the stage format `code`; one loop per format so each vectorises. */
static void round_row(float *x, int64_t n, int code) {
    if (code == BF16) {
        for (int64_t j = 0; j < n; j++) x[j] = round_bf16(x[j]);
    } else if (code == FP16) {
        for (int64_t j = 0; j < n; j++) x[j] = round_fp16(x[j]);
    }
}

static inline float round_one(float x, int code) {
    return code == BF16 ? round_bf16(x) : code == FP16 ? round_fp16(x) : x;
}

static inline uint32_t index_of(float x, int code) {
    if (code == BF16) return bits_of(x) >> 16;  /* x is a bf16 value: its top half is its bits */
    _Float16 h = (_Float16)x;                     /* x is an fp16 value: exact */
    uint16_t b;
    memcpy(&b, &h, 2);
    return b;
}

static inline int64_t visible_keys(int causal, int64_t query, int64_t k0, int64_t cols) {
    if (!causal) return cols;
    int64_t n = query - k0 + 1;
    return n < 0 ? 0 : n > cols ? cols : n;
}

/* Max over one row of S = round(raw * scale), keys from `visible` on masked (-inf); NaN if any.
   Computed as round(max(raw) * scale): scaling by a positive scale and rounding are monotonic,
   so they commute with max (the caller passes only scale > 0). */
static float row_score_max(const float *raw, int64_t visible, float scale, int score) {
    float m = -__builtin_inff();
    int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
    for (int64_t j = 0; j < visible; j++) {
        nan |= raw[j] != raw[j];
        m = raw[j] > m ? raw[j] : m;
    }
    return nan ? __builtin_nanf("") : round_one(m * scale, score);
}

#ifdef __AVX512F__
#include <immintrin.h>

/* round_bf16 of 16 values that are not NaN (the bit trick is exact for every other value). */
static inline __m512 round_bf16_x16_no_nan(__m512 x) {
    __m512i b = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), lsb),
                                 _mm512_set1_epi32((int)0xFFFF0000u));
    return _mm512_castsi512_ps(r);
}

static inline __m512 round_bf16_x16(__m512 x) {
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_mask_blend_ps(nan, round_bf16_x16_no_nan(x), x);
}

static inline __mmask16 first_lanes(int64_t left) {  /* the lanes of the next 16 that exist */
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
}

/* One row of P for bf16 scores, 16 keys at a time, the table read by gathers. A row whose
   visible scores' max is finite holds no NaN and no +inf, and with a finite shift S - shift is
   never NaN either: its roundings skip the NaN test. */
static void probs_row_bf16(const float *raw, int64_t cols, int64_t visible, float scale, float shift,
                           float row_max, const float *table, float *p) {
    const __m512 scale16 = _mm512_set1_ps(scale), shift16 = _mm512_set1_ps(shift);
    const __m512 masked = _mm512_set1_ps(-__builtin_inff());
    const int finite = row_max - row_max == 0.0f && shift - shift == 0.0f;
    for (int64_t j = 0; j < cols; j += 16) {
        __mmask16 lanes = first_lanes(cols - j);
        __mmask16 seen = visible - j <= 0 ? 0 : first_lanes(visible - j);
        __m512 product = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, raw + j), scale16);
        __m512 s = _mm512_mask_blend_ps(seen, masked, finite ? round_bf16_x16_no_nan(product) : round_bf16_x16(product));
        __m512 difference = _mm512_sub_ps(s, shift16);
        __m512 x = finite ? round_bf16_x16_no_nan(difference) : round_bf16_x16(difference);
        __m512i index = _mm512_srli_epi32(_mm512_castps_si512(x), 16);
        _mm512_mask_storeu_ps(p + j, lanes, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), lanes, index, table, 4));
    }
}

/* O = round(round(a O) + round(PV)), bf16, one row. */
static void fa2_merge_row_bf16(float a, const float *v, float *o, int64_t dim) {
    const __m512 a16 = _mm512_set1_ps(a);
    for (int64_t j = 0; j < dim; j += 16) {
        __mmask16 lanes = first_lanes(dim - j);
        __m512 scaled = round_bf16_x16(_mm512_mul_ps(a16, _mm512_maskz_loadu_ps(lanes, o + j)));
        __m512 added = round_bf16_x16(_mm512_maskz_loadu_ps(lanes, v + j));
        _mm512_mask_storeu_ps(o + j, lanes, round_bf16_x16(_mm512_add_ps(scaled, added)));
    }
}

/* O = round(round(round(l_old O) + round(alpha_block round(PV))) / l_new), bf16, one row. */
static void fa1_merge_row_bf16(float old_sum, float alpha_block, float divisor, const float *v, float *o, int64_t dim) {
    const __m512 l16 = _mm512_set1_ps(old_sum), a16 = _mm512_set1_ps(alpha_block), d16 = _mm512_set1_ps(divisor);
    for (int64_t j = 0; j < dim; j += 16) {
        __mmask16 lanes = first_lanes(dim - j);
        __m512 added = round_bf16_x16(_mm512_mul_ps(a16, round_bf16_x16(_mm512_maskz_loadu_ps(lanes, v + j))));
        __m512 kept = round_bf16_x16(_mm512_mul_ps(l16, _mm512_maskz_loadu_ps(lanes, o + j)));
        __m512 total = round_bf16_x16(_mm512_add_ps(kept, added));
        _mm512_mask_storeu_ps(o + j, lanes, round_bf16_x16(_mm512_div_ps(total, d16)));
    }
}
#else
static void fa2_merge_row_bf16(float a, const float *v, float *o, int64_t dim) {
    for (int64_t j = 0; j < dim; j++) o[j] = round_bf16(round_bf16(a * o[j]) + round_bf16(v[j]));
}
static void fa1_merge_row_bf16(float old_sum, float alpha_block, float divisor, const float *v, float *o, int64_t dim) {
    for (int64_t j = 0; j < dim; j++) {
        float added = round_bf16(alpha_block * round_bf16(v[j]));
        o[j] = round_bf16(round_bf16(round_bf16(old_sum * o[j]) + added) / divisor);
    }
}
#ifdef __AVX2__
#include <immintrin.h>

static inline __m256 round_bf16_x8(__m256 x) {
    __m256i b = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7FFF)), lsb),
                                 _mm256_set1_epi32((int)0xFFFF0000u));
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    return _mm256_blendv_ps(_mm256_castsi256_ps(r), x, nan);
}

/* AVX2 (no AVX-512): the same row of P, 8 keys at a time, the table read by AVX2 gathers. */
static void probs_row_bf16(const float *raw, int64_t cols, int64_t visible, float scale, float shift,
                           float row_max, const float *table, float *p) {
    (void)row_max;
    const __m256 scale8 = _mm256_set1_ps(scale), shift8 = _mm256_set1_ps(shift);
    const __m256 masked = _mm256_set1_ps(-__builtin_inff());
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t j = 0; j < cols; j += 8) {
        int64_t left = cols - j < 8 ? cols - j : 8, open = visible - j < 0 ? 0 : visible - j < 8 ? visible - j : 8;
        __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)left), lane);  /* all ones where the key exists */
        __m256 seen = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)open), lane));
        __m256 s = round_bf16_x8(_mm256_mul_ps(_mm256_maskload_ps(raw + j, lanes), scale8));
        s = _mm256_blendv_ps(masked, s, seen);
        __m256 x = round_bf16_x8(_mm256_sub_ps(s, shift8));
        __m256i index = _mm256_srli_epi32(_mm256_castps_si256(x), 16);
        __m256 probs = _mm256_mask_i32gather_ps(_mm256_setzero_ps(), table, index, _mm256_castsi256_ps(lanes), 4);
        _mm256_maskstore_ps(p + j, lanes, probs);
    }
}
#else
static void probs_row_bf16(const float *raw, int64_t cols, int64_t visible, float scale, float shift,
                           float row_max, const float *table, float *p) {
    (void)row_max;
    for (int64_t j = 0; j < cols; j++) {
        float s = j < visible ? round_bf16(raw[j] * scale) : -__builtin_inff();
        p[j] = table[bits_of(round_bf16(s - shift)) >> 16];
    }
}
#endif
#endif

/* P = table[index(round(S - shift))] of one row. */
static void probs_row(const float *raw, int64_t cols, int64_t visible, float scale, float shift, float row_max,
                      int score, const float *table, float *p) {
    if (score == BF16) {
        probs_row_bf16(raw, cols, visible, scale, shift, row_max, table, p);
        return;
    }
    for (int64_t j = 0; j < cols; j++) {
        float s = j < visible ? round_fp16(raw[j] * scale) : -__builtin_inff();
        p[j] = table[index_of(round_fp16(s - shift), score)];
    }
}

static inline float finite_or_zero(float m) { return m == -__builtin_inff() ? 0.0f : m; }

/* FlashAttention-2 step up to P: the new running max (rounded to stats), the exp argument of the
   rescale factor (row_max - shift) and P = exp(round(S - shift)) rounded as the table says. */
void fa2_probs(const float *raw, int64_t rows, int64_t period, int64_t cols, int64_t ld, float scale, int score,
               int stats, int prob, int causal, int64_t q0, int64_t k0, const float *table, const float *row_max,
               float *new_max, float *alpha_arg, float *probs, float *matmul_probs) {
    for (int64_t i = 0, r = 0; i < rows; i++, r = r + 1 == period ? 0 : r + 1) {  /* r = i % period */
        int64_t visible = visible_keys(causal, q0 + r, k0, cols);
        float block_max = row_score_max(raw + i * ld, visible, scale, score);
        float m = row_max[i];
        float top = (m != m || block_max != block_max) ? __builtin_nanf("") : (block_max > m ? block_max : m);
        top = round_one(top, stats);
        float shift = finite_or_zero(top);
        new_max[i] = top;
        alpha_arg[i] = m - shift;
        probs_row(raw + i * ld, cols, visible, scale, shift, block_max, score, table, probs + i * cols);
        if (matmul_probs) {  /* P converted to the prob format for P.V (when it differs from stats) */
            float *mp = matmul_probs + i * cols;
            memcpy(mp, probs + i * cols, cols * sizeof(float));
            round_row(mp, cols, prob);
        }
    }
}

/* FlashAttention-1 step up to P: the new running max (the larger of the running max and the
   block's own max rounded to stats), the two exp arguments of the rescale factors (row_max - shift, block_max - shift) and
   P = exp(round(S - block_max)). */
void fa1_probs(const float *raw, int64_t rows, int64_t period, int64_t cols, int64_t ld, float scale, int score,
               int stats, int causal, int64_t q0, int64_t k0, const float *table, const float *row_max,
               float *new_max, float *alpha_args, float *probs) {
    for (int64_t i = 0, r = 0; i < rows; i++, r = r + 1 == period ? 0 : r + 1) {  /* r = i % period */
        int64_t visible = visible_keys(causal, q0 + r, k0, cols);
        float block_max = round_one(row_score_max(raw + i * ld, visible, scale, score), stats);
        float m = row_max[i];
        float top = (m != m || block_max != block_max) ? __builtin_nanf("") : (block_max > m ? block_max : m);
        float shift = finite_or_zero(top);
        new_max[i] = top;
        alpha_args[2 * i] = m - shift;
        alpha_args[2 * i + 1] = block_max - shift;
        probs_row(raw + i * ld, cols, visible, scale, finite_or_zero(block_max), block_max, score, table,
                  probs + i * cols);
    }
}

static inline int row_active(int causal, int64_t query, int64_t block_r, int64_t k0) {
    return !causal || ((query / block_r + 1) * block_r - 1) >= k0;
}

/* FlashAttention-2 merge of one block into the running state (row_max, row_sum, out: updated in
   place for active rows). alpha is ATen's exp(alpha_arg), rounded here to rescale; block_sum ATen's row sum of P,
   pv ATen's P @ V (rows x dim, row stride dim). */
void fa2_merge(int64_t rows, int64_t period, int64_t dim, int stats, int accum, int rescale, int causal, int64_t q0, int64_t block_r,
               int64_t k0, const float *new_max, const float *alpha, const float *block_sum, const float *pv,
               float *row_max, float *row_sum, float *out) {
    for (int64_t i = 0, r = 0; i < rows; i++, r = r + 1 == period ? 0 : r + 1) {  /* r = i % period */
        if (!row_active(causal, q0 + r, block_r, k0)) continue;
        float a = round_one(alpha[i], rescale);
        row_sum[i] = round_one(round_one(a * row_sum[i], stats) + block_sum[i], stats);
        row_max[i] = new_max[i];
        float *o = out + i * dim;
        const float *v = pv + i * dim;
        if (accum == BF16) {
            fa2_merge_row_bf16(a, v, o, dim);
        } else if (accum == FP16) {
            for (int64_t j = 0; j < dim; j++) o[j] = round_fp16(round_fp16(a * o[j]) + round_fp16(v[j]));
        } else {
            for (int64_t j = 0; j < dim; j++) o[j] = a * o[j] + v[j];
        }
    }
}

/* FlashAttention-1 merge: O stays a normalised average. alphas holds ATen's exp of the two
   arguments per row (alpha_old, alpha_block), rounded here to rescale. */
void fa1_merge(int64_t rows, int64_t period, int64_t dim, int stats, int accum, int rescale, int causal, int64_t q0, int64_t block_r,
               int64_t k0, const float *new_max, const float *alphas, const float *block_sum, const float *pv,
               float *row_max, float *row_sum, float *out) {
    for (int64_t i = 0, r = 0; i < rows; i++, r = r + 1 == period ? 0 : r + 1) {  /* r = i % period */
        if (!row_active(causal, q0 + r, block_r, k0)) continue;
        float alpha_old = round_one(alphas[2 * i], rescale), alpha_block = round_one(alphas[2 * i + 1], rescale);
        float old_sum = round_one(alpha_old * row_sum[i], stats);
        float new_sum = round_one(old_sum + round_one(alpha_block * round_one(block_sum[i], stats), stats), stats);
        float divisor = new_sum == 0.0f ? 1.0f : new_sum;  /* rows with no visible key keep O = 0 */
        row_sum[i] = new_sum;
        row_max[i] = new_max[i];
        float *o = out + i * dim;
        const float *v = pv + i * dim;
        /* O = round(round(round(l_old O) + round(alpha_block round(PV))) / l_new), each step in accum */
        if (accum == BF16) {
            fa1_merge_row_bf16(old_sum, alpha_block, divisor, v, o, dim);
        } else if (accum == FP16) {
            for (int64_t j = 0; j < dim; j++) {
                float added = round_fp16(alpha_block * round_fp16(v[j]));
                o[j] = round_fp16(round_fp16(round_fp16(old_sum * o[j]) + added) / divisor);
            }
        } else {
            for (int64_t j = 0; j < dim; j++) o[j] = (old_sum * o[j] + alpha_block * v[j]) / divisor;
        }
    }
}

/* ---- PyTorch's CPU flash kernel (numerics=cpu_sdpa; numdev.attention.cpu_kernel) ----
   The same arithmetic as the ATen path of numdev.attention.flash_emulated with exp=fexp_u20,
   row_sum=lanes and matmul=blas, fused: one query tile at a time through every key/value block,
   calling the GEMM the kernel calls (its address comes from Python): MKL's cblas GEMM, or, where
   the kernel packs (AMX), cpublas::brgemm on K^T and V packed to VNNI pairs as the kernel packs
   them. Every multiply-add that ATen's fexp_u20 fuses is an explicit fmaf; nothing else is fused
   (-ffp-contract=off). */

#include <math.h>
#include <stdlib.h>

/* OpenMP's runtime (libgomp.so.1: the one torch has loaded, same soname), declared here so the
   build needs no omp.h */
int omp_get_num_threads(void);
int omp_get_thread_num(void);

/* expf from the C library: the kernel's std::exp (also used by the ATen path, element by element). */
void libm_expf(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = expf(x[i]);
}

static inline float fexp_u20_one(float x) {
    const float c0 = 0.00010703434948458272f, c1 = 0.30354260500649682f;
    const float c2 = (float)-0.22433836478672356, c3 = (float)-0.079204240219773236;
    const float log2e = float_of(0x3fb8aa3bu), a = 8388608.0f, b = 8388608.0f * 127.0f;
    const float ln_min = float_of(0xc2aeac50u), ln_max = float_of(0x42b17218u);
    float src = x * log2e;
    float frac = src - floorf(src);
    float r = fmaf(frac, c3, c2);
    r = fmaf(frac, r, c1);
    r = fmaf(frac, r, c0);
    float t = fmaf(a, src - r, b);
    /* the truncation to int32 of a NaN (or of anything out of range, which the masks replace) is 0x80000000 */
    uint32_t i = (t != t || !(t > -2147483648.0f && t < 2147483648.0f)) ? 0x80000000u : (uint32_t)(int32_t)t;
    i = x < ln_min ? 0u : i;
    i = x > ln_max ? 0x7F800000u : i;
    return float_of(i);
}

/* fexp_u20 of n values (tests hold it to numdev.attention.cpu_kernel.fexp_u20 bit for bit). */
void fexp_u20_array(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = fexp_u20_one(x[i]);
}

static inline uint16_t to_half_bits(float x, int code) {
    if (code == BF16) return (uint16_t)(bits_of(round_bf16(x)) >> 16);
    _Float16 h = (_Float16)x;
    uint16_t b;
    memcpy(&b, &h, 2);
    return b;
}

/* P (float32) to the 16-bit type `code`, rounded to nearest even; one loop per type so each vectorises. */
static void to_half_row(const float *x, uint16_t *out, int64_t n, int code) {
    if (code == BF16) {
        for (int64_t j = 0; j < n; j++) out[j] = (uint16_t)(bits_of(round_bf16(x[j])) >> 16);
    } else {
        for (int64_t j = 0; j < n; j++) {
            _Float16 h = (_Float16)x[j];
            memcpy(out + j, &h, 2);
        }
    }
}

typedef void (*gemm_fn)(int layout, int transa, int transb, int m, int n, int k, float alpha, const void *a,
                        int lda, const void *b, int ldb, float beta, float *c, int ldc);
enum { COL_MAJOR = 102, NO_TRANS = 111, TRANS = 112 };
/* at::native::cpublas::brgemm for 16-bit inputs: C (m x n, row-major, ldc) = A (m x k, lda) B (+ C
   if add_c), B (k x n) packed to VNNI pairs (is_vnni); a C++ function whose arguments pass as C's */
typedef void (*brgemm_fn)(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc, _Bool add_c,
                          const uint16_t *a, const uint16_t *b, float *c, _Bool is_vnni);
typedef void (*release_fn)(_Bool is_vnni);  /* cpublas::brgemm_release: gives the thread's AMX tiles back */

/* ATen's pack_vnni2 of the (rows x cols) matrix x[i * row_stride + j * col_stride]: [rows, cols] ->
   [ceil(rows/2), cols, 2], an odd row count padded with a row of zeros */
static void pack_vnni2(const uint16_t *x, int64_t row_stride, int64_t col_stride, int64_t rows, int64_t cols,
                       uint16_t *dst) {
    for (int64_t i = 0; i < rows + rows % 2; i++)
        for (int64_t j = 0; j < cols; j++)
            dst[(i / 2) * cols * 2 + j * 2 + i % 2] = i < rows ? x[i * row_stride + j * col_stride] : 0;
}

/* The kernel's packed K^T and V (need_pack): per head, K^T of each key block at n * even(d), V of
   block b at b * even(block_c) * d, as FlashAttentionKernel.cpp lays them out. */
typedef struct {
    uint16_t *k, *v;
    int64_t k_head, v_head, depth;  /* elements per head of each; d rounded up to even */
} packed_kv;

static int64_t even(int64_t n) { return n + n % 2; }

static int pack_kv(packed_kv *pk, const uint16_t *k, const uint16_t *v, int64_t heads, int64_t n_k, int64_t d,
                   int64_t block_c) {
    pk->depth = even(d);
    pk->k_head = pk->depth * n_k;
    pk->v_head = ((n_k - 1) / block_c * even(block_c) + even((n_k - 1) % block_c + 1)) * d;
    pk->k = malloc(sizeof(uint16_t) * (size_t)(heads * pk->k_head));
    pk->v = malloc(sizeof(uint16_t) * (size_t)(heads * pk->v_head));
    if (!pk->k || !pk->v) { free(pk->k); free(pk->v); return 0; }
    for (int64_t h = 0; h < heads; h++) {
        for (int64_t n = 0; n < n_k; n += block_c) {
            int64_t cols = n_k - n < block_c ? n_k - n : block_c;
            const uint16_t *kb = k + (h * n_k + n) * d, *vb = v + (h * n_k + n) * d;
            pack_vnni2(kb, 1, d, d, cols, pk->k + h * pk->k_head + n * pk->depth);  /* K^T: d x cols */
            pack_vnni2(vb, d, 1, cols, d, pk->v + h * pk->v_head + n / block_c * even(block_c) * d);
        }
    }
    return 1;
}

static inline float nan_max(float a, float b) { return (a != a || b != b) ? __builtin_nanf("") : (a > b ? a : b); }

/* Query tiles [first, last) of (batch*heads*tiles) of q, k, v (contiguous (B, H, n, d), 16-bit
   `code`), writing out (same layout and type). block_r query rows per tile, block_c keys per block,
   `width` float lanes. */
static void cpu_flash_tiles(const uint16_t *q, const uint16_t *k, const uint16_t *v, uint16_t *out, int64_t first,
                       int64_t last, int64_t n_q, int64_t n_k, int64_t d, float scale, int causal, int64_t block_r,
                       int64_t block_c, int64_t width, int code, void *gemm_address, void *brgemm_address,
                       void *release_address, const packed_kv *pk) {
    gemm_fn gemm = (gemm_fn)gemm_address;
    brgemm_fn brgemm = (brgemm_fn)brgemm_address;  /* non-NULL: the packed path (pk holds K^T and V) */
    int64_t tiles = (n_q + block_r - 1) / block_r;
    float *qk = malloc(sizeof(float) * (size_t)(block_r * block_c));
    float *dst = malloc(sizeof(float) * (size_t)(block_r * d));
    float *row_max = malloc(sizeof(float) * (size_t)block_r), *row_sum = malloc(sizeof(float) * (size_t)block_r);
    uint16_t *p = malloc(sizeof(uint16_t) * (size_t)(block_r * (block_c + 1)));
    uint16_t *q_even = brgemm && d % 2 ? malloc(sizeof(uint16_t) * (size_t)(block_r * (d + 1))) : NULL;
    float acc[64];
    for (int64_t item = first; item < last; item++) {
        int64_t head = item / tiles, m = (item % tiles) * block_r;
        int64_t rows = n_q - m < block_r ? n_q - m : block_r;
        const uint16_t *qh = q + (head * n_q + m) * d, *kh = k + head * n_k * d, *vh = v + head * n_k * d;
        for (int64_t r = 0; r < rows; r++) { row_max[r] = -__builtin_inff(); row_sum[r] = 0.0f; }
        int64_t keys = causal ? (m + rows < n_k ? m + rows : n_k) : n_k;
        if (q_even) {  /* brgemm with an odd d: Q padded with a zero column, as the kernel pads it */
            for (int64_t r = 0; r < rows; r++) {
                memcpy(q_even + r * (d + 1), qh + r * d, sizeof(uint16_t) * (size_t)d);
                q_even[r * (d + 1) + d] = 0;
            }
        }
        for (int64_t n = 0; n < keys; n += block_c) {
            int64_t cols = n_k - n < block_c ? n_k - n : block_c;
            int64_t p_cols = brgemm ? even(cols) : cols;  /* P's row length: brgemm takes an even K */
            if (brgemm)
                brgemm(rows, cols, pk->depth, pk->depth, cols, cols, 0, q_even ? q_even : qh,
                       pk->k + head * pk->k_head + n * pk->depth, qk, 1);
            else
                gemm(COL_MAJOR, TRANS, NO_TRANS, (int)cols, (int)rows, (int)d, 1.0f, kh + n * d, (int)d, qh, (int)d,
                     0.0f, qk, (int)cols);
            int64_t vector = width * (cols / width);
            for (int64_t r = 0; r < rows; r++) {
                float *s = qk + r * cols;
                uint16_t *pr = p + r * p_cols;
                if (p_cols > cols) pr[cols] = 0;  /* the padding column */
                int64_t visible = causal ? (m + r - n + 1 < cols ? m + r - n + 1 : cols) : cols;
                if (visible < 0) visible = 0;
                float block_max = -__builtin_inff();
                int nan = 0;
#pragma omp simd reduction(max : block_max) reduction(| : nan)
                for (int64_t j = 0; j < cols; j++) {
                    float x = j < visible ? s[j] * scale : -__builtin_inff();
                    s[j] = x;
                    nan |= x != x;
                    block_max = x > block_max ? x : block_max;
                }
                if (nan) block_max = __builtin_nanf("");  /* a NaN score makes the max NaN, as ATen's amax */
                float top = nan_max(row_max[r], block_max);
                if (top == -__builtin_inff()) {  /* no visible key yet: P = 0, the state stays */
                    memset(pr, 0, sizeof(uint16_t) * (size_t)cols);
                    continue;
                }
                /* 2*width lane accumulators (a pair of vectors) over chunks of 2*width columns, one
                   chunk of width columns into the first vector, a butterfly over the 2*width lanes */
                for (int64_t l = 0; l < 2 * width; l++) acc[l] = 0.0f;
                int64_t pairs = 2 * width * (cols / (2 * width));
                if (width == 16) {  /* the AVX-512 build: constant trip counts vectorise the lanes */
                    for (int64_t j = 0; j < pairs; j += 32) {
                        for (int64_t l = 0; l < 32; l++) {
                            float e = fexp_u20_one(s[j + l] - top);
                            acc[l] += e;
                            s[j + l] = e;
                        }
                    }
                } else {
                    for (int64_t j = 0; j < pairs; j += 2 * width) {
                        for (int64_t l = 0; l < 2 * width; l++) {
                            float e = fexp_u20_one(s[j + l] - top);
                            acc[l] += e;
                            s[j + l] = e;
                        }
                    }
                }
                for (int64_t l = 0; l < vector - pairs; l++) {
                    float e = fexp_u20_one(s[pairs + l] - top);
                    acc[l] += e;
                    s[pairs + l] = e;
                }
                for (int64_t half = width; half >= 1; half /= 2)
                    for (int64_t l = 0; l < half; l++) acc[l] = acc[l] + acc[l + half];
                float total = acc[0];
                for (int64_t j = vector; j < cols; j++) {
                    float e = expf(s[j] - top);
                    total += e;
                    s[j] = e;
                }
                to_half_row(s, pr, cols, code);
                float alpha = expf(row_max[r] - top);
                row_sum[r] = total + alpha * row_sum[r];
                row_max[r] = top;
                if (n > 0) {
                    float *o = dst + r * d;
                    for (int64_t j = 0; j < d; j++) o[j] = o[j] * alpha;
                }
            }
            if (brgemm)
                brgemm(rows, d, p_cols, p_cols, d, d, n > 0, p, pk->v + head * pk->v_head + n / block_c * even(block_c) * d,
                       dst, 1);
            else
                gemm(COL_MAJOR, NO_TRANS, NO_TRANS, (int)d, (int)rows, (int)cols, 1.0f, vh + n * d, (int)d, p, (int)cols,
                     n == 0 ? 0.0f : 1.0f, dst, (int)d);
        }
        for (int64_t r = 0; r < rows; r++) {
            float inverse = 1.0f / (row_sum[r] == 0.0f ? 1.0f : row_sum[r]);
            uint16_t *o = out + (head * n_q + m + r) * d;
            for (int64_t j = 0; j < d; j++) o[j] = to_half_bits(dst[r * d + j] * inverse, code);
        }
    }
    if (brgemm && release_address) ((release_fn)release_address)(1);  /* as the kernel does after its tiles */
    free(qk); free(dst); free(row_max); free(row_sum); free(p); free(q_even);
}

/* Every query tile, in an OpenMP parallel region of `threads` threads (the runtime torch loaded,
   libgomp.so.1): the kernel calls its GEMMs from inside such a region, where MKL runs each on the
   calling thread, and the bits of MKL's fp16 GEMM depend on that. Tiles are independent, so how
   they are split changes nothing else. brgemm_address non-NULL: the packed path, K and V of the
   `heads` (batch x heads) packed first; returns 0 if their buffers cannot be allocated. */
int cpu_flash_forward(const uint16_t *q, const uint16_t *k, const uint16_t *v, uint16_t *out, int64_t tiles,
                      int64_t n_q, int64_t n_k, int64_t d, float scale, int causal, int64_t block_r,
                      int64_t block_c, int64_t width, int code, void *gemm_address, void *brgemm_address,
                      void *release_address, int64_t heads, int threads) {
    packed_kv pk = {0};
    if (brgemm_address && !pack_kv(&pk, k, v, heads, n_k, d, block_c)) return 0;
    if (threads <= 1 || tiles <= 1) {  /* at::parallel_for runs inline then, outside any parallel region */
        cpu_flash_tiles(q, k, v, out, 0, tiles, n_q, n_k, d, scale, causal, block_r, block_c, width, code, gemm_address,
                        brgemm_address, release_address, &pk);
    } else {
#pragma omp parallel num_threads(threads)
        {
            int64_t team = omp_get_num_threads(), me = omp_get_thread_num();
            int64_t first = tiles * me / team, last = tiles * (me + 1) / team;
            cpu_flash_tiles(q, k, v, out, first, last, n_q, n_k, d, scale, causal, block_r, block_c, width, code,
                            gemm_address, brgemm_address, release_address, &pk);
        }
    }
    free(pk.k); free(pk.v);
    return 1;
}

/* One GEMM call from inside a parallel region of `threads` threads (thread 0 calls it), as the
   kernel calls it (threads <= 1: directly, as when the kernel's loop runs inline): for
   numdev.attention.cpu_kernel's ATen path. */
void blas_in_region(void *gemm_address, int transa, int transb, int m, int n, int k, const void *a, int lda,
                    const void *b, int ldb, float beta, float *c, int ldc, int threads) {
    gemm_fn gemm = (gemm_fn)gemm_address;
    if (threads <= 1) {  /* as the kernel calls it when its loop runs inline */
        gemm(COL_MAJOR, transa, transb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        if (omp_get_thread_num() == 0) gemm(COL_MAJOR, transa, transb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
    }
}
