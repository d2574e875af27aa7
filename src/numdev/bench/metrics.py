"""Deviation metrics between an output and a reference, computed in float64."""

from __future__ import annotations

import torch


def deviation(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """max |d|, mean |d|, mean d (signed: a bias), std(d), RMSE, RMSE relative to RMS(ref), and
    max relative error of d = out - ref.

    Relative error is elementwise, |d| / |ref|, with |ref| floored at 1e-6 * max |ref| so exact
    zeros do not divide by zero. Non-finite outputs are counted (`nonfinite`) and left out of
    the other metrics, which are NaN when nothing finite is left.
    """
    out, ref = out.double(), ref.double()
    finite = torch.isfinite(out)
    nonfinite = int((~finite).sum())
    if nonfinite:
        out, ref = out[finite], ref[finite]
    if out.numel() == 0:
        nan = float("nan")
        return dict(max_abs=nan, mean_abs=nan, mean_signed=nan, std=nan, rmse=nan, rel_rmse=nan, max_rel=nan, nonfinite=nonfinite)
    diff = out - ref
    magnitude = diff.abs()
    floor = 1e-6 * float(ref.abs().max()) or torch.finfo(torch.float64).tiny
    rmse = float(diff.square().mean().sqrt())
    ref_rms = float(ref.square().mean().sqrt())
    return dict(
        max_abs=float(magnitude.max()),
        mean_abs=float(magnitude.mean()),
        mean_signed=float(diff.mean()),
        std=float(diff.std(correction=0)),
        rmse=rmse,
        rel_rmse=rmse / ref_rms if ref_rms > 0 else float("nan"),
        max_rel=float((magnitude / ref.abs().clamp_min(floor)).max()),
        nonfinite=nonfinite,
    )
