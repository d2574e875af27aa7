"""Input checks shared by every attention backend: one-line errors that say what to change."""

from __future__ import annotations

import torch

from numdev.numerics.formats import FloatFormat, parse_format, round_to


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be shaped (batch, heads, seq, dim), got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if not (q.shape[:2] == k.shape[:2] == v.shape[:2]):
        raise ValueError(
            f"q, k, v must share batch and heads: got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have the same sequence length: got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must have the same head dim: got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype: got {q.dtype}, {k.dtype}, {v.dtype}; cast them first")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device: got {q.device}, {k.device}, {v.device}")
    if q.shape[2] == 0 or k.shape[2] == 0:
        raise ValueError(f"empty sequence: q {tuple(q.shape)}, k {tuple(k.shape)}")


def count_nonfinite(**tensors: torch.Tensor) -> dict[str, int]:
    """Number of NaN/Inf values per named tensor (only those that have any)."""
    counts = {name: int((~torch.isfinite(t)).sum()) for name, t in tensors.items()}
    return {name: n for name, n in counts.items() if n}


def causal_mask(n_q: int, key_index: torch.Tensor, device) -> torch.Tensor:
    """(n_q, len(key_index)) bool, True where the key lies after the query (top-left aligned)."""
    return key_index[None, :] > torch.arange(n_q, device=device)[:, None]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns (the sign of zero included), NaN anywhere counted equal to NaN (payloads aside)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    nan = torch.isnan(b)
    if not torch.equal(torch.isnan(a), nan):
        return False
    ints = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}[a.dtype]
    return torch.equal(a.masked_fill(nan, 0).view(ints), b.masked_fill(nan, 0).view(ints))


def round_masked(x: torch.Tensor, fmt: FloatFormat | str) -> torch.Tensor:
    """round_to for score-like tensors where -inf marks a masked score (or a row that has seen no
    key yet): -inf is a mask, not a number, so it stays -inf in every format.

    Formats without infinities (fp8_e4m3) have no -inf to round to (round_to gives NaN, as the
    format says); real FP8 kernels apply the mask in FP32 registers and never convert it.
    """
    fmt = parse_format(fmt)
    if fmt.has_inf:
        return round_to(x, fmt)  # -inf rounds to -inf already; no extra pass
    masked = x == float("-inf")
    return round_to(x.masked_fill(masked, 0.0), fmt).masked_fill(masked, float("-inf"))
