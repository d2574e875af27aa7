"""A numeric re-implementation of the FlashAttention forward pass, every stage's format explicit.

One Python loop over key/value blocks; all query blocks are processed at once (rows are
independent, so this is numerically the same as looping over them too), and the n_q x n_k score
matrix never exists: the largest temporary is (batch, heads, n_q, B_c).

Variants:
  fa2  deferred normalisation (FlashAttention-2): O accumulates unnormalised, divided by l once.
  fa1  normalise at every block (FlashAttention-1, Algorithm 1): O is always a normalised average.
Every write to the running state (m, l, O) is rounded to its stage's format.

With causal masking a tile that lies wholly above the diagonal is skipped, as kernels do; B_r
therefore matters for fa1 with causal masking (partly masked tiles still rescale O), and for
nothing else.
"""

from __future__ import annotations

import torch

from numdev.attention.checks import round_masked
from numdev.attention.registry import AttentionBackend, register
from numdev.attention.tiles import resolve_tiles
from numdev.formats import round_to
from numdev.numerics import StageFormats, stage_formats, working_input

VARIANTS = ("fa2", "fa1")
_NEG_INF = float("-inf")


@register("flash_emulated")
class FlashEmulated(AttentionBackend):
    def __init__(
        self,
        formats: StageFormats | None = None,
        block_r: int | None = None,
        block_c: int | None = None,
        sram: int | None = None,
        variant: str = "fa2",
        tile_rule: str | None = None,
    ):
        if variant not in VARIANTS:
            raise ValueError(f"unknown flash variant {variant!r}: use one of {', '.join(VARIANTS)}")
        self.formats = formats if formats is not None else stage_formats("fa2", "fp32")
        self.block_r, self.block_c, self.sram = block_r, block_c, sram
        self.variant = variant
        self.tile_rule = tile_rule  # numdev.attention.tiles: explicit, sram, cpu_sdpa, default
        resolve_tiles(1, 1, 1, block_r, block_c, sram, tile_rule)  # reject bad tiles at construction
        self.last_tiles = None  # the tiles of the latest call, for result records

    def tiles(self, n_q: int, n_k: int, head_dim: int):
        return resolve_tiles(
            n_q,
            n_k,
            head_dim,
            self.block_r,
            self.block_c,
            self.sram,
            self.tile_rule,
        )

    def forward(self, q, k, v, scale, causal):
        f = self.formats
        out_dtype = q.dtype
        q, k, v = (working_input(t, f) for t in (q, k, v))
        batch, heads, n_q, _ = q.shape
        n_k = k.shape[2]
        tiles = self.last_tiles = self.tiles(n_q, n_k, q.shape[-1])
        state = _State.empty(batch, heads, n_q, v.shape[-1], q.dtype, q.device)
        query_index = torch.arange(n_q, device=q.device)[:, None]  # (Nq, 1)
        # Last query row of each row's tile: a tile is skipped when all its keys lie beyond it.
        tile_last_row = (query_index // tiles.block_r + 1) * tiles.block_r - 1
        update = _update_fa2 if self.variant == "fa2" else _update_fa1
        for start in range(0, n_k, tiles.block_c):
            stop = min(start + tiles.block_c, n_k)
            if causal and start > n_q - 1:
                break  # every remaining tile lies above the diagonal
            scores = round_to(q @ k[:, :, start:stop].transpose(-1, -2) * scale, f.score)  # (B, H, Nq, Bc)
            active = None
            if causal:
                key_index = torch.arange(start, stop, device=q.device)[None, :]
                scores = scores.masked_fill(key_index > query_index, _NEG_INF)
                active = (tile_last_row >= start).view(1, 1, n_q, 1)
            new_state = update(state, scores, v[:, :, start:stop], f)
            state = new_state if active is None else state.where(active, new_state)
        if self.variant == "fa2":
            row_sum = state.row_sum.masked_fill(state.row_sum == 0, 1.0)  # rows that saw no key
            inverse_sum = round_to(1.0 / row_sum, f.stats)
            out = round_to(state.out * inverse_sum, f.output)
        else:
            out = round_to(state.out, f.output)
        return out.to(out_dtype)

    def describe(self):
        tiles = self.last_tiles.describe() if self.last_tiles is not None else {}
        return {
            "backend": self.name,
            "variant": self.variant,
            **{f"formats.{k}": v for k, v in self.formats.describe().items()},
            **{f"tiles.{k}": v for k, v in tiles.items()},
            "tiles.sram": self.sram,
        }


class _State:
    """Running row max m, row sum l (B, H, Nq, 1) and output accumulator O (B, H, Nq, Dv)."""

    def __init__(self, row_max, row_sum, out):
        self.row_max, self.row_sum, self.out = row_max, row_sum, out

    @classmethod
    def empty(cls, batch, heads, n_q, dim_v, dtype, device):
        shape = (batch, heads, n_q, 1)
        return cls(
            torch.full(shape, _NEG_INF, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(batch, heads, n_q, dim_v, dtype=dtype, device=device),
        )

    def where(self, keep_new: torch.Tensor, new: _State) -> _State:
        return _State(
            torch.where(keep_new, new.row_max, self.row_max),
            torch.where(keep_new, new.row_sum, self.row_sum),
            torch.where(keep_new, new.out, self.out),
        )


def _finite_or_zero(row_max: torch.Tensor) -> torch.Tensor:
    """-inf (a row with no visible key yet) -> 0, so exp(S - m) gives 0 instead of NaN."""
    return row_max.masked_fill(row_max == _NEG_INF, 0.0)


def _update_fa2(state: _State, scores, values, f: StageFormats) -> _State:
    new_max = round_masked(torch.maximum(state.row_max, scores.amax(dim=-1, keepdim=True)), f.stats)
    shift = _finite_or_zero(new_max)
    alpha = round_to(torch.exp(state.row_max - shift), f.rescale)
    # S - m is held in the score format before exp, as any kernel storing S in that format would.
    probs = round_to(torch.exp(round_masked(scores - shift, f.score)), f.stats)  # P, as computed
    row_sum = round_to(round_to(alpha * state.row_sum, f.stats) + probs.sum(dim=-1, keepdim=True), f.stats)
    pv = round_to(round_to(probs, f.prob) @ values, f.accum)  # P is converted for the P.V matmul
    out = round_to(round_to(alpha * state.out, f.accum) + pv, f.accum)
    return _State(new_max, row_sum, out)


def _update_fa1(state: _State, scores, values, f: StageFormats) -> _State:
    block_max = round_masked(scores.amax(dim=-1, keepdim=True), f.stats)
    probs = round_to(torch.exp(round_masked(scores - _finite_or_zero(block_max), f.score)), f.prob)
    block_sum = round_to(probs.sum(dim=-1, keepdim=True), f.stats)
    new_max = torch.maximum(state.row_max, block_max)
    shift = _finite_or_zero(new_max)
    alpha_old = round_to(torch.exp(state.row_max - shift), f.rescale)
    alpha_block = round_to(torch.exp(block_max - shift), f.rescale)
    row_sum = round_to(
        round_to(alpha_old * state.row_sum, f.stats) + round_to(alpha_block * block_sum, f.stats), f.stats
    )
    kept = round_to(round_to(state.row_sum * alpha_old, f.stats) * state.out, f.accum)
    added = round_to(alpha_block * round_to(probs @ values, f.accum), f.accum)
    # Rows with no visible key so far keep l = 0; dividing by 1 leaves their O = 0.
    divisor = row_sum.masked_fill(row_sum == 0, 1.0)
    out = round_to(round_to(kept + added, f.accum) / divisor, f.accum)
    return _State(new_max, row_sum, out)
