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
ranges at a time), reusing the sorts of sets that did not change since the run's previous step
(and the pooled sort when none did); `compare` then costs a few linear passes, and with a
`CompareCache` none for a set unchanged on both sides since the previous comparison. Sorts run on
NumPy's SIMD sort in `threads` threads (NumPy releases the GIL).

A reference run's sorts can come from disk instead (`prepare(..., stored=...)`, the file
numdev.weights.store writes with snapshot.sorted_values=true). Each array is used only after
checks against the values being prepared, which come from the verified snapshot: it has the
set's size, is sorted (non-decreasing, no NaN) and holds the same multiset of float32 bit
patterns (`fingerprint`: count, sum, and sum of squares mod 2^32 of the patterns, -0 as +0,
exact and independent of order). An array that passes is the set's sort (the same bits in every
distance); one that fails is sorted here. These checks catch any damage and any edit that changes
values; a forgery built to keep all three sums is not caught, as a snapshot forged together with
its index is not.
"""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from numdev.runs.layout import MODEL_ROW, POOLED, UNINDEXED_SUFFIX, rows_digest


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
    rows: dict[str, np.ndarray] | None = None  # the indexed rows the sets were split by
    # per set: a number that stays the same across prepares exactly while the set's values do (CompareCache's key)
    versions: dict[str, int] = field(default_factory=dict)
    fingerprints: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # per set, where one was taken
    stored: list[str] = field(default_factory=list)  # the sets (and POOLED) whose sorts came from `stored`
    stored_problem: str | None = None  # why `stored` was not used (then everything was sorted here)


_VERSIONS = itertools.count()


class StoredValuesMismatch(ValueError):
    """Stored sorted values that are not the sorted values of the state being prepared."""


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
    stored=None,
) -> Prepared:
    """Sort every set of `state` once (and all its values once), and keep the reference statistics.

    With `previous` (this run's Prepared of an earlier step), a set whose values are bitwise equal
    to that step's reuses its sort (the token-embedding rows no caption indexes never change), and
    when every set does, the pooled sort too.
    With `stored` (an open numdev.weights.store.SortedFile of this very snapshot), the sets it
    holds with this split, and the pooled values, are read instead of sorted, each after the checks
    in this module's docstring; one that fails is sorted here and `stored_problem` says why.
    The result holds views of `state`'s tensors: pass copies that nothing modifies afterwards.
    """
    values = split_sets(state, indexed_rows)
    names = list(values)
    reused = {n for n in names if previous is not None and n in previous.values and np.array_equal(previous.values[n], values[n])}
    fresh = [n for n in names if n not in reused]  # (a reused set is bitwise one that passed the checks below)
    keep_pooled = previous is not None and not fresh and set(previous.values) == set(names)
    check_pooled = stored is not None and not keep_pooled  # needs every set's fingerprint
    usable = set()
    if stored is not None:
        here = rows_digest(indexed_rows)
        usable = {n for n in fresh if n in stored.sets and here.get(_base(n)) == stored.rows.get(_base(n))}

    def one(name: str):
        v = values[name]
        if v.size and not (np.isfinite(v.min()) and np.isfinite(v.max())):
            raise ValueError(f"tensor {name!r} holds NaN/Inf values: its distances are undefined")
        print_ = fingerprint(v) if check_pooled or name in usable else None
        got, problem = None, None
        if name in usable:
            try:
                got = _checked_stored(stored, name, v, print_)
            except ValueError as error:  # StoredValuesMismatch, or a SortedValuesError while reading
                problem = str(error)
        return (np.sort(v) if got is None else got), _sum_and_squares(v), print_, got is not None, problem

    def pooled_from_file():
        try:
            got = stored.read(POOLED)
            total = sum(v.size for v in values.values())
            if got.size != total:
                raise StoredValuesMismatch(f"{stored.path}: the pooled values are {got.size}, the snapshot has {total}")
            if not _is_sorted(got):
                raise StoredValuesMismatch(f"{stored.path}: the pooled values are not sorted: the file is corrupt or was edited")
            return got, fingerprint(got), None
        except ValueError as error:
            return None, None, str(error)

    workers = _threads(threads)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pooled_job = pool.submit(pooled_from_file) if check_pooled else None
        done = _map_sets(pool, workers, one, fresh, {n: values[n].size for n in fresh})
        sorted_values = {n: previous.sorted[n] if n in reused else done[n][0] for n in names}
        stats = {n: (previous.sums[n], previous.sum_squares[n]) if n in reused else done[n][1] for n in names}
        fingerprints = {n: previous.fingerprints[n] for n in reused if n in previous.fingerprints}
        fingerprints |= {n: done[n][2] for n in fresh if done[n][2] is not None}
        used = [n for n in fresh if done[n][3]]
        problems = [done[n][4] for n in fresh if done[n][4]]
        pooled = previous.pooled_sorted if keep_pooled else None
        if pooled_job is not None:
            got, print_, problem = pooled_job.result()
            if got is not None:
                for n in names:  # (a reused set without a fingerprint: previous was prepared without `stored`)
                    if n not in fingerprints:
                        fingerprints[n] = fingerprint(values[n])
                if print_ == _combined(fingerprints[n] for n in names):
                    pooled = got
                    used.append(POOLED)
                else:
                    problem = f"{stored.path}: the pooled values are not the snapshot's values: the file is corrupt or was edited"
            if problem:
                problems.append(problem)
        if pooled is None:
            pooled = _pooled_sort([sorted_values[n] for n in names], pool, workers)
    sums, sum_squares, std = {}, {}, {}
    for name in names:
        n = values[name].size
        sums[name], sum_squares[name] = stats[name]
        mean = sums[name] / n if n else 0.0
        std[name] = float(np.sqrt(max(sum_squares[name] / n - mean * mean, 0.0))) if n else 0.0
    trained = [n for n in names if not n.endswith(UNINDEXED_SUFFIX)]
    versions = {n: previous.versions[n] if n in reused and n in previous.versions else next(_VERSIONS) for n in names}
    problem = problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "") if problems else None
    return Prepared(values, sorted_values, trained, pooled, sums, sum_squares, std, indexed_rows, versions, fingerprints, used, problem)


def _map_sets(pool: ThreadPoolExecutor, workers: int, fn, names: list[str], sizes: dict[str, int]) -> dict:
    """{name: fn(name)}, the names dealt into `workers` batches of about equal size (one task each:
    a task per set would cost more in thread hand-offs than most sets take)."""
    batches = [[] for _ in range(max(1, min(workers, len(names))))]
    load = [0] * len(batches)
    for name in sorted(names, key=lambda n: -sizes[n]):
        i = load.index(min(load))
        batches[i].append(name)
        load[i] += sizes[name] + 4096  # (+ a small set's fixed cost)
    results = pool.map(lambda batch: [(n, fn(n)) for n in batch], batches)
    return {n: r for batch in results for n, r in batch}


def _checked_stored(stored, name: str, values: np.ndarray, print_: tuple) -> np.ndarray:
    """Set `name` read from `stored`: the set's size, sorted, the same multiset of values."""
    got = stored.read(name)
    if got.size != values.size:
        raise StoredValuesMismatch(f"{stored.path}: {name!r} holds {got.size} values, the snapshot {values.size}")
    if not _is_sorted(got):
        raise StoredValuesMismatch(f"{stored.path}: {name!r} is not sorted: the file is corrupt or was edited")
    if fingerprint(got) != print_:
        raise StoredValuesMismatch(f"{stored.path}: {name!r} does not hold the snapshot's values: the file is corrupt or was edited")
    return got


def fingerprint(values: np.ndarray) -> tuple[int, int, int]:
    """(count, sum, sum of squares mod 2^32) of the float32 values' bit patterns, -0 counted as +0:
    exact, and the same for every order of the values, so a sort of them has it too (and any one
    value changed does not). (-0 as +0: NumPy's SIMD sort may return +0 where the input had -0; the
    two are equal values, and every distance here is the same bits with either.)"""
    bits = np.ascontiguousarray(values, dtype=np.float32).reshape(-1).view(np.int32)
    negative_zeros = np.count_nonzero(bits == np.int32(-(1 << 31)))
    total = int(np.sum(bits, dtype=np.int64)) + (negative_zeros << 31)
    return bits.size, total, int(np.dot(bits, bits)) % (1 << 32)  # the dot wraps mod 2^32 (and (-0)^2 = 2^62 is 0 there)


def _combined(prints) -> tuple[int, int, int]:
    prints = list(prints)
    return sum(p[0] for p in prints), sum(p[1] for p in prints), sum(p[2] for p in prints) % (1 << 32)


def _is_sorted(values: np.ndarray) -> bool:
    """Non-decreasing (a NaN anywhere fails: every comparison with it is false)."""
    return values.size < 2 or bool(np.greater_equal(values[1:], values[:-1]).all())


def _base(name: str) -> str:
    return name[: -len(UNINDEXED_SUFFIX)] if name.endswith(UNINDEXED_SUFFIX) else name


def _pooled_sort(sorted_sets: list[np.ndarray], pool: ThreadPoolExecutor, buckets: int) -> np.ndarray:
    """Every value of the sorted sets, sorted: split at common pivots into value ranges that are
    gathered straight into their place in the result and sorted there in parallel (each set is
    sorted, so its part of a range is a slice)."""
    total = sum(s.size for s in sorted_sets)
    out = np.empty(total, np.float32)
    if total == 0:
        return out
    if buckets <= 1 or total < 1 << 16:
        np.concatenate(sorted_sets, out=out)
        out.sort()
        return out
    stride = max(1, total // (1 << 16))  # a sample of about 65536 values, every set in proportion
    sample = np.sort(np.concatenate([s[::stride] for s in sorted_sets]))
    pivots = sample[np.linspace(0, sample.size, buckets + 1)[1:-1].astype(np.int64)]
    cuts = [np.concatenate([[0], np.searchsorted(s, pivots, side="left"), [s.size]]) for s in sorted_sets]
    ranges, start = [], 0
    for j in range(buckets):
        parts = [s[c[j] : c[j + 1]] for s, c in zip(sorted_sets, cuts)]
        end = start + sum(part.size for part in parts)
        ranges.append((start, end, parts))
        start = end

    def gather_and_sort(job):
        start, end, parts = job
        np.concatenate(parts, out=out[start:end])
        out[start:end].sort()

    list(pool.map(gather_and_sort, ranges))
    return out


class CompareCache:
    """What `compare` keeps between calls: the sums of every set whose values are unchanged on both
    sides since the previous call (Prepared.versions), and a scratch buffer for the pooled values."""

    def __init__(self):
        self.parts: dict[str, tuple[tuple[int, int], dict]] = {}
        self.scratch = np.empty(0, np.float32)


def compare(a: Prepared, b: Prepared, threads: int | None = None, cache: CompareCache | None = None) -> dict:
    """{"model": {metric: value}, "per_tensor": {set name: {metric: value}}}; b is the reference.

    With `cache` (one per pair of runs), a set unchanged on both sides since the previous call is
    not compared again: its sums are the same bits."""
    if list(a.values) != list(b.values):
        raise ValueError(f"the runs' weight sets differ: {sorted(set(a.values) ^ set(b.values))[:3]}")
    for name in a.values:
        if a.values[name].size != b.values[name].size:
            raise ValueError(f"{name!r} has {a.values[name].size} values in one run and {b.values[name].size} in the other")
    names = list(a.values)
    keys = {n: (a.versions.get(n), b.versions.get(n)) for n in names}
    known = {}
    if cache is not None:
        known = {n: cache.parts[n][1] for n in names if n in cache.parts and None not in keys[n] and cache.parts[n][0] == keys[n]}
    todo = [n for n in names if n not in known]
    workers = _threads(threads)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pooled = pool.submit(_pooled_gap, a, b, cache)  # beside the sets: its own linear passes
        parts = known | _map_sets(pool, workers, lambda n: _compare_set(a, b, n), todo, {n: a.values[n].size for n in todo})
        pooled = pooled.result()
    parts = {n: parts[n] for n in names}
    if cache is not None:
        cache.parts = {n: (keys[n], parts[n]) for n in names}
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
    return {"model": _model_row(a, b, parts, per_tensor, pooled), "per_tensor": per_tensor}


def weight_distances(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], indexed_rows: dict[str, np.ndarray] | None = None) -> dict:
    """Every metric per set and for the model between two state dicts of one architecture."""
    check_same_architecture(a, b)
    return compare(prepare(a, indexed_rows), prepare(b, indexed_rows))


def distance_rows(step: int, distances: dict) -> list[dict]:
    """The table rows of one step: the model row first, then one per set (numdev.weights.metrics.DISTANCE_COLUMNS)."""
    rows = [{"step": int(step), "tensor": MODEL_ROW, **distances["model"]}]
    rows.extend({"step": int(step), "tensor": name, **m} for name, m in distances["per_tensor"].items())
    return rows


def _pooled_gap(a: Prepared, b: Prepared, cache: CompareCache | None = None) -> float:
    """The pooled W1: mean |sorted a - sorted b| over every value of the model."""
    size = a.pooled_sorted.size
    if not size:
        return 0.0
    scratch = None
    if cache is not None:
        if cache.scratch.size < size:
            cache.scratch = np.empty(size, np.float32)
        scratch = cache.scratch[:size]
    return _sorted_gap_sum(a.pooled_sorted, b.pooled_sorted, scratch) / size


def _model_row(a: Prepared, b: Prepared, parts: dict, per_tensor: dict, pooled: float) -> dict:
    trained = a.trained
    numel = sum(parts[n]["numel"] for n in trained)
    scaled = [(parts[n]["numel"], per_tensor[n]["w1_over_std"]) for n in trained if b.std[n] > 0]
    scaled_numel = sum(k for k, _ in scaled)
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


def _sorted_gap_sum(u: np.ndarray, v: np.ndarray, out: np.ndarray | None = None) -> float:
    """sum |u_i - v_i| of two sorted arrays of one size, accumulated in float64 (`out`: where |u - v| goes)."""
    d = np.subtract(u, v, out=out)
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
        return float(np.abs(us - vs).mean())  # (both are float64 already)
    merged = np.concatenate([us, vs])
    order = np.argsort(merged, kind="stable")  # two sorted runs: a linear-time merge
    widths = np.diff(merged[order])
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
