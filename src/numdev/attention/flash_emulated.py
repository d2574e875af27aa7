"""A numeric re-implementation of the FlashAttention forward pass, every stage's format explicit.

One Python loop over key/value blocks for each chunk of query rows; all query tiles of a chunk are
processed at once (rows are independent, so this is numerically the same as looping over them
too). Chunks are sized so a chunk's score block stays in cache (`query_chunk`); the n_q x n_k
score matrix never exists: the largest temporary is (batch, heads, chunk rows, B_c).

Variants:
  fa2  deferred normalisation (FlashAttention-2): O accumulates unnormalised, divided by l once.
  fa1  normalise at every block (FlashAttention-1, Algorithm 1): O is always a normalised average.
Every write to the running state (m, l, O) is rounded to its stage's format.

With causal masking a tile that lies wholly above the diagonal is skipped, as kernels do; B_r
therefore matters for fa1 with causal masking (partly masked tiles still rescale O), and for
nothing else.

Each key/value block is three steps: the elementwise work up to P (`*_probs`), the two
order-sensitive reductions in ATen (the row sum of P and the P.V matmul), and the elementwise
merge into the running state (`*_merge`). Three implementations run them, all bitwise identical
(tests/test_flash_speed.py holds each, chunked or not, to a frozen copy of the implementation
before the speed work):
  native    (default, `native=True`) both elementwise steps in fused C kernels
            (numdev.attention.native, kernels/flash_emulator.c), for 16-bit score formats
  compiled  (`compile=True`) both through torch.compile (numdev.attention.compiled)
  eager     ATen ops; always under autograd, and for every format the others do not take
The matmuls, the row sum and exp of float32 arguments stay in ATen in all three. `last_path`
says which one ran the latest call.

FlashAttention-2's CUDA forward (`numerics=fa2_cuda`: exp=exp2 or exp2_ffma, row_sum=quad; the
tiles and `kv_splits` as cuda_kernel.schedule gives them for a GPU) runs in numdev.attention.cuda_kernel
(path "cuda_model"), forward only.

PyTorch's CPU flash kernel (`numerics=cpu_sdpa`, bf16/fp16: exp=fexp_u20, row_sum=lanes,
matmul=blas; numdev.attention.cpu_kernel) runs in the ATen path with those three choices, and,
fused, in one C function per query tile (`cpu_flash_forward`, path "native") that calls the
kernel's GEMM: MKL's cblas GEMM, or where the kernel packs (AMX CPUs, `cpu_kernel.kernel_packs`)
cpublas::brgemm; `last_gemm` and describe()'s `matmul.entry` say which the latest call used.
tests/test_attention.py holds both paths to the same bits and to the kernel.
"""

from __future__ import annotations

import functools
import warnings

import torch

from numdev.attention import compiled, cpu_kernel, cuda_kernel, native
from numdev.attention.checks import round_masked, same_bits
from numdev.attention.registry import AttentionBackend, blocks_of, register
from numdev.attention.tiles import resolve_tiles
from numdev.numerics.formats import FloatFormat, round_to
from numdev.numerics.stages import StageFormats, prepared_inputs, stage_formats, working_input

VARIANTS = ("fa2", "fa1")
_NEG_INF = float("-inf")
_CHUNK_ELEMENTS = 128 * 1024  # float32 elements of one per-chunk score block: 512 KiB
_MIN_CHUNK_ROWS = 16


@register("flash_emulated")
class FlashEmulated(AttentionBackend):
    def __init__(
        self,
        formats: StageFormats | None = None,
        block_r: int | None = None,
        block_c: int | None = None,
        sram: int | None = None,
        variant: str = "fa2",
        compile: bool = False,
        query_chunk: int | None = None,
        native: bool = True,
        tile_rule: str | None = None,
        kv_blocks: int | None = None,
        tie_fix: bool = False,
        kv_splits: int = 1,
    ):
        if variant not in VARIANTS:
            raise ValueError(f"unknown flash variant {variant!r}: use one of {', '.join(VARIANTS)}")
        self.formats = formats if formats is not None else stage_formats("fa2", "fp32")
        if self.formats.exp == "fexp_u20" and variant != "fa2":
            raise ValueError("numerics.exp=fexp_u20 models PyTorch's CPU flash kernel, an FA2 loop: use variant=fa2 "
                             "(or numerics.exp=aten)")
        if self.formats.exp == "fexp_u20" or self.formats.matmul == "blas":
            cpu_kernel.check_torch_version()
        self.block_r, self.block_c, self.sram = block_r, block_c, sram
        self.variant = variant
        for name, value in (("compile", compile), ("native", native)):
            if not isinstance(value, bool):  # bool("false") is True: refuse anything but a bool
                raise ValueError(f"attention.{name}={value!r} must be true or false")
        self.compile, self.native = compile, native
        if not isinstance(tie_fix, bool):
            raise ValueError(f"attention.tie_fix={tie_fix!r} must be true or false")
        if tie_fix and (variant != "fa2" or self.formats.exp != "aten" or self.formats.matmul != "aten"):
            raise ValueError("attention.tie_fix=true (Qiu & Yao's shifted maximum) is implemented for variant=fa2 with "
                             "numerics.exp=aten and numerics.matmul=aten: set those")
        if isinstance(kv_splits, bool) or not isinstance(kv_splits, int) or not 1 <= kv_splits <= cuda_kernel.MAX_SPLITS:
            raise ValueError(f"attention.kv_splits={kv_splits!r} must be an integer from 1 (none) to {cuda_kernel.MAX_SPLITS} "
                             "(FA2's split-KV count; flash_api.cpp allows no more)")
        if kv_splits > 1 and not self.formats.cuda_model:
            raise ValueError(f"attention.kv_splits={kv_splits} models FA2's split-KV kernel: it needs the FA2 CUDA model "
                             f"(numerics preset fa2_cuda in bf16 or fp16; formats preset {self.formats.preset} in "
                             f"{self.formats.input.name} is not it), or attention.kv_splits=1")
        if self.formats.cuda_model and variant != "fa2":
            raise ValueError("the FA2 CUDA model (formats preset fa2_cuda: exp2 or exp2_ffma) is an FA2 loop: "
                             "use attention.variant=fa2")
        self.kv_splits = kv_splits
        self.tie_fix = tie_fix  # Qiu & Yao (arXiv:2510.04212): no P exactly 1 when scores tie the row max
        if query_chunk is not None and (
            not isinstance(query_chunk, int) or isinstance(query_chunk, bool) or query_chunk < _MIN_CHUNK_ROWS
        ):
            raise ValueError(f"query_chunk={query_chunk!r} must be an integer >= {_MIN_CHUNK_ROWS} (or null: automatic)")
        self.query_chunk = None if query_chunk is None else int(query_chunk)
        self.tile_rule = tile_rule  # numdev.attention.tiles: explicit, sram, cpu_sdpa, kv_blocks, default
        self.kv_blocks = kv_blocks  # the number of key/value blocks the kv_blocks rule pins
        resolve_tiles(1, 1, 1, block_r, block_c, sram, tile_rule, kv_blocks)  # reject bad tiles at construction
        self.last_tiles = None  # the tiles of the latest call, for result records
        self.last_path = None  # which implementation ran the latest call: native, compiled or eager
        self.last_gemm = None  # matmul=blas: the GEMM entry the latest call used (cpu_kernel.GEMM_ENTRIES)
        self.last_lse = None  # the FA2 CUDA model: the latest call's log-sum-exp as the kernel writes it
        self._gemm_override = None  # the consistency check's choice of entry (_kernel_model_checked)

    def forward_only(self, key: str = "attention") -> str | None:
        f = self.formats
        if f.cuda_model:
            return ("the FA2 CUDA model (formats preset fa2_cuda) is forward only: train through the emulator with "
                    f"the fa2 preset ({key}.formats.preset=fa2)")
        if f.exp != "aten" or f.matmul != "aten":
            return (f"formats preset {f.preset}'s numerics.exp={f.exp} and numerics.matmul={f.matmul} (PyTorch's CPU flash "
                    "kernel, forward only) have no gradient: train through the emulator with the fa2 preset "
                    f"({key}.formats.preset=fa2), or numerics exp=aten matmul=aten")
        return None

    def tiles(self, n_q: int, n_k: int, head_dim: int):
        return resolve_tiles(
            n_q,
            n_k,
            head_dim,
            self.block_r,
            self.block_c,
            self.sram,
            self.tile_rule,
            self.kv_blocks,
        )

    def kv_tiling(self, n_queries, n_keys, head_dim, device="cpu"):
        tiles = self.tiles(n_queries, n_keys, head_dim)
        return blocks_of(n_keys, tiles.block_c, f"numdev.attention.tiles, rule {tiles.source}: B_r x B_c = "
                                                f"{tiles.block_r} x {tiles.block_c}{' (clamped to the length)' if tiles.clamped else ''}")

    def forward(self, q, k, v, scale, causal):
        f = self.formats
        out_dtype = q.dtype
        q, k, v = prepared_inputs(q, k, v, f)
        n_q, n_k = q.shape[2], k.shape[2]
        tiles = self.last_tiles = self.tiles(n_q, n_k, q.shape[-1])
        scale = torch.tensor(scale, dtype=q.dtype)  # rounded once, as ATen rounds a Python scalar
        steps = _STEPS[self.variant]
        if self.tie_fix:  # the ATen path only: the C kernels and compiled steps know no shifted maximum
            steps = (functools.partial(_fa2_probs, tie_fix=True), _fa2_merge)
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        reason = self.forward_only() if grad else None
        if reason:
            raise ValueError(reason)
        if f.cuda_model:
            if causal and n_q != n_k:
                raise ValueError(f"the FA2 CUDA model's causal mask is FA2's, aligned bottom-right; numdev's is aligned "
                                 f"top-left, and the two differ when the query and key lengths do ({n_q} and {n_k}): "
                                 "give them one length, or use numerics preset fa2")
            self.last_path = "cuda_model"
            with torch.no_grad():
                out, self.last_lse = cuda_kernel.forward(q, k, v, float(scale), causal, tiles.block_r, tiles.block_c,
                                                         self.kv_splits, f.exp, f.matmul, f.input.torch_dtype)
            return out.to(out_dtype)
        attend, self.last_path = self._attend, "eager"
        plain = f.exp == f.row_sum == f.matmul == "aten"  # the other two paths know only ATen's arithmetic
        entry = self.last_gemm = self._gemm_entry(q, n_k, tiles, causal) if f.matmul == "blas" else None
        if self.native and not grad and not self.tie_fix and _kernel_model_fits(f, self.variant, entry):
            self.last_path = "native"
            return _cpu_flash_native(q, k, v, float(scale), causal, tiles, f, entry).to(out_dtype)
        if plain and not self.tie_fix and self.native and not grad and 0 < float(scale) < float("inf") and _native_fits(f, self.variant):
            attend, self.last_path = self._attend_native, "native"
        elif plain and not self.tie_fix and self.compile and not grad and compiled.supports(f):
            steps = tuple(compiled.compiled(step, f) for step in steps)
            self.last_path = "compiled"
        chunk_rows = self._chunk_rows(tiles, v.shape[-1])
        if f.matmul == "blas":  # the GEMMs run per query tile, as in the kernel: chunks hold whole tiles
            size = -(-chunk_rows // tiles.block_r) * tiles.block_r
            row_chunks = [slice(a, min(a + size, n_q)) for a in range(0, n_q, size)]
        else:
            row_chunks = _row_chunks(n_q, chunk_rows)
        extra = {"entry": entry} if entry is not None else {}
        chunks = [attend(q[:, :, rows], k, v, scale, causal, rows, tiles, n_q, steps, **extra) for rows in row_chunks]
        return (chunks[0] if len(chunks) == 1 else torch.cat(chunks, dim=2)).to(out_dtype)

    def _gemm_entry(self, q, n_k: int, tiles, causal: bool) -> str:
        """The GEMM PyTorch's CPU flash kernel calls for this call (cpu_kernel.kernel_packs, with the
        model's query tile as the kernel's qSplitSize): brgemm where it packs, else cblas."""
        if self._gemm_override is not None:
            return self._gemm_override
        batch, heads, n_q, dim = q.shape
        packs = cpu_kernel.kernel_packs(self.formats.input.torch_dtype, batch, heads, n_q, n_k, dim, tiles.block_r,
                                        causal)
        return cpu_kernel.gemm_entry(self.formats.input.torch_dtype, packs)

    def _chunk_rows(self, tiles, dim_v: int) -> int:
        if self.query_chunk is not None:
            return self.query_chunk
        # Keep one chunk's score block and accumulator (float32) within ~512 KiB each, so every
        # per-block pass runs from cache instead of memory (measured best of 1k/2k/4k rows at d=64).
        return max(_MIN_CHUNK_ROWS, _CHUNK_ELEMENTS // max(tiles.block_c, dim_v))

    def _attend(self, q, k, v, scale, causal, rows: slice, tiles, n_q: int, steps, entry: str = "cblas") -> torch.Tensor:
        """The normalised output of the query rows `rows` (q holds just those rows); entry: the
        kernel's GEMM (matmul=blas only)."""
        f = self.formats
        probs_step, merge_step = steps
        n_rows = q.shape[2]
        row_max, row_sum, out = _initial_state(q, v)
        query_index = torch.arange(rows.start, rows.stop, device=q.device)[:, None]  # (rows, 1)
        # Last query row of each row's tile: a tile is skipped when all its keys lie beyond it.
        tile_last_row = (query_index // tiles.block_r + 1) * tiles.block_r - 1
        last_needed_key = _last_needed_key(rows, tiles, n_q)
        blas = f.matmul == "blas"
        if blas:  # the kernel's GEMMs take the 16-bit inputs (exact: q, k, v hold input-format values)
            tile_last_row = torch.minimum(tile_last_row, torch.tensor(n_q - 1))  # the kernel's num_keys
            q16, k16, v16 = (t.to(f.input.torch_dtype) for t in (q, k, v))
            # the kernel's tile loop runs in parallel only with more than one tile and thread
            parallel = q.shape[0] * q.shape[1] * -(-n_q // tiles.block_r) > 1 and torch.get_num_threads() > 1
        width = cpu_kernel.model_lanes()
        for start in range(0, k.shape[2], tiles.block_c):
            stop = min(start + tiles.block_c, k.shape[2])
            if causal and start > last_needed_key:
                break  # every remaining tile lies above the diagonal
            masked = active = None
            if causal:
                masked = torch.arange(start, stop, device=q.device)[None, :] > query_index  # (rows, Bc)
                active = (tile_last_row >= start).view(1, 1, n_rows, 1)
            if blas:
                raw_scores = cpu_kernel.scores(q16, k16[:, :, start:stop], tiles.block_r, parallel, entry)
            else:
                raw_scores = q @ k[:, :, start:stop].transpose(-1, -2)  # (B, H, rows, Bc)
            block = probs_step(raw_scores, scale, row_max, masked, f=f)
            # The two order-sensitive reductions stay in ATen (or in the kernel's order), whichever path runs the rest.
            if f.row_sum == "lanes":
                block_sum = cpu_kernel.lane_sum(block["probs"], width)
            else:
                block_sum = block["probs"].sum(dim=-1, keepdim=True)
            if blas:
                row_max, row_sum, out = _fa2_merge_blas(row_max, row_sum, out, block, block_sum, v16[:, :, start:stop],
                                                        active, start, tiles.block_r, parallel, entry, f=f)
                continue
            raw_pv = block["matmul_probs"] @ v[:, :, start:stop]
            row_max, row_sum, out = merge_step(row_max, row_sum, out, block, block_sum, raw_pv, active, f=f)
        return self._finish(out, row_sum)

    def _attend_native(self, q, k, v, scale, causal, rows: slice, tiles, n_q: int, steps=None) -> torch.Tensor:
        """`_attend` with each block's elementwise work in the C kernels (numdev.attention.native):
        the same state, the same ATen matmuls, row sums and float32 exps, the same bits.

        Buffers live for the whole chunk and the kernels get their addresses once, so a block
        costs its two matmuls, its row sum, one small exp and two C calls."""
        f = self.formats
        kernels = native.library()
        fa2 = self.variant == "fa2"
        batch, heads, n_rows, _ = q.shape
        row_max, row_sum, out = _initial_state(q, v)
        new_max = torch.empty_like(row_max)
        alpha_args = torch.empty(batch, heads, n_rows, 1 if fa2 else 2, dtype=q.dtype)
        alphas = torch.empty_like(alpha_args)
        block_sum = torch.empty_like(row_max)
        raw_pv = torch.empty_like(out)
        full = _NativeBlock(q, tiles.block_c, separate=fa2 and f.prob != f.stats)
        table = native.exp_table(f.score, f.stats if fa2 else f.prob)
        p = native.pointer
        codes = {stage: native.code(getattr(f, stage)) for stage in ("score", "stats", "prob", "rescale", "accum")}
        # Arguments of every call, in the C signatures' order (kernels/flash_emulator.c).
        heads_rows = (batch * heads * n_rows, n_rows)  # all rows, rows of one (batch, head)
        probs_kernel = kernels.fa2_probs if fa2 else kernels.fa1_probs
        probs_formats = (codes["score"], codes["stats"], *((codes["prob"],) if fa2 else ()))
        probs_state = (p(table), p(row_max), p(new_max), p(alpha_args))
        merge_kernel = kernels.fa2_merge if fa2 else kernels.fa1_merge
        merge_formats = (codes["stats"], codes["accum"], codes["rescale"], int(causal), rows.start, tiles.block_r)
        merge_state = (p(new_max), p(alphas), p(block_sum), p(raw_pv), p(row_max), p(row_sum), p(out))
        last_needed_key = _last_needed_key(rows, tiles, n_q)
        scale_value = float(scale)
        for start in range(0, k.shape[2], tiles.block_c):
            stop = min(start + tiles.block_c, k.shape[2])
            if causal and start > last_needed_key:
                break  # every remaining tile lies above the diagonal
            block = full if stop - start == tiles.block_c else _NativeBlock(q, stop - start, full.separate)
            torch.matmul(q, k[:, :, start:stop].transpose(-1, -2), out=block.raw_scores)
            probs_kernel(block.raw_address, *heads_rows, block.cols, block.cols, scale_value, *probs_formats,
                         int(causal), rows.start, start, *probs_state, block.probs_address,
                         *((block.matmul_probs_address,) if fa2 else ()))
            torch.exp(alpha_args, out=alphas)  # ATen's exp of float32 arguments; the merge rounds them
            torch.sum(block.probs, dim=-1, keepdim=True, out=block_sum)
            torch.matmul(block.matmul_probs, v[:, :, start:stop], out=raw_pv)
            merge_kernel(*heads_rows, v.shape[-1], *merge_formats, start, *merge_state)
        return self._finish(out, row_sum)

    def _finish(self, out: torch.Tensor, row_sum: torch.Tensor) -> torch.Tensor:
        """The output in its format: FA2 divides by the row sum once, here; FA1's O is already normalised."""
        f = self.formats
        if self.variant == "fa2":
            row_sum = row_sum.masked_fill(row_sum == 0, 1.0)  # rows that saw no key
            inverse_sum = round_to(_Reciprocal.apply(row_sum) if row_sum.requires_grad else 1.0 / row_sum, f.stats)
            return round_to(out * inverse_sum, f.output)
        return round_to(out, f.output)

    def describe(self):
        tiles = self.last_tiles.describe() if self.last_tiles is not None else {}
        return {
            "backend": self.name,
            "variant": self.variant,
            **{f"formats.{k}": v for k, v in self.formats.describe().items()},
            **{f"tiles.{k}": v for k, v in tiles.items()},
            "tiles.sram": self.sram,
            "tiles.kv_blocks_pinned": self.kv_blocks,
            "tie_fix": self.tie_fix,
            "kv_splits": self.kv_splits,
            **({"matmul.entry": self.last_gemm} if self.formats.matmul == "blas" else {}),
        }


class _NativeBlock:
    """The score and probability buffers of one key/value block width, and their addresses."""

    def __init__(self, q: torch.Tensor, cols: int, separate: bool):
        self.cols, self.separate = cols, separate
        self.raw_scores = torch.empty(*q.shape[:3], cols, dtype=q.dtype)
        self.probs = torch.empty_like(self.raw_scores)
        # P as the P.V matmul takes it: its own buffer when the prob format differs from stats.
        self.matmul_probs = torch.empty_like(self.probs) if separate else self.probs
        self.raw_address, self.probs_address = native.pointer(self.raw_scores), native.pointer(self.probs)
        self.matmul_probs_address = native.pointer(self.matmul_probs) if separate else None


def _initial_state(q: torch.Tensor, v: torch.Tensor):
    """Running max (-inf), row sum (0) and output (0) for the rows of q."""
    batch, heads, n_rows, _ = q.shape
    row_max = torch.full((batch, heads, n_rows, 1), _NEG_INF, dtype=q.dtype, device=q.device)
    out = torch.zeros(batch, heads, n_rows, v.shape[-1], dtype=q.dtype, device=q.device)
    return row_max, torch.zeros_like(row_max), out


def _last_needed_key(rows: slice, tiles, n_q: int) -> int:
    """With causal masking, the last key any tile of these rows sees: later key tiles are skipped."""
    last_tile_row = ((rows.stop - 1) // tiles.block_r + 1) * tiles.block_r - 1
    return min(n_q - 1, last_tile_row)


def _kernel_model_fits(f: StageFormats, variant: str, entry: str | None) -> bool:
    """Whether the fused C model of PyTorch's CPU flash kernel (cpu_flash_forward) computes these
    numerics with this GEMM entry (cpu_kernel.GEMM_ENTRIES)."""
    half = f.input.name
    return (
        f.nearest_only and variant == "fa2" and f.exp == "fexp_u20" and f.row_sum == "lanes" and f.matmul == "blas"
        and half in ("bf16", "fp16") and f.prob.name == f.output.name == half and f.input_scaling == "none" and not f.incoherent
        and all(getattr(f, s).name == "fp32" for s in ("score", "stats", "rescale", "accum"))
        and cpu_kernel.lanes() is not None and cpu_kernel.blas_address(f.input.torch_dtype) != 0
        and (entry != "brgemm" or cpu_kernel.brgemm_address(f.input.torch_dtype) != 0)
        and native.library() is not None and _kernel_model_checked(f, entry or "cblas")
    )


@functools.cache
def _kernel_model_checked(f: StageFormats, entry: str = "cblas") -> bool:
    """The fused C model against the ATen path on small ragged cases (odd head size and block
    lengths for brgemm's padding), once per format set and GEMM entry: a compiler or CPU that
    changes a bit disables it (with a warning)."""
    emulator = FlashEmulated(f, block_r=16, block_c=40, native=False)
    emulator._gemm_override = entry
    g = torch.Generator().manual_seed(0)
    cases = [(37, 37, 16)] + ([(37, 93, 15)] if entry == "brgemm" else [])  # (n_q, n_k, d): blocks 40, 40, 13
    with torch.no_grad():
        for n_q, n_k, dim in cases:
            q = torch.randn(1, 2, n_q, dim, generator=g).to(f.input.torch_dtype)
            k, v = (torch.randn(1, 2, n_k, dim, generator=g).to(f.input.torch_dtype) for _ in range(2))
            tiles = emulator.tiles(n_q, n_k, dim)
            for causal in (False, True):
                expected = emulator(q, k, v, scale=0.3, causal=causal)
                got = _cpu_flash_native(q, k, v, float(torch.tensor(0.3, dtype=torch.float32)), causal, tiles, f,
                                        entry).to(q.dtype)
                if not same_bits(got, expected):
                    warnings.warn(f"numdev's fused model of PyTorch's CPU flash kernel differs from its ATen path for "
                                  f"{f.describe()} ({entry}); not using it", stacklevel=3)
                    return False
    return True


def _cpu_flash_native(q, k, v, scale: float, causal: bool, tiles, f: StageFormats, entry: str | None = "cblas"
                      ) -> torch.Tensor:
    """The whole forward in kernels/flash_emulator.c (cpu_flash_forward): query tiles split over
    torch's thread count in an OpenMP region, as the kernel splits them; entry: the GEMM (brgemm:
    K and V packed first, as the kernel packs them)."""
    half = f.input.torch_dtype
    q16, k16, v16 = (t.to(half).contiguous() for t in (q, k, v))
    batch, heads, n_q, dim = q16.shape
    n_k = k16.shape[2]
    out = torch.empty_like(q16)
    tile_count = batch * heads * -(-n_q // tiles.block_r)
    packed = entry == "brgemm"
    done = native.library().cpu_flash_forward(
        q16.data_ptr(), k16.data_ptr(), v16.data_ptr(), out.data_ptr(), tile_count, n_q, n_k, dim, scale, int(causal),
        tiles.block_r, tiles.block_c, cpu_kernel.lanes(), native.CODES[f.input.name], cpu_kernel.blas_address(half),
        cpu_kernel.brgemm_address(half) if packed else 0, cpu_kernel.brgemm_release_address() if packed else 0,
        batch * heads, torch.get_num_threads())
    if not done:
        raise MemoryError(f"cpu_flash_forward could not allocate the packed K and V of {batch * heads} heads x {n_k} keys")
    return out


def _native_fits(formats: StageFormats, variant: str) -> bool:
    """Whether the C kernels take these formats, and have been checked to give the ATen path's bits."""
    return (
        native.supports(formats)
        and native.library() is not None
        and _native_checked(formats, variant)
    )


@functools.cache
def _native_checked(formats: StageFormats, variant: str) -> bool:
    """The C kernels against the ATen path on a small causal case with ragged tiles, once per
    format set and variant: a compiler or CPU that changes a bit disables them (with a warning)."""
    emulator = FlashEmulated(formats, block_r=8, block_c=12, variant=variant, native=False)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 1, 37, 16, generator=g) * 4 for _ in range(3))
    q, k, v = (working_input(t, formats) for t in (q, k, v))
    scale = torch.tensor(0.3, dtype=torch.float32)
    rows, tiles = slice(0, 37), emulator.tiles(37, 37, 16)
    with torch.no_grad():
        for causal in (False, True):
            expected = emulator._attend(q, k, v, scale, causal, rows, tiles, 37, _STEPS[variant])
            got = emulator._attend_native(q, k, v, scale, causal, rows, tiles, 37)
            if not same_bits(got, expected):
                warnings.warn(f"numdev's C kernels differ from the ATen path for {formats.describe()} ({variant}); "
                              "not using them", stacklevel=3)
                return False
    return True


class _Reciprocal(torch.autograd.Function):
    """1 / l, whose gradient is autograd's -g (r r) except where r r overflows float32 (l < 2^-64):
    there -(g r) r, the same derivative in an order that stays finite. A row sum that small is what
    Qiu & Yao's tie fix makes when a tied maximum m > ~44 is shifted to 2m (P = exp(S - 2m) ~ e^-m);
    autograd's order turned such a row into an infinite gradient and NaN in the amax's backward.
    Everywhere else (every row without the fix: its l >= 1) the bits are autograd's, forward and back."""

    @staticmethod
    def forward(ctx, row_sum):
        result = 1.0 / row_sum
        ctx.save_for_backward(result)
        return result

    @staticmethod
    def backward(ctx, grad):
        (result,) = ctx.saved_tensors
        square = result * result
        return torch.where(torch.isfinite(square), -grad * square, -(grad * result) * result)


def _row_chunks(n_q: int, chunk_rows: int) -> list[slice]:
    """Query rows split into near-equal chunks of at most chunk_rows (rows are independent).

    Near-equal, so no chunk is a sliver: BLAS may take another path for a matrix of one row, and
    the matmul's bits must not depend on where a row falls.
    """
    count = -(-n_q // chunk_rows)
    size, longer = divmod(n_q, count)  # the first `longer` chunks hold one row more
    bounds = [i * size + min(i, longer) for i in range(count + 1)]
    return [slice(a, b) for a, b in zip(bounds, bounds[1:])]


def _finite_or_zero(row_max: torch.Tensor) -> torch.Tensor:
    """-inf (a row with no visible key yet) -> 0, so exp(S - m) gives 0 instead of NaN."""
    return row_max.masked_fill(row_max == _NEG_INF, 0.0)


def _round_again(x: torch.Tensor, fmt: FloatFormat, held: FloatFormat) -> torch.Tensor:
    """x (already rounded to `held`) rounded to fmt; rounding is idempotent, so a repeat is skipped."""
    return x if fmt == held else round_to(x, fmt)


def block_scores(raw_scores, scale, masked, f: StageFormats):
    """S = q k^T * scale of one key block in the score format, masked keys -inf (numdev.analysis.ties reads them too)."""
    scores = round_to(raw_scores * scale, f.score)
    return scores if masked is None else scores.masked_fill(masked, _NEG_INF)


def _keep_active(active, new, old):
    """Rows of a tile that lies wholly above the diagonal keep their old state (the tile is skipped)."""
    return new if active is None else torch.where(active, new, old)


# Qiu & Yao (arXiv:2510.04212, their code's "STABLE" switch): when more than one score of a block lies
# within TIE_TOLERANCE of the block's maximum m, exponentiate against TIE_BETA * m (m > 0) or 0 (m < 0)
# instead of m, so that no P is exactly 1: P = exp(S - m) then lies below 1 and its bf16 rounding is
# no longer biased by the ties. The shift cancels in O / l (it only rescales P and l alike).
TIE_BETA, TIE_TOLERANCE = 2.0, 1e-3


def tie_shifted_max(scores: torch.Tensor, block_max: torch.Tensor) -> torch.Tensor:
    """The block maximum, shifted where several scores tie it (finite maxima only)."""
    ties = (scores >= block_max - TIE_TOLERANCE).sum(dim=-1, keepdim=True) > 1
    shifted = torch.where(block_max > 0, TIE_BETA * block_max, torch.zeros_like(block_max))
    return torch.where(ties & torch.isfinite(block_max) & (block_max != 0), shifted, block_max)


def _fa2_probs(raw_scores, scale, row_max, masked, *, f: StageFormats, tie_fix: bool = False) -> dict:
    scores = block_scores(raw_scores, scale, masked, f)
    block_max = scores.amax(dim=-1, keepdim=True)
    if tie_fix:
        block_max = tie_shifted_max(scores, block_max)
    new_max = round_masked(torch.maximum(row_max, block_max), f.stats)
    shift = _finite_or_zero(new_max)
    if f.exp == "fexp_u20":  # PyTorch's CPU flash kernel: libm's expf for alpha, fexp_u20 on the vector lanes
        alpha = round_to(cpu_kernel.libm_exp(row_max - shift), f.rescale)
        exp_of = functools.partial(cpu_kernel.probs, width=cpu_kernel.model_lanes())
    else:
        alpha = round_to(compiled.exp(row_max - shift), f.rescale)
        exp_of = compiled.exp
    # S - m is held in the score format before exp, as any kernel storing S in that format would.
    probs = round_to(exp_of(round_masked(scores - shift, f.score)), f.stats)  # P, as computed
    matmul_probs = _round_again(probs, f.prob, f.stats)  # P is converted for the P.V matmul
    return {"new_max": new_max, "alpha": alpha, "probs": probs, "matmul_probs": matmul_probs}


def _fa2_merge(row_max, row_sum, out, block, block_sum, raw_pv, active, *, f: StageFormats):
    alpha = block["alpha"]
    new_sum = round_to(round_to(alpha * row_sum, f.stats) + block_sum, f.stats)
    pv = round_to(raw_pv, f.accum)
    new_out = round_to(round_to(alpha * out, f.accum) + pv, f.accum)
    return (
        _keep_active(active, block["new_max"], row_max),
        _keep_active(active, new_sum, row_sum),
        _keep_active(active, new_out, out),
    )


def _fa2_merge_blas(row_max, row_sum, out, block, block_sum, v16, active, start, tile_rows, parallel, entry, *,
                    f: StageFormats):
    """The FA2 merge as PyTorch's CPU flash kernel does it: O = alpha O after the first block, then
    the kernel's GEMM adds P.V into O (beta = 1; beta = 0 for the first block), one call per tile."""
    alpha = block["alpha"]
    new_sum = round_to(round_to(alpha * row_sum, f.stats) + block_sum, f.stats)
    if start > 0:
        out = _keep_active(active, round_to(alpha * out, f.accum), out)
    out = out.contiguous()
    cpu_kernel.accumulate(block["matmul_probs"].to(f.prob.torch_dtype), v16, out, tile_rows,
                          0.0 if start == 0 else 1.0, active, parallel, entry)
    return (
        _keep_active(active, block["new_max"], row_max),
        _keep_active(active, new_sum, row_sum),
        out,
    )


def _fa1_probs(raw_scores, scale, row_max, masked, *, f: StageFormats) -> dict:
    scores = block_scores(raw_scores, scale, masked, f)
    block_max = round_masked(scores.amax(dim=-1, keepdim=True), f.stats)
    probs = round_to(compiled.exp(round_masked(scores - _finite_or_zero(block_max), f.score)), f.prob)
    return {"block_max": block_max, "probs": probs, "matmul_probs": probs}


def _fa1_merge(row_max, row_sum, out, block, block_sum, raw_pv, active, *, f: StageFormats):
    block_max = block["block_max"]
    block_sum = round_to(block_sum, f.stats)
    new_max = torch.maximum(row_max, block_max)
    shift = _finite_or_zero(new_max)
    alpha_old = round_to(compiled.exp(row_max - shift), f.rescale)
    alpha_block = round_to(compiled.exp(block_max - shift), f.rescale)
    old_sum = round_to(alpha_old * row_sum, f.stats)
    new_sum = round_to(old_sum + round_to(alpha_block * block_sum, f.stats), f.stats)
    kept = round_to(old_sum * out, f.accum)
    added = round_to(alpha_block * round_to(raw_pv, f.accum), f.accum)
    # Rows with no visible key so far keep l = 0; dividing by 1 leaves their O = 0.
    divisor = new_sum.masked_fill(new_sum == 0, 1.0)
    new_out = round_to(round_to(kept + added, f.accum) / divisor, f.accum)
    return (
        _keep_active(active, new_max, row_max),
        _keep_active(active, new_sum, row_sum),
        _keep_active(active, new_out, out),
    )


_STEPS = {"fa2": (_fa2_probs, _fa2_merge), "fa1": (_fa1_probs, _fa1_merge)}
