"""Distances between the weights of two runs (this run `a`, its reference `b`), per tensor and for the model.

Per weight set (a parameter tensor's trained values, or the token-embedding rows no caption
indexes, `<name>[unindexed]`), with d = a - b elementwise and n values:

    max_abs        max |d|                                   (exact: float32 candidates, float64 check)
    mean_abs       sum |d| / n                               position-aware
    rel_frobenius  ||d||_F / ||b||_F                         position-aware
    wasserstein    W1 of a and b as 1-D empirical distributions of their values = mean |sort(a) - sort(b)|
                   (the paper's metric; equal sizes: the same as scipy.stats.wasserstein_distance)
    w1_over_std    wasserstein / std(b) (population std)

(Over a zero denominator - a zero or constant reference tensor, e.g. a bias or LayerNorm weight at
initialisation - a ratio is 0 when its numerator is 0 and inf otherwise.)
    pooled_wasserstein  equals wasserstein: the set's values pooled into one distribution

The model row (`__model__`) aggregates the trained sets only (every parameter's values except the
unindexed embedding rows):

    max_abs        max over the trained sets
    mean_abs       sum |d| / n over every trained value (= the numel-weighted mean of the sets')
    rel_frobenius  ||d||_F / ||b||_F over every trained value
    wasserstein    numel-weighted mean of the trained sets' W1
    w1_over_std    numel-weighted mean of the trained sets' W1 / std(b), over the sets whose std(b) > 0
    pooled_wasserstein  the paper's whole-model W1: every value of every parameter (unindexed rows
                   included) pooled into one 1-D distribution per run

Position-blind W1 cannot tell two independent draws of one distribution apart (two
initialisations: pooled W1 ~1e-5, mean |d| ~1e-2); mean_abs and rel_frobenius can.

Cost: `prepare` sorts each set of one run once (and the pooled values once, in `threads` value
ranges at a time), reusing the sorts of sets that did not change since the run's previous step;
`compare` then costs a few linear passes. Sorts run on NumPy's SIMD sort in `threads` threads
(NumPy releases the GIL).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from numdev.run_layout import MODEL_ROW, UNINDEXED_SUFFIX

METRICS = ("numel", "max_abs", "mean_abs", "rel_frobenius", "wasserstein", "w1_over_std", "pooled_wasserstein")


@dataclass
class Prepared:
    """One run's weights at one step, ready to compare: flat float32 values and their sorted copies per set."""

    values: dict[str, np.ndarray]
    sorted: dict[str, np.ndarray]
    trained: list[str]  # the sets that train (all but `<name>[unindexed]`), in name order
    pooled_sorted: np.ndarray  # every value of the model, sorted
    sums: dict[str, float] = field(default_factory=dict)  # per set: sum of values, float64
    sum_squares: dict[str, float] = field(default_factory=dict)  # per set: sum of values², float64
    std: dict[str, float] = field(default_factory=dict)  # per set: population std, float64


def split_sets(state: dict[str, torch.Tensor], indexed_rows: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """name -> flat float32 values; a tensor named in indexed_rows is split into its indexed rows
    (under its own name) and the others (`<name>[unindexed]`)."""
    sets = {}
    for name in sorted(state):
        values = _numpy(state[name])
        rows = (indexed_rows or {}).get(name)
        if rows is None:
            sets[name] = values.reshape(-1)
            continue
        rows = np.asarray(rows, dtype=np.int64)
        if values.ndim != 2 or (rows.size and (rows.min() < 0 or rows.max() >= values.shape[0])):
            raise ValueError(f"indexed rows of {name!r} do not fit its shape {tuple(values.shape)}")
        mask = np.zeros(values.shape[0], dtype=bool)
        mask[rows] = True
        sets[name] = values[mask].reshape(-1)
        sets[name + UNINDEXED_SUFFIX] = values[~mask].reshape(-1)
    return sets


def prepare(
    state: dict[str, torch.Tensor],
    indexed_rows: dict[str, np.ndarray] | None = None,
    threads: int | None = None,
    previous: Prepared | None = None,
) -> Prepared:
    """Sort every set of `state` once (and all its values once), and keep the reference statistics.

    With `previous` (this run's Prepared of an earlier step), a set whose values are bitwise equal
    to that step's reuses its sort: the token-embedding rows no caption indexes never change.
    The result holds views of `state`'s tensors: pass copies that nothing modifies afterwards.
    """
    values = split_sets(state, indexed_rows)
    for name, v in values.items():
        if v.size and not (np.isfinite(v.min()) and np.isfinite(v.max())):
            raise ValueError(f"tensor {name!r} holds NaN/Inf values: its distances are undefined")
    names = list(values)
    reused = {n for n in names if previous is not None and n in previous.values and np.array_equal(previous.values[n], values[n])}
    fresh = [n for n in names if n not in reused]
    with ThreadPoolExecutor(max_workers=_threads(threads)) as pool:
        sorted_values = {n: previous.sorted[n] for n in reused} | dict(zip(fresh, pool.map(np.sort, (values[n] for n in fresh))))
        stats = {n: (previous.sums[n], previous.sum_squares[n]) for n in reused}
        stats |= dict(zip(fresh, pool.map(_sum_and_squares, (values[n] for n in fresh))))
        pooled = _pooled_sort([sorted_values[n] for n in names], pool, _threads(threads))
    sums, sum_squares, std = {}, {}, {}
    for name in names:
        n = values[name].size
        sums[name], sum_squares[name] = stats[name]
        mean = sums[name] / n if n else 0.0
        std[name] = float(np.sqrt(max(sum_squares[name] / n - mean * mean, 0.0))) if n else 0.0
    trained = [n for n in names if not n.endswith(UNINDEXED_SUFFIX)]
    return Prepared(values, sorted_values, trained, pooled, sums, sum_squares, std)


def _pooled_sort(sorted_sets: list[np.ndarray], pool: ThreadPoolExecutor, buckets: int) -> np.ndarray:
    """Every value of the sorted sets, sorted: split at common pivots into value ranges that are
    sorted in parallel and laid end to end (each set is sorted, so its part of a range is a slice)."""
    total = sum(s.size for s in sorted_sets)
    if total == 0:
        return np.zeros(0, np.float32)
    if buckets <= 1 or total < 1 << 16:
        return np.sort(np.concatenate(sorted_sets))
    stride = max(1, total // (1 << 16))  # a sample of about 65536 values, every set in proportion
    sample = np.sort(np.concatenate([s[::stride] for s in sorted_sets]))
    pivots = sample[np.linspace(0, sample.size, buckets + 1)[1:-1].astype(np.int64)]
    cuts = [np.concatenate([[0], np.searchsorted(s, pivots, side="left"), [s.size]]) for s in sorted_sets]
    parts = [np.concatenate([s[c[j] : c[j + 1]] for s, c in zip(sorted_sets, cuts)]) for j in range(buckets)]
    return np.concatenate(list(pool.map(np.sort, parts)))


def compare(a: Prepared, b: Prepared, threads: int | None = None) -> dict:
    """{"model": {metric: value}, "per_tensor": {set name: {metric: value}}}; b is the reference."""
    if list(a.values) != list(b.values):
        raise ValueError(f"the runs' weight sets differ: {sorted(set(a.values) ^ set(b.values))[:3]}")
    for name in a.values:
        if a.values[name].size != b.values[name].size:
            raise ValueError(f"{name!r} has {a.values[name].size} values in one run and {b.values[name].size} in the other")
    names = list(a.values)
    with ThreadPoolExecutor(max_workers=_threads(threads)) as pool:
        parts = dict(zip(names, pool.map(lambda n: _compare_set(a, b, n), names)))
    per_tensor = {}
    for name, part in parts.items():
        n = part["numel"]
        w1 = part["w1_sum"] / n if n else 0.0
        per_tensor[name] = {
            "numel": n,
            "max_abs": part["max_abs"],
            "mean_abs": part["abs_sum"] / n if n else 0.0,
            "rel_frobenius": _ratio(np.sqrt(part["sq_sum"]), np.sqrt(b.sum_squares[name])),
            "wasserstein": w1,
            "w1_over_std": _ratio(w1, b.std[name]),
            "pooled_wasserstein": w1,
        }
    return {"model": _model_row(a, b, parts, per_tensor), "per_tensor": per_tensor}


def weight_distances(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], indexed_rows: dict[str, np.ndarray] | None = None) -> dict:
    """Every metric per set and for the model between two state dicts of one architecture."""
    check_same_architecture(a, b)
    return compare(prepare(a, indexed_rows), prepare(b, indexed_rows))


def distance_rows(step: int, distances: dict) -> list[dict]:
    """The table rows of one step: the model row first, then one per set (run_layout.DISTANCE_COLUMNS)."""
    rows = [{"step": int(step), "tensor": MODEL_ROW, **distances["model"]}]
    rows.extend({"step": int(step), "tensor": name, **m} for name, m in distances["per_tensor"].items())
    return rows


def _model_row(a: Prepared, b: Prepared, parts: dict, per_tensor: dict) -> dict:
    trained = a.trained
    numel = sum(parts[n]["numel"] for n in trained)
    scaled = [(parts[n]["numel"], per_tensor[n]["w1_over_std"]) for n in trained if b.std[n] > 0]
    scaled_numel = sum(k for k, _ in scaled)
    pooled = _sorted_gap_sum(a.pooled_sorted, b.pooled_sorted) / a.pooled_sorted.size if a.pooled_sorted.size else 0.0
    return {
        "numel": numel,
        "max_abs": max((parts[n]["max_abs"] for n in trained), default=0.0),
        "mean_abs": sum(parts[n]["abs_sum"] for n in trained) / numel if numel else 0.0,
        "rel_frobenius": _ratio(
            np.sqrt(sum(parts[n]["sq_sum"] for n in trained)), np.sqrt(sum(b.sum_squares[n] for n in trained))
        ),
        "wasserstein": sum(parts[n]["w1_sum"] for n in trained) / numel if numel else 0.0,
        "w1_over_std": sum(k * v for k, v in scaled) / scaled_numel if scaled_numel else float("nan"),
        "pooled_wasserstein": pooled,
    }


def _compare_set(a: Prepared, b: Prepared, name: str) -> dict:
    x, y = a.values[name], b.values[name]
    out = {"numel": int(x.size), "max_abs": 0.0, "abs_sum": 0.0, "sq_sum": 0.0, "w1_sum": 0.0}
    if not x.size:
        return out
    d = np.subtract(x, y)  # float32, rounded: |d| is within half an ulp of the exact difference
    np.abs(d, out=d)
    top = d.max()
    if top > 0:  # (a float32 difference is 0 exactly when the two values are equal)
        # Rounding to float32 is monotone, so the exact maximum is among the elements that round to the top.
        ties = np.flatnonzero(d == top)
        out["max_abs"] = float(np.abs(x[ties].astype(np.float64) - y[ties].astype(np.float64)).max())
    out["abs_sum"] = float(np.sum(d, dtype=np.float64))
    np.square(d, out=d)
    out["sq_sum"] = float(np.sum(d, dtype=np.float64))
    np.subtract(a.sorted[name], b.sorted[name], out=d)
    np.abs(d, out=d)
    out["w1_sum"] = float(np.sum(d, dtype=np.float64))
    return out


def _sorted_gap_sum(u: np.ndarray, v: np.ndarray) -> float:
    """sum |u_i - v_i| of two sorted arrays of one size, accumulated in float64."""
    d = np.subtract(u, v)
    np.abs(d, out=d)
    return float(np.sum(d, dtype=np.float64))


def _sum_and_squares(values: np.ndarray) -> tuple[float, float]:
    return float(np.sum(values, dtype=np.float64)), float(np.sum(np.square(values), dtype=np.float64))


def _ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator; over a zero denominator: 0 when the numerator is 0 too (no difference), else inf."""
    if denominator > 0:
        return float(numerator / denominator)
    return 0.0 if numerator == 0 else float("inf")


def _threads(threads: int | None) -> int:
    return max(1, threads if threads is not None else torch.get_num_threads())


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype != torch.float32:
        t = t.float()  # bf16/fp16 are exact in float32; fp64 weights are compared in float32, as snapshots store them
    return t.contiguous().numpy()


def max_abs_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over elements (an upper bound on every elementwise deviation)."""
    if a.shape != b.shape:
        raise ValueError(f"cannot take the elementwise difference of shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.numel() == 0:
        return 0.0
    return float((a.double() - b.double()).abs().max())


def wasserstein_1d(u: torch.Tensor, v: torch.Tensor) -> float:
    """Wasserstein-1 distance between the empirical distributions of the values of u and v (any sizes).

    Equal sizes: the mean |difference| of the sorted values. Different sizes: the integral of
    |F_u - F_v| over the merged support; a stable merge of the two sorted arrays tells, at every
    merged point, how many values of each side lie at or below it. Sums are float64.
    """
    us, vs = (np.sort(t.detach().cpu().to(torch.float64).reshape(-1).numpy()) for t in (u, v))
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
