"""Tile shapes (B_r x B_c) for the flash emulator.

A tile rule, named explicitly (never read off a numerics preset's label):
  explicit  the block sizes given (a missing one is 128)
  sram      an SRAM size M as in FlashAttention-1: B_c = ceil(M / 4d), B_r = min(B_c, d)
  cpu_sdpa  PyTorch's CPU flash kernel: query block 32 / 64 / 256 for query length < 192 / < 768 /
            >= 768, key/value block 512
  kv_blocks a pinned number of key/value blocks: B_c = ceil(N_k / kv_blocks) (B_r as given, else
            128), so the number of rescalings, which sets the paper-like ratio, stays the same when
            N changes (setting=paper_like pins 64: N=4096 with B_c=64, the paper-like reference)
  default   128 x 128 (FA2's forward tile for d=64)
With no rule named: explicit if a block size is given, else sram if M is given, else default.
Tiles longer than the sequence are clamped to it, as real kernels do.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

DEFAULT_BLOCK = 128
TILE_RULES = ("explicit", "sram", "cpu_sdpa", "kv_blocks", "default")


@dataclass(frozen=True)
class Tiles:
    block_r: int  # query rows per tile, after clamping
    block_c: int  # key/value rows per tile, after clamping
    requested_r: int
    requested_c: int
    source: str  # "explicit", "sram", "cpu_sdpa", "kv_blocks" or "default"

    @property
    def clamped(self) -> bool:
        return (self.block_r, self.block_c) != (self.requested_r, self.requested_c)

    def describe(self) -> dict:
        return {**asdict(self), "clamped": self.clamped}


def resolve_tiles(
    n_q: int,
    n_k: int,
    head_dim: int,
    block_r: int | None = None,
    block_c: int | None = None,
    sram: int | None = None,
    rule: str | None = None,
    kv_blocks: int | None = None,
) -> Tiles:
    for name, value in (("block_r", block_r), ("block_c", block_c), ("sram", sram), ("kv_blocks", kv_blocks)):
        if value is not None and (isinstance(value, (bool, str)) or not float(value).is_integer() or value <= 0):
            raise ValueError(f"tile size {name}={value!r} must be a positive integer")
    if rule is None:
        rule = "explicit" if block_r is not None or block_c is not None else "sram" if sram is not None else "default"
    if rule not in TILE_RULES:
        raise ValueError(f"unknown tile rule {rule!r}: use one of {', '.join(TILE_RULES)}")
    source = rule
    if rule == "explicit":
        r = block_r if block_r is not None else DEFAULT_BLOCK
        c = block_c if block_c is not None else DEFAULT_BLOCK
    elif rule == "sram":
        if sram is None:
            raise ValueError("tile rule 'sram' needs an SRAM size: set tiles.sram (elements), e.g. tiles.sram=98304")
        c = math.ceil(sram / (4 * head_dim))
        r = min(c, head_dim)
    elif rule == "kv_blocks":
        if kv_blocks is None:
            raise ValueError("tile rule 'kv_blocks' needs a block count: set tiles.kv_blocks, e.g. tiles.kv_blocks=64")
        r = block_r if block_r is not None else DEFAULT_BLOCK
        c = math.ceil(n_k / kv_blocks)
    elif rule == "cpu_sdpa":
        r = 32 if n_q < 192 else 64 if n_q < 768 else 256
        c = 512
    else:
        r = c = DEFAULT_BLOCK
    r, c = int(r), int(c)
    return Tiles(block_r=min(r, n_q), block_c=min(c, n_k), requested_r=r, requested_c=c, source=source)
