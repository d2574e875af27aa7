"""A frozen copy of the flash emulator's forward pass as it was before the speed work (issue 11
item 8), kept as the reference that every fast path must match bit for bit.

Do not edit it to follow the emulator: it is the "today's outputs" the fast paths are held to.
Rounding comes from numdev.numerics.formats.round_to, so fixes there apply to both sides; the one semantic
fix since it was frozen (masked scores stay -inf in formats without inf: round_masked) is applied here too.

`rows` computes the same output for a slice of the query rows only, with the same masks, tiles and
skipped tiles as the whole: the emulator's query chunks. The two matmuls then get the same operands
as the emulator's, so bit identity is what the arithmetic guarantees; across chunk shapes it is not,
since a BLAS may order a dot product's sum by the matrix's shape (fp64 on an AMD EPYC does).
"""

from __future__ import annotations

import torch

from numdev.attention.checks import round_masked
from numdev.numerics.formats import round_to
from numdev.numerics.stages import StageFormats, working_input

_NEG_INF = float("-inf")


def reference_forward(emulator, q, k, v, scale, causal, rows: slice | None = None):
    """The output the emulator's forward gave before the speed work, for the same tiles and formats
    (for the query rows `rows` only, if given)."""
    self = emulator
    f = self.formats
    out_dtype = q.dtype
    q, k, v = (working_input(t, f) for t in (q, k, v))
    n_q, n_k = q.shape[2], k.shape[2]
    tiles = self.tiles(n_q, n_k, q.shape[-1])
    rows = rows if rows is not None else slice(0, n_q)
    q = q[:, :, rows]
    batch, heads, _, _ = q.shape
    state = _State.empty(batch, heads, rows.stop - rows.start, v.shape[-1], q.dtype, q.device)
    query_index = torch.arange(rows.start, rows.stop, device=q.device)[:, None]  # (rows, 1)
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
            active = (tile_last_row >= start).view(1, 1, -1, 1)
        new_state = update(state, scores, v[:, :, start:stop], f)
        state = new_state if active is None else state.where(active, new_state)
    if self.variant == "fa2":
        row_sum = state.row_sum.masked_fill(state.row_sum == 0, 1.0)  # rows that saw no key
        inverse_sum = round_to(1.0 / row_sum, f.stats)
        out = round_to(state.out * inverse_sum, f.output)
    else:
        out = round_to(state.out, f.output)
    return out.to(out_dtype)



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
