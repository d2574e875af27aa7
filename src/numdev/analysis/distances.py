"""Distances between the weights of two runs: max |difference| and Wasserstein-1.

Each weight tensor is also viewed as a 1-D empirical distribution of its values (the paper's
Wasserstein distance): W1(u, v) = integral over x of |F_u(x) - F_v(x)|, the same quantity as
scipy.stats.wasserstein_distance, computed with torch sorts in float64 accumulation.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch


def max_abs_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over elements (an upper bound on every elementwise deviation)."""
    if a.shape != b.shape:
        raise ValueError(f"cannot take the elementwise difference of shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.numel() == 0:
        return 0.0
    return float((a.double() - b.double()).abs().max())


def wasserstein_1d(u: torch.Tensor, v: torch.Tensor) -> float:
    """Wasserstein-1 distance between the empirical distributions of the values of u and v.

    Equal sizes: the mean |difference| of the sorted values. Different sizes: the integral of
    |F_u - F_v| over the merged support; a stable merge of the two sorted arrays tells, at every
    merged point, how many values of each side lie at or below it.
    Sorting uses NumPy's SIMD sort (about 4x faster than torch.sort on CPU); sums are float64.
    """
    # NumPy releases the GIL while sorting: the two sorts run on two cores.
    with ThreadPoolExecutor(max_workers=2) as pool:
        us, vs = pool.map(np.sort, (_values(u), _values(v)))
    if us.size == 0 or vs.size == 0:
        raise ValueError("Wasserstein distance needs two non-empty tensors")
    if not (np.isfinite(us[[0, -1]]).all() and np.isfinite(vs[[0, -1]]).all()):
        raise ValueError("Wasserstein distance of tensors with NaN/Inf values is undefined")
    if us.size == vs.size:
        return float(np.abs(us.astype(np.float64) - vs.astype(np.float64)).mean())
    merged = np.concatenate([us, vs])
    order = np.argsort(merged, kind="stable")  # two sorted runs: a linear-time merge
    widths = np.diff(merged[order].astype(np.float64))
    below_u = np.cumsum(order < us.size)[:-1]  # values of u at or below each merged point
    below_v = np.arange(1, merged.size) - below_u
    return float(np.sum(np.abs(below_u / us.size - below_v / vs.size) * widths))


def _values(t: torch.Tensor) -> np.ndarray:
    t = t.detach().flatten().cpu()
    if t.dtype not in (torch.float32, torch.float64):
        t = t.float()  # bf16/fp16 values are exact in float32
    return t.numpy()


def weight_distances(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict:
    """Both metrics per tensor and for the whole model (all tensors concatenated, in name order).

    The two state dicts must hold the same tensor names with the same shapes.
    """
    check_same_architecture(a, b)
    names = sorted(a)
    per_tensor = {
        name: {"max_abs": max_abs_difference(a[name], b[name]), "wasserstein": wasserstein_1d(a[name], b[name])}
        for name in names
    }
    whole_a = torch.cat([a[name].detach().flatten().float() for name in names])
    whole_b = torch.cat([b[name].detach().flatten().float() for name in names])
    model = {
        "max_abs": max(entry["max_abs"] for entry in per_tensor.values()),
        "wasserstein": wasserstein_1d(whole_a, whole_b),
    }
    return {"model": model, "per_tensor": per_tensor}


def check_same_architecture(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], where: str = "") -> None:
    """A one-line error naming the first tensor that is missing, extra or differently shaped."""
    prefix = f"{where}: " if where else ""
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    if only_a or only_b:
        raise ValueError(
            f"{prefix}the runs have different architectures: tensors only in the first: {only_a[:3]}, "
            f"only in the second: {only_b[:3]}"
        )
    for name in sorted(a):
        if a[name].shape != b[name].shape:
            raise ValueError(
                f"{prefix}tensor {name!r} has shape {tuple(a[name].shape)} in one run and {tuple(b[name].shape)} in the other"
            )
